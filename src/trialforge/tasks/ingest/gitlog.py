"""Git history mining: commits that change code and tests together -> tasks a person would accept.

Selected: single-parent, all-text commits of at most ``max_changed_lines`` lines that change both code and tests.
The statement is the issue the message links when an ``issues`` export holds it (``ISSUE_CONFIDENCE``, or
``MENTION_CONFIDENCE`` for a mere mention), else the commit message (``GITLOG_CONFIDENCE``). A quality gate then
drops short or leaking statements, oversize records and commits no image's Python fits, each with its reason and
sha; the base state is the parent commit. Every rule: docs/ingest.md, "Git history".
"""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from trialforge.errors import RepoError
from trialforge.funnel import IngestFunnel
from trialforge.scratch import scratch_dir
from trialforge.tasks.envdetect.decide import OVERRIDE_FILE, EnvError
from trialforge.tasks.envdetect.resolve import resolve_env
from trialforge.tasks.ingest.caps import DEFAULT_CAPS, IngestCaps, check_caps
from trialforge.tasks.ingest.extras import with_extras
from trialforge.tasks.ingest.fixes import MAX_CHANGED_LINES, commit_fix
from trialforge.tasks.ingest.git import GIT_TIMEOUT_S, Mirrors, RepoSource, git_argv, repo_name_of, rev_list
from trialforge.tasks.ingest.github_rest import closing_refs
from trialforge.tasks.ingest.nonfix import check_code_change, check_message
from trialforge.tasks.ingest.objects import Commit, ObjectReader
from trialforge.tasks.ingest.records import read_json_records
from trialforge.tasks.ingest.trees import snapshot_at
from trialforge.tasks.patches import git_env, touched_paths
from trialforge.tasks.pytestconfig import python_files
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore

log = logging.getLogger(__name__)

GITLOG_CONFIDENCE = 0.3  # statement from the commit message, written after the fix
ISSUE_CONFIDENCE = 0.8  # statement from an issue the message closes or squash-merges
MENTION_CONFIDENCE = 0.6  # from an issue only mentioned, or from a pull request's own description
MIN_STATEMENT_WORDS = 8
ENV_FILES = ("pyproject.toml", "setup.cfg", "setup.py", OVERRIDE_FILE)  # where the Python a tree needs is declared
MIN_LEAK_CHARS = 4

