#!/usr/bin/python3
"""Generate tickets/github_issues.jsonl and eval/heldout.jsonl from the repositories in repos/.

The repositories are kept at their fixed state. Each ticket below records, for
every bug, the fixed text and the buggy text it replaced, plus the tests its
pull request added (a block at the end of a test file, or a whole new file).
The patches are diffs from the buggy text to the fixed text, so reversing them
on the fixed repository gives that ticket's base state.

Usage::

    /usr/bin/python3 tools/build_bundle.py              # write the two .jsonl files
    /usr/bin/python3 tools/build_bundle.py base N DEST  # copy ticket N's base state to DEST
"""

from __future__ import annotations

import difflib
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from textwrap import dedent

sys.dont_write_bytecode = True  # importing the specs must not leave a __pycache__ behind
from ticket_specs import BODIES, HELDOUT, NOT_PLANNED, TICKETS  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
REPOS = HERE / "repos"
ORG = "trialforge-samples"


@dataclass(frozen=True)
class Change:
    """One edit made by a fix: ``fixed`` (in the repo today) replaced ``buggy``."""

    path: str
    fixed: str
    buggy: str


@dataclass(frozen=True)
class AddedTests:
    """Tests a fix added at the end of ``path``, from the line ``first_line`` on (None: the file is new)."""

    path: str
    first_line: str | None = None


@dataclass
class Ticket:
    number: int
    repo: str
    title: str
    body: str
    user: str
    labels: list[str]
    created_at: str
    closed_at: str
    pull_request: int
    merged_at: str
    changes: list[Change]
    tests: list[AddedTests]
    extra: dict[str, str] = field(default_factory=dict)


def file_diff(path: str, old: str, new: str) -> str:
    """A git-style unified diff of one file; ``old == ""`` means the file is new."""
    header = f"diff --git a/{path} b/{path}\n"
    from_name = f"a/{path}"
    if not old:
        header += "new file mode 100644\n"
        from_name = "/dev/null"
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=from_name, tofile=f"b/{path}"
    )
    body = "".join(lines)
    if not body:
        raise ValueError(f"{path}: no difference")
    return header + body


def read(repo: str, path: str) -> str:
    return (REPOS / repo / path).read_text(encoding="utf-8")


def buggy_sources(ticket: Ticket) -> dict[str, str]:
    """Library files as they were before the fix."""
    sources: dict[str, str] = {}
    for change in ticket.changes:
        text = sources.get(change.path, read(ticket.repo, change.path))
        if text.count(change.fixed) != 1:
            raise ValueError(f"#{ticket.number}: fixed text not found exactly once in {change.path}")
        sources[change.path] = text.replace(change.fixed, change.buggy)
    return sources


def old_tests(ticket: Ticket) -> dict[str, str]:
    """Test files as they were before the fix ('' for files the fix added)."""
    sources: dict[str, str] = {}
    for added in ticket.tests:
        text = read(ticket.repo, added.path)
        if added.first_line is None:
            sources[added.path] = ""
            continue
        start = text.find("\n\n\n" + added.first_line + "\n")
        if start < 0 or text.count(added.first_line) != 1:
            raise ValueError(f"#{ticket.number}: {added.first_line!r} not found once in {added.path}")
        sources[added.path] = text[: start + 1]
    return sources


def patch(ticket: Ticket, old: dict[str, str]) -> str:
    return "".join(file_diff(path, old[path], read(ticket.repo, path)) for path in sorted(old))


def issue_record(ticket: Ticket) -> dict[str, object]:
    return {
        "number": ticket.number,
        "title": ticket.title,
        "body": dedent(ticket.body).strip() + "\n",
        "state": "closed",
        "state_reason": "completed",
        "created_at": ticket.created_at,
        "closed_at": ticket.closed_at,
        "user": {"login": ticket.user},
        "labels": [{"name": name} for name in ticket.labels],
        "html_url": f"https://github.com/{ORG}/{ticket.repo}/issues/{ticket.number}",
        "repository": ticket.repo,
        "fix": {
            "pull_request": ticket.pull_request,
            "merged_at": ticket.merged_at,
            "fix_patch": patch(ticket, buggy_sources(ticket)),
            "test_patch": patch(ticket, old_tests(ticket)),
        },
    }


def not_planned_record(issue: dict[str, object]) -> dict[str, object]:
    record = dict(issue)
    record["body"] = dedent(str(issue["body"])).strip() + "\n"
    record["state"] = "closed"
    record["state_reason"] = "not_planned"
    record["user"] = {"login": issue["user"]}
    record["labels"] = [{"name": name} for name in issue["labels"]]  # type: ignore[attr-defined]
    record["html_url"] = f"https://github.com/{ORG}/{issue['repository']}/issues/{issue['number']}"
    record["fix"] = None
    order = ["number", "title", "body", "state", "state_reason", "created_at", "closed_at", "user", "labels"]
    order += ["html_url", "repository", "fix"]
    return {key: record[key] for key in order}


def heldout_records(issues: list[dict[str, object]]) -> list[dict[str, str]]:
    records: list[dict[str, str]] = []
    for item in HELDOUT:
        if "copy_of" in item:  # a ticket that leaked into the evaluation set
            issue = next(issue for issue in issues if issue["number"] == item["copy_of"])
            fix = issue["fix"]
            assert isinstance(fix, dict)
            records.append(
                {
                    "instance_id": item["instance_id"],
                    "repo": item["repo"],
                    "problem_statement": str(issue["body"]),
                    "patch": fix["fix_patch"],
                }
            )
            continue
        diff = "".join(file_diff(path, dedent(before), dedent(after)) for path, before, after in item["files"])
        records.append(
            {
                "instance_id": item["instance_id"],
                "repo": item["repo"],
                "problem_statement": dedent(item["problem_statement"]).strip() + "\n",
                "patch": diff,
            }
        )
    return records


def write_jsonl(path: Path, records: list[dict[str, object]] | list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def materialize_base(number: int, dest: Path) -> None:
    """Copy ticket ``number``'s base state (bug present, its tests absent) to ``dest``."""
    ticket = next(ticket for ticket in load_tickets() if ticket.number == number)
    shutil.copytree(REPOS / ticket.repo, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    for path, text in {**buggy_sources(ticket), **old_tests(ticket)}.items():
        target = dest / path
        if text:
            target.write_text(text, encoding="utf-8")
        else:
            target.unlink()


def load_tickets() -> list[Ticket]:
    tickets = []
    for spec in TICKETS:
        spec = dict(spec)
        changes = [Change(*change) for change in spec.pop("changes")]
        tests = [AddedTests(*added) for added in spec.pop("tests")]
        tickets.append(Ticket(body=BODIES[spec["number"]], changes=changes, tests=tests, **spec))
    return tickets


def main(argv: list[str]) -> int:
    if argv[:1] == ["base"] and len(argv) == 3:
        materialize_base(int(argv[1]), Path(argv[2]))
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    issues = [issue_record(ticket) for ticket in load_tickets()]
    issues += [not_planned_record(issue) for issue in NOT_PLANNED]
    write_jsonl(HERE / "tickets" / "github_issues.jsonl", issues)
    write_jsonl(HERE / "eval" / "heldout.jsonl", heldout_records(issues))
    print(f"wrote {len(issues)} issues and {len(HELDOUT)} held-out records")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
