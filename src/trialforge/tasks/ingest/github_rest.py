"""GitHub REST exports (issues and pull requests, as the API returns them) -> tasks, one per merged fix.

The export is one JSON array or JSON lines of issue and pull-request objects. As in SWE-bench, a task is a merged
pull request plus the issues it closes (a closing keyword and a reference in its title or body); hints are those
issues' comments from before work on the fix began; the base state is the pull request's ``base.sha``. Oversize
input is dropped with the cap named (``caps.check_caps``), never truncated. docs/ingest.md, "GitHub REST exports".
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import AwareDatetime, BaseModel, ValidationError

from trialforge.errors import PatchError, RepoError
from trialforge.funnel import IngestFunnel
from trialforge.tasks.ingest.caps import DEFAULT_CAPS, MAX_PATCH_BYTES_SETTING, IngestCaps, check_caps
from trialforge.tasks.ingest.extras import with_extras
from trialforge.tasks.ingest.fixes import require_code_and_tests, split_patch
from trialforge.tasks.ingest.git import Mirrors, RepoSource, resolve_commit
from trialforge.tasks.ingest.records import Record, read_json_records
from trialforge.tasks.ingest.trees import snapshot_at
from trialforge.tasks.patches import touched_paths, vet_patch
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore

log = logging.getLogger(__name__)

_CLOSING = re.compile(
    r"(?<![\w-])(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?):?\s+"
    r"(?:(?P<repo>[\w.-]+/[\w.-]+)#|https?://[^/\s]+/(?P<url_repo>[\w.-]+/[\w.-]+)/issues/|#)(?P<number>\d+)\b",
    re.IGNORECASE,
)
_REPO_IN_URL = re.compile(r"^https?://[^/]+/(?:repos/)?(?P<repo>[^/]+/[^/]+?)(?:/(?:issues|pull|pulls)/\d+)?/?$")


class User(BaseModel):
    login: str = ""


class Comment(BaseModel):
    created_at: AwareDatetime
    body: str | None = ""
    user: User | None = None


class Issue(BaseModel):
    number: int
    title: str
    body: str | None = ""
    state: str = ""
    created_at: str
    closed_at: str | None = None
    html_url: str
    repository_url: str = ""
    comments: list[Comment] | int = 0

    @property
    def repo(self) -> str:
        return _repo_of(self.repository_url or self.html_url)

    @property
    def comment_list(self) -> list[Comment]:
        return self.comments if isinstance(self.comments, list) else []


class RepoRef(BaseModel):
    full_name: str


class Branch(BaseModel):
    sha: str
    ref: str = ""
    repo: RepoRef | None = None


class ChangedFile(BaseModel):
    filename: str
    status: str
    patch: str | None = None
    previous_filename: str | None = None
    changes: int = 0


class CommitDate(BaseModel):
    date: AwareDatetime


class CommitMeta(BaseModel):
    author: CommitDate | None = None


class PullCommit(BaseModel):
    sha: str
    commit: CommitMeta


class Pull(BaseModel):
    number: int
    title: str
    body: str | None = ""
    state: str = ""
    created_at: AwareDatetime
    merged_at: str | None = None
    merge_commit_sha: str | None = None
    html_url: str
    base: Branch
    head: Branch
    files: list[ChangedFile] | None = None
    diff: str | None = None
    commits: list[PullCommit] | int | None = None

    @property
    def repo(self) -> str:
        return self.base.repo.full_name if self.base.repo else _repo_of(self.html_url)

    @property
    def work_started(self) -> datetime:
        """The earlier of creation and the first commit: comments after it may describe the fix."""
        dates = (
            [c.commit.author.date for c in self.commits if c.commit.author] if isinstance(self.commits, list) else []
        )
        return min([self.created_at, *dates])


IssueKey = tuple[str, int]  # (lower-case owner/repo, issue number)
USED = "used"


@dataclass
class _Export:
    issues: dict[IssueKey, tuple[str, Issue]] = field(default_factory=dict)  # (repo, number) -> (where, issue)
    pulls: dict[IssueKey, tuple[str, Pull]] = field(default_factory=dict)  # same keys: a pull request is an issue


def ingest_github_rest(
    path: Path,
    repos: Mapping[str, RepoSource],
    snapshots: SnapshotStore,
    *,
    clone_dir: Path | None = None,
    caps: IngestCaps = DEFAULT_CAPS,
) -> tuple[list[Task], IngestFunnel]:
    """One task per merged pull request that closes issues of the export and changes code and tests.

    ``repos`` maps ``owner/repo`` to a local git mirror or clone URL. The funnel counts each task and
    each record that could not become or join one (unmerged or unusable pull requests, issues no
    usable pull request closes, unreadable records), every drop with its ``file:line``; ``links``
    lists every issue -> pull request link found.
    """
    funnel = IngestFunnel("ingest.github_rest")
    export = _read_export(path, funnel, caps)
    tasks: list[Task] = []
    fate: dict[IssueKey, tuple[str, str]] = {}  # issue -> (drop reason, detail) until a task uses it
    with Mirrors(repos, clone_dir) as mirrors:
        for where, pull in export.pulls.values():
            task = _pull_task(where, pull, export, mirrors, snapshots, funnel, fate, caps)
            if task is not None:
                tasks.append(task)
                funnel.keep()
    for key, (where, issue) in export.issues.items():
        reason, detail = fate.get(key, ("no_linked_pr", "no pull request of the export closes this issue"))
        if reason != USED:
            funnel.drop(f"{where} ({issue.html_url})", reason, detail)
    log.info(
        "ingest.github_rest %s: kept %d of %d", path.name, funnel.kept, funnel.seen, extra={"funnel": funnel.as_dict()}
    )
    return tasks, funnel


def closing_refs(text: str, default_repo: str) -> list[IssueKey]:
    """(repo, issue number) for every closing-keyword reference in ``text``, in order, without repeats."""
    refs = []
    for match in _CLOSING.finditer(text):
        repo = match.group("repo") or match.group("url_repo") or default_repo
        refs.append((repo.lower(), int(match.group("number"))))
    return list(dict.fromkeys(refs))


def _read_export(path: Path, funnel: IngestFunnel, caps: IngestCaps) -> _Export:
    export = _Export()
    for record in read_json_records(path, funnel, caps=caps):
        _file_record(record, export, funnel)
    return export


def _file_record(record: Record, export: _Export, funnel: IngestFunnel) -> None:
    data = record.data
    try:
        if "base" in data and "head" in data:
            pull = Pull.model_validate(data)
            _add(export.pulls, (pull.repo.lower(), pull.number), record.where, pull, funnel)
            return
        if "pull_request" in data:
            funnel.drop(record.where, "pull_request_listed_as_issue", f"#{data.get('number')}: the pull object is used")
            return
        issue = Issue.model_validate(data)
    except ValidationError as exc:
        funnel.drop(record.where, "invalid_record", _first_error(exc))
        return
    _add(export.issues, (issue.repo.lower(), issue.number), record.where, issue, funnel)


def _add(index: dict[IssueKey, tuple[str, Any]], key: IssueKey, where: str, item: Any, funnel: IngestFunnel) -> None:
    if key in index:
        funnel.drop(where, "duplicate", f"{key[0]}#{key[1]} already read at {index[key][0]}")
    else:
        index[key] = (where, item)


def _pull_task(
    where: str,
    pull: Pull,
    export: _Export,
    mirrors: Mirrors,
    snapshots: SnapshotStore,
    funnel: IngestFunnel,
    fate: dict[IssueKey, tuple[str, str]],
    caps: IngestCaps,
) -> Task | None:
    ref = f"{where} ({pull.html_url})"
    refs = closing_refs(f"{pull.title}\n{pull.body or ''}", pull.repo)
    linked = [key for key in refs if key in export.issues]
    if not pull.merged_at:
        _mark(fate, linked, "fix_not_merged", f"only closed by unmerged {pull.html_url}")
        funnel.drop(ref, "unmerged_pr", f"pull request #{pull.number} was not merged")
        return None
    if not linked:
        named = ", ".join(f"{repo}#{number}" for repo, number in refs) or "nothing"
        funnel.drop(ref, "no_linked_issue", f"#{pull.number} closes {named}; the export holds none of them")
        return None
    try:
        task = _build_task(pull, [export.issues[key][1] for key in linked], mirrors, snapshots, caps)
    except (RepoError, PatchError) as exc:
        _mark(fate, linked, "fix_pr_dropped", f"its fix {pull.html_url} was dropped: {exc.reason}")
        funnel.drop(ref, exc.reason, str(exc))
        return None
    for key in linked:
        fate[key] = (USED, pull.html_url)
        funnel.link(task.task_id, export.issues[key][1].html_url, pull.html_url, 1.0, "closing keyword")
    return task


def _build_task(pull: Pull, issues: list[Issue], mirrors: Mirrors, snapshots: SnapshotStore, caps: IngestCaps) -> Task:
    what = f"pull request {pull.repo}#{pull.number}"
    patch = _pull_patch(pull, what)
    vet_patch(patch, what, max_bytes=caps.max_patch_bytes, setting=MAX_PATCH_BYTES_SETTING)
    require_code_and_tests(touched_paths(patch), what)
    code, tests = split_patch(patch)
    repo = mirrors.get(pull.repo)
    base = resolve_commit(repo, pull.base.sha)
    extras = {"base_commit": base, "merge_commit": pull.merge_commit_sha, "issues": [i.html_url for i in issues]}
    task = Task(
        task_id=f"{pull.repo.replace('/', '__')}-{pull.number}",
        source=Source(kind="github", ref=with_extras(pull.html_url, extras), link_confidence=1.0),
        repo=pull.repo,
        problem_statement="\n\n".join(f"{i.title}\n{i.body or ''}".strip() for i in issues),
        hints=_hints(issues, pull.work_started),
        gold_patch=code,
        test_patch=tests,
        created_at=pull.created_at.isoformat().replace("+00:00", "Z"),
    )
    check_caps(task, caps)
    return task.model_copy(update={"snapshot": snapshot_at(repo, base, [tests, code], snapshots)})


def _hints(issues: list[Issue], cutoff: datetime) -> str:
    """Issue comments written before ``cutoff``, oldest first."""
    comments = sorted((c for i in issues for c in i.comment_list if c.created_at < cutoff), key=lambda c: c.created_at)
    return "\n".join((c.body or "").strip() for c in comments).strip()


def _pull_patch(pull: Pull, what: str) -> str:
    """The pull request's change as one git diff: its ``diff`` or a diff rebuilt from ``files``."""
    if pull.diff:
        return pull.diff
    if not pull.files:
        raise RepoError(f"{what} has neither files nor diff in the export", reason="no_diff")
    return "".join(_file_diff(f, what) for f in pull.files)


