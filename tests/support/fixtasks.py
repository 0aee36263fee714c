"""A task from two small trees written in the test: the base, and the base with its fix and new tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from support.redteam_repo import write_tree
from trialforge.envspec import EnvSpec
from trialforge.rollout.env import Action, CodingEnv, EnvLimits
from trialforge.sandbox.base import Backend, Limits, SandboxSpec
from trialforge.sandbox.images import BASE_NAME
from trialforge.tasks.envimages import task_image
from trialforge.tasks.patches import diff_trees, filter_patch, is_test_path
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader, Verdict


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


def rollout_outputs(
    backend: Backend, image: str, task: Task, snapshots: SnapshotStore, command: str, edits: list[tuple[str, str, str]]
) -> list[str]:
    """What ``command`` prints in a rollout's workspace of ``task`` (its extensions rebuilt as a policy's commands
    see them) before the first edit and after each ``(path, old, new)`` replacement."""
    assert task.env is not None
    spec = SandboxSpec(image=image, workspace=snapshots.materialize(task.snapshot), limits=Limits())
    with backend.create(spec) as sandbox:
        env = CodingEnv(sandbox, task.problem_statement, EnvLimits(), Limits(), task.env.build)
        probe = Action(tool="run", args={"command": command})
        seen = [env.step(probe).observation]
        for path, old, new in edits:
            env.step(Action(tool="replace", args={"path": path, "old": old, "new": new}))
            seen.append(env.step(probe).observation)
    return seen


def edited_diff(task: Task, snapshots: SnapshotStore, dest: Path, files: dict[str, str]) -> str:
    """A policy's diff: ``files`` written over a copy of ``task``'s base tree at ``dest``."""
    src = snapshots.materialize(task.snapshot)
    shutil.copytree(src, dest, symlinks=True)
    write_tree(dest, files)
    return diff_trees(src, dest)


def validated_and_graded(
    task: Task, backend: Backend, snapshots: SnapshotStore, *diffs: str
) -> tuple[Task, list[Verdict]]:
    """``task`` validated in its image (one run; it must come out valid), then its gold patch, the empty diff and
    each of ``diffs`` graded: the validated task and the verdicts, in that order."""
    image = task_image(task, backend, BASE_NAME).name
    checked = validate_task(task, backend, image, snapshots, Limits(), ValidateConfig(runs=1))
    assert checked.validation.valid, checked.validation.reason
    grader = Grader(backend, BASE_NAME, "", snapshots, Limits(), test_timeout_s=60)
    return checked, [grader.grade(checked, diff) for diff in (checked.gold_patch, "", *diffs)]
