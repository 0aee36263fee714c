#!/usr/bin/python3
"""Check the bundled task sources: repositories, tickets and held-out records.

For every ticket with a fix, in a fresh temporary copy of its repository:

1. ``git apply -R test_patch`` then ``git apply -R fix_patch`` succeed (this is the base state);
2. the suite passes on the base state (the bug went unnoticed by the existing tests);
3. with ``test_patch`` applied, at least one newly added test fails;
4. with ``fix_patch`` applied as well, the whole suite passes.

Exactly one ticket is expected to have no fail-to-pass tests (its new tests already pass on the base
state) and exactly one issue to be closed as not planned without a fix. The repositories must pass at
their fixed state, and the held-out set must contain exactly one record copied from a ticket.

Standard library only. Run with ``/usr/bin/python3 verify_bundle.py``; exits 1 on any violation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOS = {"ledgerlite": "ledgerlite", "textkit": "textkit", "schedwise": "schedwise"}  # repo -> package
TICKETS = HERE / "tickets" / "github_issues.jsonl"
HELDOUT = HERE / "eval" / "heldout.jsonl"
ORG = "trialforge-samples"

ISSUE_FIELDS = {
    "number", "title", "body", "state", "state_reason", "created_at", "closed_at",
    "user", "labels", "html_url", "repository", "fix",
}  # fmt: skip
FIX_FIELDS = {"pull_request", "merged_at", "fix_patch", "test_patch"}
HELDOUT_FIELDS = {"instance_id", "repo", "problem_statement", "patch"}
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
HUNK_HEADER = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)
ADDED_TEST = re.compile(r"^\+(?:async )?def (test_\w+)\(", re.MULTILINE)
SUITE_SIZE = range(25, 61)
SUITE_SECONDS = 2.0
MAX_CHANGED_LINES = 10
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


# ----------------------------------------------------------------------------------------- helpers


@dataclass
class Problems:
    """Violations found so far, each prefixed with the thing it concerns."""

    items: list[str] = field(default_factory=list)

    def check(self, ok: bool, where: str, message: str) -> bool:
        if not ok:
            self.items.append(f"{where}: {message}")
        return ok


@dataclass
class SuiteRun:
    outcomes: dict[str, str]  # node id -> passed | failed | skipped
    seconds: float  # as pytest reports it: collection and tests, without interpreter start-up
    returncode: int
    output: str

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and all(outcome != "failed" for outcome in self.outcomes.values())

    @property
    def failed(self) -> list[str]:
        return sorted(node for node, outcome in self.outcomes.items() if outcome == "failed")


def clean_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    env.pop("PYTEST_ADDOPTS", None)
    return env


@contextmanager
def repo_copy(repo: str) -> Iterator[Path]:
    """A pristine copy of ``repos/<repo>`` in a temporary directory that is not inside any git repository."""
    with tempfile.TemporaryDirectory(prefix=f"verify-{repo}-") as tmp:
        tree = Path(tmp) / repo
        shutil.copytree(HERE / "repos" / repo, tree, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        yield tree


def git_apply(tree: Path, patch: str, *, reverse: bool = False) -> tuple[bool, str]:
    argv = ["git", "apply", "--whitespace=nowarn"] + (["-R"] if reverse else [])
    env = dict(clean_env(), GIT_CEILING_DIRECTORIES=str(tree.parent))
    done = subprocess.run(argv, cwd=tree, input=patch.encode(), capture_output=True, env=env, check=False)
    return done.returncode == 0, done.stderr.decode(errors="replace").strip()


def run_suite(tree: Path) -> SuiteRun:
    report = tree.parent / "junit.xml"
    report.unlink(missing_ok=True)
    done = subprocess.run(
        [*PYTEST, f"--junitxml={report}"], cwd=tree, capture_output=True, text=True, env=clean_env(), check=False
    )
    outcomes: dict[str, str] = {}
    seconds = 0.0
    if report.exists():
        root = ET.parse(report).getroot()
        seconds = sum(float(suite.get("time", 0)) for suite in root.iter("testsuite"))
        for case in root.iter("testcase"):
            classname, name = case.get("classname", ""), case.get("name", "")
            # A module that fails to import is reported with an empty classname and the module as name.
            node = f"{classname.replace('.', '/')}.py::{name}" if classname else name
            if case.find("failure") is not None or case.find("error") is not None:
                outcomes[node] = "failed"
            elif case.find("skipped") is not None:
                outcomes[node] = "skipped"
            else:
                outcomes[node] = "passed"
    return SuiteRun(outcomes, seconds, done.returncode, done.stdout + done.stderr)


def patch_files(patch: str) -> list[str]:
    return [b for _, b in DIFF_HEADER.findall(patch)]


def split_by_file(patch: str) -> dict[str, str]:
    parts = re.split(r"(?=^diff --git )", patch, flags=re.MULTILINE)
    return {DIFF_HEADER.match(part).group(2): part for part in parts if DIFF_HEADER.match(part)}  # type: ignore[union-attr]


def new_side_ranges(patch: str) -> dict[str, list[range]]:
    """Per file, the line ranges each hunk covers in the patched (fixed) file, context included."""
    ranges: dict[str, list[range]] = {}
    for path, part in split_by_file(patch).items():
        for start, length in HUNK_HEADER.findall(part):
            first = int(start)
            ranges.setdefault(path, []).append(range(first, first + int(length or 1)))
    return ranges


def changed_lines(patch: str) -> tuple[int, int]:
    lines = patch.splitlines()
    added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("---"))
    return added, removed


def added_tests(test_patch: str) -> list[str]:
    """Node ids (without parameters) of the test functions a test patch adds."""
    nodes = []
    for path, part in split_by_file(test_patch).items():
        nodes += [f"{path}::{name}" for name in ADDED_TEST.findall(part)]
    return nodes


def outcomes_of(run: SuiteRun, base_ids: list[str]) -> dict[str, str]:
    """Outcomes of the given tests, parametrized variants included."""
    return {
        node: outcome
        for node, outcome in run.outcomes.items()
        if any(node == base or node.startswith(base + "[") for base in base_ids)
    }


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not TIMESTAMP.match(value):
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")


def is_test_path(path: str) -> bool:
    return path.startswith("tests/")


# ------------------------------------------------------------------------------------------ checks


def check_bundle_hygiene(problems: Problems) -> None:
    for name in (".git", "__pycache__", ".pytest_cache"):
        found = [str(p.relative_to(HERE)) for p in HERE.rglob(name)]
        problems.check(not found, "bundle", f"must not contain {name}: {', '.join(found)}")
    for repo, package in REPOS.items():
        root = HERE / "repos" / repo
        problems.check((root / package / "__init__.py").is_file(), repo, f"missing {package}/__init__.py")
        problems.check(not (root / "tests" / "__init__.py").exists(), repo, "tests/__init__.py must not exist")
        problems.check(bool(list((root / "tests").glob("test_*.py"))), repo, "no tests/test_*.py files")
        pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
        for needle in (f'name = "{repo}"', "version = ", 'testpaths = ["tests"]', 'pythonpath = ["."]'):
            problems.check(needle in pyproject, repo, f"pyproject.toml lacks {needle!r}")


def check_fixed_suites(problems: Problems) -> list[list[str]]:
    rows = []
    for repo in REPOS:
        with repo_copy(repo) as tree:
            run = run_suite(tree)
        count = len(run.outcomes)
        ok = problems.check(run.passed, repo, f"suite fails at the fixed state: {run.failed or run.output[-500:]}")
        ok &= problems.check(count in SUITE_SIZE, repo, f"{count} tests, expected 25-60")
        ok &= problems.check(run.seconds < SUITE_SECONDS, repo, f"suite took {run.seconds:.2f}s")
        rows.append([repo, str(count), f"{run.seconds:.2f}s", "ok" if ok else "FAIL"])
    return rows


def check_issue_fields(problems: Problems, issue: dict[str, object], where: str) -> None:
    check = problems.check
    check(set(issue) == ISSUE_FIELDS, where, f"fields differ: {sorted(set(issue) ^ ISSUE_FIELDS)}")
    check(isinstance(issue.get("number"), int), where, "number is not an int")
    check(bool(issue.get("title")) and bool(issue.get("body")), where, "empty title or body")
    check(issue.get("state") == "closed", where, "state is not 'closed'")
    check(issue.get("repository") in REPOS, where, f"unknown repository {issue.get('repository')!r}")
    url = f"https://github.com/{ORG}/{issue.get('repository')}/issues/{issue.get('number')}"
    check(issue.get("html_url") == url, where, f"html_url should be {url}")
    user = issue.get("user")
    check(isinstance(user, dict) and set(user) == {"login"} and bool(user["login"]), where, "bad user")
    labels = issue.get("labels")
    check(
        isinstance(labels, list) and all(isinstance(x, dict) and set(x) == {"name"} for x in labels),
        where,
        "labels must be a list of {'name': ...}",
    )
    created, closed = parse_time(issue.get("created_at")), parse_time(issue.get("closed_at"))
    check(created is not None and closed is not None, where, "created_at/closed_at not ISO-8601 Z")
    if created and closed:
        check(created <= closed, where, "closed before it was created")
    fix = issue.get("fix")
    if isinstance(fix, dict):
        check(set(fix) == FIX_FIELDS, where, f"fix fields differ: {sorted(set(fix) ^ FIX_FIELDS)}")
        check(isinstance(fix.get("pull_request"), int), where, "pull_request is not an int")
        merged = parse_time(fix.get("merged_at"))
        check(merged is not None, where, "merged_at not ISO-8601 Z")
        if created and closed and merged:
            check(created <= merged <= closed, where, "merged_at outside created_at..closed_at")
        # The report describes the bug; it must not already contain the new code of the fix.
        patch_lines = str(fix.get("fix_patch", "")).splitlines()
        added = {line[1:].strip() for line in patch_lines if line.startswith("+") and not line.startswith("+++")}
        removed = {line[1:].strip() for line in patch_lines if line.startswith("-") and not line.startswith("---")}
        quoted = sorted(line for line in added - removed if len(line) > 10 and line in str(issue.get("body")))
        check(not quoted, where, f"body quotes lines of the fix: {quoted}")


@dataclass
class TicketResult:
    issue: dict
    kind: str = "fix"  # fix | no-f2p (added tests pass on the base state) | not-planned
    applies: str = "-"
    base: str = "-"
    f2p: str = "-"
    fixed: str = "-"
    size: str = "-"
    failing: int = 0  # added tests failing on base + test_patch
    ok: bool = True


def check_ticket(problems: Problems, issue: dict) -> TicketResult:
    """Build the base state of one ticket and run its suite three times (see the module docstring)."""
    where = f"{issue['repository']}#{issue['number']}"
    result = TicketResult(issue)
    before = len(problems.items)
    fix_patch, test_patch = issue["fix"]["fix_patch"], issue["fix"]["test_patch"]

    fix_paths, test_paths = patch_files(fix_patch), patch_files(test_patch)
    problems.check(bool(fix_paths) and not any(map(is_test_path, fix_paths)), where, f"fix_patch touches {fix_paths}")
    problems.check(bool(test_paths) and all(map(is_test_path, test_paths)), where, f"test_patch touches {test_paths}")
    added, removed = changed_lines(fix_patch)
    result.size = f"+{added}/-{removed}"
    problems.check(0 < max(added, removed) <= MAX_CHANGED_LINES, where, f"fix changes {result.size} lines")
    new_tests = added_tests(test_patch)
    problems.check(bool(new_tests), where, "test_patch adds no test functions")

    with repo_copy(issue["repository"]) as tree:
        ok_tests, err_tests = git_apply(tree, test_patch, reverse=True)
        ok_fix, err_fix = git_apply(tree, fix_patch, reverse=True)
        result.applies = "ok" if ok_tests and ok_fix else "FAIL"
        problems.check(ok_tests, where, f"test_patch does not reverse-apply: {err_tests}")
        problems.check(ok_fix, where, f"fix_patch does not reverse-apply: {err_fix}")
        if ok_tests and ok_fix:
            base = run_suite(tree)
            result.base = "pass" if base.passed else "FAIL"
            problems.check(base.passed, where, f"suite fails on the base state: {base.failed}")

            ok_forward, err_forward = git_apply(tree, test_patch)
            problems.check(ok_forward, where, f"test_patch does not apply forward: {err_forward}")
            with_tests = outcomes_of(run_suite(tree), new_tests)
            result.failing = sum(outcome == "failed" for outcome in with_tests.values())
            result.f2p = f"{result.failing}/{len(with_tests)}"
            all_ran = {node.split("[")[0] for node in with_tests} == set(new_tests)
            problems.check(all_ran, where, "some added tests did not run")
            if all_ran and result.failing == 0:
                result.kind = "no-f2p"  # allowed once, checked in check_tickets

            ok_forward, err_forward = git_apply(tree, fix_patch)
            problems.check(ok_forward, where, f"fix_patch does not apply forward: {err_forward}")
            fixed = run_suite(tree)
            result.fixed = "pass" if fixed.passed else "FAIL"
            problems.check(fixed.passed, where, f"suite fails with the fix: {fixed.failed}")
    result.ok = len(problems.items) == before
    return result


def check_hunk_separation(problems: Problems, issues: list[dict]) -> None:
    """Tickets touching the same file must not touch the same lines, context included."""
    hunks: dict[tuple[str, str], list[tuple[int, range]]] = {}  # (repo, path) -> (issue, lines) per hunk
    for issue in issues:
        if isinstance(issue.get("fix"), dict):
            for patch in (issue["fix"]["fix_patch"], issue["fix"]["test_patch"]):
                for path, ranges in new_side_ranges(patch).items():
                    hunks.setdefault((issue["repository"], path), []).extend((issue["number"], r) for r in ranges)
    for (repo, path), spans in hunks.items():
        for i, (number, lines) in enumerate(spans):
            for other, other_lines in spans[i + 1 :]:
                overlap = lines.start < other_lines.stop and other_lines.start < lines.stop
                problems.check(
                    number == other or not overlap, f"{repo}/{path}", f"hunks of #{number} and #{other} overlap"
                )


def check_heldout(problems: Problems, issues: list[dict]) -> list[str]:
    records = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines() if line.strip()]
    problems.check(len(records) == 6, "heldout", f"{len(records)} records, expected 6")
    bodies = {issue["body"]: issue for issue in issues}
    leaked = []
    for record in records:
        where = f"heldout {record.get('instance_id')}"
        problems.check(set(record) == HELDOUT_FIELDS, where, f"fields differ: {sorted(set(record) ^ HELDOUT_FIELDS)}")
        problems.check(
            all(isinstance(record.get(k), str) and record.get(k) for k in HELDOUT_FIELDS), where, "empty field"
        )
        problems.check(bool(patch_files(record.get("patch", ""))), where, "patch is not a git-style diff")
        issue = bodies.get(record.get("problem_statement"))
        if issue is not None:
            leaked.append(f"{record['instance_id']} = {issue['repository']}#{issue['number']}")
            fix = issue.get("fix") or {}
            problems.check(record.get("patch") == fix.get("fix_patch"), where, "patch differs from the ticket's fix")
    ids = [record.get("instance_id") for record in records]
    problems.check(len(set(ids)) == len(ids), "heldout", "duplicate instance_id")
    problems.check(len(leaked) == 1, "heldout", f"expected exactly one record copied from a ticket, got {leaked}")
    return leaked


def check_tickets(problems: Problems, issues: list[dict]) -> list[TicketResult]:
    keys = [(issue.get("repository"), issue.get("number")) for issue in issues]
    problems.check(len(set(keys)) == len(keys), "tickets", "duplicate (repository, number)")
    results: list[TicketResult] = []
    for issue in issues:
        where = f"{issue.get('repository')}#{issue.get('number')}"
        check_issue_fields(problems, issue, where)
        if issue.get("state_reason") == "not_planned":
            problems.check(issue.get("fix") is None, where, "a not-planned issue must have fix: null")
            results.append(TicketResult(issue, "not-planned"))
            continue
        fix = issue.get("fix")
        completed = issue.get("state_reason") == "completed" and isinstance(fix, dict)
        if not problems.check(completed, where, "a completed issue needs a fix"):
            continue
        problems.check((issue["repository"], fix["pull_request"]) not in keys, where, "PR number is an issue number")
        results.append(check_ticket(problems, issue))

    # Every ticket with a fix must have fail-to-pass tests, except the one deliberately imperfect record.
    # The two imperfect records (no fail-to-pass tests, not planned) come last, one of each.
    kinds = [result.kind for result in results]
    problems.check(
        kinds.count("no-f2p") == 1, "tickets", f"{kinds.count('no-f2p')} tickets without fail-to-pass tests, expected 1"
    )
    problems.check(
        kinds.count("not-planned") == 1, "tickets", f"{kinds.count('not-planned')} not-planned issues, expected 1"
    )
    problems.check(kinds[-2:] == ["no-f2p", "not-planned"], "tickets", "the two imperfect records should come last")
    valid = {repo: sum(r.ok and r.kind == "fix" and r.issue["repository"] == repo for r in results) for repo in REPOS}
    problems.check(sum(valid.values()) >= 14, "tickets", f"only {sum(valid.values())} valid bug tickets, expected 14+")
    for repo, count in valid.items():
        problems.check(count >= 4, repo, f"only {count} valid bug tickets, expected 4+")
    check_hunk_separation(problems, issues)
    return results


# ------------------------------------------------------------------------------------------- report


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * width for width in widths)
    fmt = "  ".join(f"{{:<{width}}}" for width in widths)
    return "\n".join([fmt.format(*header), line, *(fmt.format(*row) for row in rows)])


def main() -> int:
    problems = Problems()
    check_bundle_hygiene(problems)
    issues = [json.loads(line) for line in TICKETS.read_text(encoding="utf-8").splitlines() if line.strip()]
    fixed_rows = check_fixed_suites(problems)
    results = check_tickets(problems, issues)
    leaked = check_heldout(problems, issues)

    print("Repositories at the fixed state")
    print(table(["repo", "tests", "time", "result"], fixed_rows))
    print()
    print("Tickets (base = fixed repo with test_patch and fix_patch reversed)")
    header = ["repo", "issue", "kind", "fix", "rev-apply", "base", "f2p", "fixed", "result", "title"]
    rows = [
        [r.issue["repository"], f"#{r.issue['number']}", r.kind, r.size, r.applies, r.base, r.f2p, r.fixed,
         "ok" if r.ok else "FAIL", r.issue["title"][:60]]
        for r in results
    ]  # fmt: skip
    print(table(header, rows))
    print("\nfix: lines added/removed by fix_patch; base: suite on the base state; f2p: added tests failing on")
    print("base + test_patch / added tests; fixed: suite with test_patch and fix_patch applied")
    print(f"\nHeld-out records: 6 expected; copied from a ticket: {', '.join(leaked) or 'none'}")
    if problems.items:
        print(f"\n{len(problems.items)} problem(s):")
        for item in problems.items:
            print(f"  - {item}")
        return 1
    print("\nAll checks passed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
