"""A task from two small trees written in the test: the base, and the base with its fix and new tests."""

from __future__ import annotations

from pathlib import Path

from support.redteam_repo import write_tree
from trialforge.envspec import EnvSpec
from trialforge.tasks.patches import diff_trees, filter_patch, is_test_path
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore


def fix_task(
    root: Path,
    snapshots: SnapshotStore,
    base: dict[str, str],
    fixed: dict[str, str],
    *,
    repo: str = "calc",
    statement: str = "double(2) returns 5",
    env: EnvSpec | None = None,
) -> Task:
    """A task whose snapshot is ``base`` and whose fix (code) and test patch (tests) lead to ``fixed``."""
    before, after = write_tree(root / "base", base), write_tree(root / "fixed", fixed)
    diff = diff_trees(before, after)
    return Task(
        task_id=f"{repo}-1",
        source=Source(kind="synthetic", ref="test"),
        repo=repo,
        snapshot=snapshots.put(before),
        problem_statement=statement,
        gold_patch=filter_patch(diff, lambda p: not is_test_path(p))[0],
        test_patch=filter_patch(diff, is_test_path)[0],
        env=env,
    )