_SQUASH = re.compile(r"\(#(\d+)\)\s*$")
_CLOSING_GH = re.compile(r"(?<![\w-])(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?):?\s+GH-(\d+)\b", re.IGNORECASE)
_MENTION = re.compile(r"(?<![\w/&#-])(?:#|GH-)(\d+)\b")
_URL_REF = re.compile(r"https?://[^\s/]+/(?P<repo>[\w.-]+/[\w.-]+)/(?:issues|pull)/(?P<number>\d+)\b")
_REPO_IN_URL = re.compile(r"^https?://[^/]+/(?P<repo>[\w.-]+/[\w.-]+)/(?:issues|pull)/\d+")
_TRAILER = re.compile(
    r"^(?:[A-Z][a-z]*(?:-[A-Za-z]+)+|Fixes|Closes|Resolves|Refs|Bug|Issue|See): .+$|^\(cherry picked from commit \w+\)$"
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# --- the issues file ------------------------------------------------------------------------------------


class IssueRecord(BaseModel):
    """An issue or pull request as the GitHub REST API returns it; only what a statement needs."""

    model_config = ConfigDict(extra="ignore")

    number: int
    title: str
    body: str | None = ""
    html_url: str = ""
    pull_request: dict[str, Any] | None = None  # the issues API marks a pull request with this key
    base: dict[str, Any] | None = None  # a pulls API object

    @property
    def is_pull(self) -> bool:
        return self.pull_request is not None or self.base is not None or "/pull/" in self.html_url

    @property
    def repo(self) -> str:
        match = _REPO_IN_URL.match(self.html_url)
        return match.group("repo").lower() if match else ""

    @property
    def ref(self) -> str:
        return self.html_url or f"#{self.number}"

    @property
    def text(self) -> str:
        return f"{self.title}\n\n{self.body or ''}".strip()


def read_issues(path: Path, funnel: IngestFunnel, caps: IngestCaps = DEFAULT_CAPS) -> dict[int, IssueRecord]:
    """Issues and pull requests of ``path`` by number; unreadable, invalid and repeated records go to ``funnel``."""
    issues: dict[int, IssueRecord] = {}
    where_of: dict[int, str] = {}
    for record in read_json_records(path, funnel, caps=caps):
        try:
            issue = IssueRecord.model_validate(record.data)
        except ValidationError as exc:
            err = exc.errors()[0]
            funnel.drop(record.where, "invalid_record", f"{'.'.join(map(str, err['loc']))}: {err['msg']}")
            continue
        if issue.number in issues:
            funnel.drop(record.where, "duplicate", f"#{issue.number} already read at {where_of[issue.number]}")
            continue
        issues[issue.number] = issue
        where_of[issue.number] = record.where
    return issues


# --- links from a commit message ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IssueRef:
    number: int
    repo: str  # lower-case owner/name when the reference names one (an URL), else ""
    rule: str
    confidence: float


def issue_refs(message: str) -> list[IssueRef]:
    """The issue numbers a commit message names, most confident first, each once."""
    subject = message.split("\n", 1)[0]
    refs = [IssueRef(n, repo, "closing keyword", ISSUE_CONFIDENCE) for repo, n in closing_refs(message, "")]
    refs += [IssueRef(int(m.group(1)), "", "closing keyword", ISSUE_CONFIDENCE) for m in _CLOSING_GH.finditer(message)]
    if squash := _SQUASH.search(subject):
        refs.append(IssueRef(int(squash.group(1)), "", "squash-merge suffix", ISSUE_CONFIDENCE))
    refs += [IssueRef(int(m.group(1)), "", "mention", MENTION_CONFIDENCE) for m in _MENTION.finditer(message)]
    refs += [
        IssueRef(int(m.group("number")), m.group("repo").lower(), "mention", MENTION_CONFIDENCE)
        for m in _URL_REF.finditer(message)
    ]
    seen: set[int] = set()
    unique = []
    for ref in refs:
        if ref.number not in seen:
            seen.add(ref.number)
            unique.append(ref)
    return unique


@dataclass(frozen=True)
class Statement:
    text: str
    confidence: float
    rule: str
    ticket: str = ""  # the issue's URL (or #N) when the statement came from one
    from_message: bool = True


def statement_for(commit: Commit, issues: Mapping[int, IssueRecord]) -> tuple[Statement, list[IssueRef]]:
    """The best statement for ``commit`` and the references it made that ``issues`` does not hold."""
    refs = issue_refs(commit.message)
    found = [(ref, issues[ref.number]) for ref in refs if _matches(ref, issues.get(ref.number))]
    for ref, item in found:
        issue, via = (item, "") if not item.is_pull else _closed_by(item, issues)
        if issue is not None:
            rule = f"{ref.rule} #{ref.number}" + (f" -> pull request closes #{issue.number}" if via else "")
            return Statement(issue.text, ref.confidence, rule, issue.ref, from_message=False), []
    if found:  # only pull requests that close no issue of the file: their own description
        ref, pull = found[0]
        rule = f"{ref.rule} #{ref.number}: pull request description"
        return Statement(pull.text, min(ref.confidence, MENTION_CONFIDENCE), rule, pull.ref, from_message=False), []
    body = message_body(commit)
    text = f"{commit.subject}\n\n{body}" if body else commit.subject
    missing = [ref for ref in refs if ref.number not in issues]
    return Statement(text, GITLOG_CONFIDENCE, "commit message as problem statement"), missing


def message_body(commit: Commit) -> str:
    """The message body without its trailer paragraphs (``Signed-off-by:``, ``Co-authored-by:``, cherry-pick notes)."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", commit.body) if p.strip()]
    while paragraphs and all(_TRAILER.match(line.strip()) for line in paragraphs[-1].splitlines()):
        paragraphs.pop()
    return "\n\n".join(paragraphs)


def _matches(ref: IssueRef, item: IssueRecord | None) -> bool:
    """An item of the file, and of the repository the reference names (when it names one)."""
    return item is not None and (not ref.repo or not item.repo or ref.repo == item.repo)


def _closed_by(pull: IssueRecord, issues: Mapping[int, IssueRecord]) -> tuple[IssueRecord | None, str]:
    for repo, number in closing_refs(pull.text, ""):
        item = issues.get(number)
        if item is not None and not item.is_pull and (not repo or not item.repo or repo.lower() == item.repo):
            return item, pull.ref
    return None, ""


# --- the quality gate --------------------------------------------------------------------------------------


def check_statement(
    statement: Statement, commit: Commit, missing: list[IssueRef], min_words: int, keep_subject_only: bool = False
) -> None:
    """``subject_only`` for a message statement without a body (unless ``keep_subject_only``): a subject names a
    change, not the problem, and no linked issue says more; ``statement_too_short`` under ``min_words`` words."""
    unlinked = ""
    if missing:
        named = ", ".join(f"#{ref.number}" for ref in missing)
        unlinked = f"; it names {named}, which the issues file does not hold"
    if statement.from_message and not message_body(commit) and not keep_subject_only:
        raise RepoError(
            f"commit {commit.sha}: the message has no body, only the subject {commit.subject!r}, and links no issue "
            f"the issues file holds: it names a change, not the problem{unlinked}",
            reason="subject_only",
        )
    words = len(statement.text.split())
    if words < min_words:
        raise RepoError(
            f"commit {commit.sha}: the statement ({statement.rule}) is {words} words, fewer than "
            f"{min_words}: {statement.text[:200]!r}{unlinked}",
            reason="statement_too_short",
        )


def fix_leaks(statement: str, code: str, tests: str, repo: Path, parent: str) -> list[str]:
    """Identifiers the statement names that the fix adds, that the parent's tree lacks and the tests do not use."""
    named = {n for n in _IDENTIFIER.findall(statement) if len(n) >= MIN_LEAK_CHARS and _code_shaped(n)}
    if not named:
        return []
    added, kept = set(), set()
    for line in code.splitlines():
        if line.startswith(("+++", "---", "diff ", "@@", "index ")):
            continue
        (added if line.startswith("+") else kept).update(_IDENTIFIER.findall(line[1:]))
    candidates = (named & added) - kept - set(_IDENTIFIER.findall(tests))
    if not candidates:
        return []
    return sorted(candidates - _names_in_tree(repo, parent, candidates))


def _code_shaped(name: str) -> bool:
    """``snake_case``, ``_private``, ``camelCase``, names with digits: no one writes these in prose."""
    core = name.strip("_")
    return name.startswith("_") or "_" in core or any(c.isdigit() for c in core) or any(c.isupper() for c in core[1:])


def _names_in_tree(repo: Path, commit: str, names: set[str]) -> set[str]:
    """Which of ``names`` occur as whole words in the text files of ``commit``'s tree (one ``git grep``)."""
    argv = git_argv(repo, "grep", "-I", "-h", "-o", "-w", "-F", "-f", "-", commit, "--")
    done = subprocess.run(
        argv, input="\n".join(sorted(names)).encode(), capture_output=True, check=False, env=git_env(),
        timeout=GIT_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode not in (0, 1):  # 1: nothing found
        err = done.stderr.decode(errors="replace").strip()
        raise RepoError(f"git grep in {repo} at {commit} failed: {err}", reason="git_error")
    return set(done.stdout.decode("utf-8", "replace").split()) & names


@dataclass
class EraCheck:
    """Whether a tree's declared Python is one images exist for, judged once per set of env files."""

    repo_name: str
    overrides: Mapping[str, Mapping[str, Any]] | None = None
    _done: dict[tuple[tuple[str, str], ...], RepoError | None] = field(default_factory=dict)

    def check(self, objects: ObjectReader, commit: str) -> None:
        files = {}
        for name in ENV_FILES:
            try:
                kind, data = objects.read(f"{commit}:{name}")
            except RepoError:
                continue  # the tree has no such file
            if kind == "blob":
                files[name] = data
        key = tuple(sorted((name, hashlib.sha256(data).hexdigest()) for name, data in files.items()))
        if key not in self._done:
            self._done[key] = self._judge(files)
        failure = self._done[key]
        if failure is not None:
            raise RepoError(f"base {commit[:12]}: {failure}", reason=failure.reason)

    def _judge(self, files: dict[str, bytes]) -> RepoError | None:
        with scratch_dir("gitlog-env") as tmp:
            for name, data in files.items():
                (Path(tmp) / name).write_bytes(data)
            try:
                resolve_env(Path(tmp), self.repo_name, self.overrides)
            except EnvError as exc:
                # envdetect's Python errors open with "requires-python": a range no image meets, or one
                # that is not PEP 440; anything else (an invalid override) is another environment error.
                reason = "no_python_for_era" if str(exc).startswith("requires-python") else "env_error"
                return RepoError(str(exc), reason=reason)
        return None


# --- the adapter -------------------------------------------------------------------------------------------


@dataclass
class _Run:
    repo: Path
    name: str
    snapshots: SnapshotStore
    objects: ObjectReader
    issues: Mapping[int, IssueRecord]
    era: EraCheck
    caps: IngestCaps
    max_changed_lines: int
    min_statement_words: int
    keep_subject_only: bool


def ingest_git_history(
    repo: RepoSource,
    snapshots: SnapshotStore,
    *,
    repo_name: str | None = None,
    rev: str = "HEAD",
    max_changed_lines: int = MAX_CHANGED_LINES,
    clone_dir: Path | None = None,
    issues: Path | None = None,
    caps: IngestCaps = DEFAULT_CAPS,
    min_statement_words: int = MIN_STATEMENT_WORDS,
    keep_subject_only: bool = False,
    env_overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[list[Task], IngestFunnel]:
    """One task per selected commit reachable from ``rev``, oldest first; the funnel counts every commit.

    ``issues``: the repository's issues and pull requests (GitHub REST objects) that commit messages
    may link; ``keep_subject_only``: keep commits whose message is a subject alone (``check_statement``);
    ``env_overrides``: params.yaml ``env.repos`` (a ``python`` there admits an older tree).
    """
    funnel = IngestFunnel("ingest.gitlog")
    name = repo_name or repo_name_of(repo)
    issue_funnel = IngestFunnel("issues")  # bad lines of the issues file, reported as ``issues/<reason>``
    linked = read_issues(issues, issue_funnel, caps) if issues is not None else {}
    tasks: list[Task] = []
    with Mirrors({name: repo}, clone_dir) as mirrors:
        local = mirrors.get(name)
        with ObjectReader(local) as objects:
            run = _Run(local, name, snapshots, objects, linked, EraCheck(name, env_overrides), caps,
                       max_changed_lines, min_statement_words, keep_subject_only)  # fmt: skip
            for sha, _ in rev_list(local, rev):
                ref = f"{name}@{sha}"
                try:
                    task, statement = _commit_task(run, objects.commit(sha))
                except RepoError as exc:
                    funnel.drop(ref, exc.reason, str(exc))
                    continue
                tasks.append(task)
                funnel.keep()
                funnel.link(task.task_id, statement.ticket or ref, sha, statement.confidence, statement.rule)
    funnel.absorb(issue_funnel)
    log.info("ingest.gitlog %s: kept %d of %d", name, funnel.kept, funnel.seen, extra={"funnel": funnel.as_dict()})
    return tasks, funnel


def _commit_task(run: _Run, commit: Commit) -> tuple[Task, Statement]:
    if not commit.message.strip():
        raise RepoError(f"commit {commit.sha} has an empty message", reason="no_problem_statement")
    check_message(commit)  # bots, reverts, releases, chores: before any diff is read
    collected = python_files(lambda name: run.objects.text(commit.sha, name))  # the suite's own test modules
    code, tests = commit_fix(
        run.repo, commit, max_changed_lines=run.max_changed_lines, max_patch_bytes=run.caps.max_patch_bytes,
        collected=collected,
    )  # fmt: skip
    check_code_change(commit, touched_paths(code), run.objects.text)
    statement, missing = statement_for(commit, run.issues)
    check_statement(statement, commit, missing, run.min_statement_words, run.keep_subject_only)
    parent = commit.parents[0]
    extras: dict[str, Any] = {"base_commit": parent}
    if statement.ticket:
        extras |= {"issue": statement.ticket, "link_rule": statement.rule}
    task = Task(
        task_id=f"{run.name}-{commit.sha[:12]}",
        source=Source(kind="git", ref=with_extras(commit.sha, extras), link_confidence=statement.confidence),
        repo=run.name,
        problem_statement=statement.text,
        gold_patch=code,
        test_patch=tests,
        created_at=commit.author_date.isoformat(),
    )
    check_caps(task, run.caps)
    leaked = fix_leaks(statement.text, code, tests, run.repo, parent)
    if leaked:
        raise RepoError(
            f"commit {commit.sha}: the statement ({statement.rule}) names {', '.join(map(repr, leaked))}, "
            "which the fix adds (new to the repository, not used by the tests): it describes the answer",
            reason="statement_leaks_fix",
        )
    run.era.check(run.objects, parent)
    digest = snapshot_at(run.repo, parent, [tests, code], run.snapshots)
    return task.model_copy(update={"snapshot": digest}), statement