def _file_diff(changed: ChangedFile, what: str) -> str:
    """One ``/pulls/{n}/files`` entry as a git diff block (the API gives only the hunks).

    GitHub leaves out ``patch`` for binary files and for diffs too large to show: both are refused.
    The API does not report file modes, so new files get 100644.
    """
    old = changed.previous_filename or changed.filename
    new = changed.filename
    if changed.patch is None and changed.changes > 0:
        raise RepoError(f"{what}: {new} has no text patch (binary or too large)", reason="binary_change")
    lines = [f"diff --git a/{old} b/{new}\n"]
    if changed.status == "added":
        lines += ["new file mode 100644\n"]
    elif changed.status == "removed":
        lines += ["deleted file mode 100644\n"]
    elif old != new:
        lines += [f"rename from {old}\n", f"rename to {new}\n"]
    if changed.patch:  # an empty file added or removed, or a pure rename, has no hunks and no ---/+++ lines
        src = "/dev/null" if changed.status == "added" else f"a/{old}"
        dst = "/dev/null" if changed.status == "removed" else f"b/{new}"
        lines += [
            f"--- {src}\n",
            f"+++ {dst}\n",
            changed.patch if changed.patch.endswith("\n") else changed.patch + "\n",
        ]
    return "".join(lines)


def _mark(fate: dict[IssueKey, tuple[str, str]], keys: list[IssueKey], reason: str, detail: str) -> None:
    """Remember why these issues have no task yet, unless another pull request already made one."""
    for key in keys:
        if fate.get(key, ("", ""))[0] != USED:
            fate[key] = (reason, detail)


def _repo_of(url: str) -> str:
    match = _REPO_IN_URL.match(url)
    return match.group("repo") if match else ""


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc']) or 'record'}: {err['msg']}"
