"""GitHub issue exports with their linked fix (JSON lines) -> tasks.

Each line is an issue as the REST API returns it, plus ``fix``: the merged pull
request's patches. The bundled repositories hold the fixed code, so a task's
base state is the repository with its fix reverse-applied.

Bad input: a line over ``caps.max_record_bytes`` is dropped before it is decoded; an issue whose
statement or patches are over ``caps`` is dropped with the cap named, never truncated.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pydantic import BaseModel, ValidationError

from trialforge.errors import PatchError, RepoError
from trialforge.funnel import Funnel
from trialforge.scratch import scratch_dir
from trialforge.tasks.ingest.caps import DEFAULT_CAPS, IngestCaps, check_caps
from trialforge.tasks.ingest.records import read_lines
from trialforge.tasks.patches import apply_patch, filter_patch, is_test_path
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore


class Fix(BaseModel):
    pull_request: int
    merged_at: str
    fix_patch: str
    test_patch: str = ""


class GithubIssue(BaseModel):
    number: int
    title: str
    body: str | None = ""
    state: str
    state_reason: str | None = None
    created_at: str
    html_url: str
    repository: str
    fix: Fix | None = None


def ingest_github_issues(
    path: Path, repos_dir: Path, snapshots: SnapshotStore, *, caps: IngestCaps = DEFAULT_CAPS
) -> tuple[list[Task], Funnel]:
    """Read ``path`` line by line; a bad line is reported with its line number and skipped."""
    funnel = Funnel("ingest")
    tasks: list[Task] = []
    for lineno, line in read_lines(path, funnel, caps.max_record_bytes):
        where = f"{path.name}:{lineno}"
        try:
            issue = GithubIssue.model_validate(json.loads(line.decode("utf-8", errors="replace")))
        except json.JSONDecodeError as exc:
            funnel.drop(where, "malformed_json", f"line {lineno}: {exc}")
            continue
        except ValidationError as exc:
            funnel.drop(where, "invalid_record", f"line {lineno}: {_first_error(exc)}")
            continue
        task = _to_task(issue, where, repos_dir, snapshots, funnel, caps)
        if task is not None:
            tasks.append(task)
            funnel.keep()
    return tasks, funnel


def _to_task(
    issue: GithubIssue, where: str, repos_dir: Path, snapshots: SnapshotStore, funnel: Funnel, caps: IngestCaps
) -> Task | None:
    ref = f"{where} ({issue.html_url})"
    if issue.fix is None or issue.state_reason == "not_planned":
        funnel.drop(ref, "no_linked_fix", f"issue #{issue.number} closed without a merged fix")
        return None
    repo = repos_dir / issue.repository
    if not repo.is_dir():
        funnel.drop(ref, "unknown_repository", f"no repository {issue.repository!r} under {repos_dir}")
        return None
    # A fix may carry its tests in one patch: split by path so the agent never sees the tests.
    combined = issue.fix.fix_patch + issue.fix.test_patch
    code_patch, _ = filter_patch(combined, lambda p: not is_test_path(p))
    test_patch, _ = filter_patch(combined, is_test_path)
    task = Task(
        task_id=f"{issue.repository}-{issue.number}",
        source=Source(kind="github", ref=issue.html_url),
        repo=issue.repository,
        problem_statement=f"{issue.title}\n\n{issue.body or ''}".strip(),
        gold_patch=code_patch,
        test_patch=test_patch,
        created_at=issue.created_at,
    )
    try:
        check_caps(task, caps)
    except RepoError as exc:
        funnel.drop(ref, exc.reason, str(exc))
        return None
    try:
        digest = _base_snapshot(repo, code_patch, test_patch, snapshots)
    except PatchError as exc:
        funnel.drop(ref, "patch_does_not_apply", str(exc))
        return None
    return task.model_copy(update={"snapshot": digest})


def _base_snapshot(repo: Path, code_patch: str, test_patch: str, snapshots: SnapshotStore) -> str:
    with scratch_dir("ingest") as tmp:
        tree = Path(tmp) / "repo"
        shutil.copytree(repo, tree, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc"))
        if test_patch:
            apply_patch(tree, test_patch, reverse=True)
        apply_patch(tree, code_patch, reverse=True)
        return snapshots.put(tree)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "record"
    return f"{field}: {err['msg']}"
