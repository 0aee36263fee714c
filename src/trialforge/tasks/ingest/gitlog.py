"""Git history mining: commits that change code and tests together -> tasks.

No ticket says what was wrong, so the problem statement is the commit message (subject and body).
That text was written after the fix and often describes the solution rather than the problem, so
these tasks carry a low link confidence (``GITLOG_CONFIDENCE``) for curation to weigh or filter.

Selected: single-parent commits whose diff against the parent touches at least one test path and
one code path (``is_test_path``), is all text, and changes at most ``max_changed_lines`` lines.
Merges, root commits, binary changes, huge diffs, undecodable diffs or messages and diffs that do
not re-apply are reported with the commit's sha. The base state is the parent commit.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trialforge.tasks.ingest.repos import (
    MAX_CHANGED_LINES,
    Commit,
    IngestFunnel,
    Mirrors,
    ObjectReader,
    RepoError,
    RepoSource,
    commit_fix,
    repo_name_of,
    rev_list,
    snapshot_at,
    with_extras,
)
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore

log = logging.getLogger(__name__)

GITLOG_CONFIDENCE = 0.3


def ingest_git_history(
    repo: RepoSource,
    snapshots: SnapshotStore,
    *,
    repo_name: str | None = None,
    rev: str = "HEAD",
    max_changed_lines: int = MAX_CHANGED_LINES,
    clone_dir: Path | None = None,
) -> tuple[list[Task], IngestFunnel]:
    """One task per selected commit reachable from ``rev``, oldest first; the funnel counts every commit."""
    funnel = IngestFunnel("ingest.gitlog")
    name = repo_name or repo_name_of(repo)
    tasks: list[Task] = []
    with Mirrors({name: repo}, clone_dir) as mirrors:
        local = mirrors.get(name)
        with ObjectReader(local) as objects:
            for sha, _ in rev_list(local, rev):
                ref = f"{name}@{sha}"
                try:
                    task = _commit_task(local, objects.commit(sha), name, snapshots, max_changed_lines)
                except RepoError as exc:
                    funnel.drop(ref, exc.reason, str(exc))
                    continue
                tasks.append(task)
                funnel.keep()
                funnel.link(task.task_id, ref, sha, GITLOG_CONFIDENCE, "commit message as problem statement")
    log.info("ingest.gitlog %s: kept %d of %d", name, funnel.kept, funnel.seen, extra={"funnel": funnel.as_dict()})
    return tasks, funnel


def _commit_task(repo: Path, commit: Commit, name: str, snapshots: SnapshotStore, max_changed_lines: int) -> Task:
    statement = commit.message.strip()
    if not statement:
        raise RepoError(f"commit {commit.sha} has an empty message", reason="no_problem_statement")
    code, tests = commit_fix(repo, commit, max_changed_lines=max_changed_lines)
    parent = commit.parents[0]
    digest = snapshot_at(repo, parent, [tests, code], snapshots)
    return Task(
        task_id=f"{name}-{commit.sha[:12]}",
        source=Source(
            kind="git", ref=with_extras(commit.sha, {"base_commit": parent}), link_confidence=GITLOG_CONFIDENCE
        ),
        repo=name,
        snapshot=digest,
        problem_statement=statement,
        gold_patch=code,
        test_patch=tests,
        created_at=commit.author_date.isoformat(),
    )
