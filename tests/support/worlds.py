"""A world to roll out in: bundled tickets ingested and validated, with their store, snapshots and grader;
the scripted policies and the sandbox fault the rollout and recovery tests share."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trialforge.rollout.env import Action, EnvLimits
from trialforge.rollout.loop import Lineage, Rollout
from trialforge.rollout.policies import Decision, EpisodePolicy, TaskView, patch_to_actions
from trialforge.rollout.settings import RecoveryConfig
from trialforge.sandbox.base import Limits
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.store.objstore import open_store
from trialforge.tasks.ingest.github import ingest_github_issues
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader

REPO_ROOT = Path(__file__).resolve().parents[2]


class Script:
    """Plays a fixed list of actions, then submits."""

    def __init__(self, actions: list[Action]) -> None:
        self.actions = list(actions)

    def act(self, observation: str) -> Decision:
        return Decision(self.actions.pop(0) if self.actions else Action(tool="submit"))


class Wander:
    """A deterministic multi-step policy: looks around, keeps notes, applies the fix in two edits, cleans up."""

    name = "wander"
    version = "scripted"

    def __init__(self, tasks: list[Task]) -> None:
        self.fixes = {t.task_id: patch_to_actions(t.gold_patch) for t in tasks}

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        first, *rest = self.fixes[view.task_id]
        path = first.args["path"]
        return Script(
            [
                Action(tool="run", args={"command": "ls"}),
                Action(tool="view", args={"path": path, "start": 1, "end": 12}),
                Action(tool="create", args={"path": "notes/plan.txt", "content": f"seed {seed}\n"}),
                Action(tool="run", args={"command": f"cat notes/plan.txt && wc -l {path}"}),
                first,
                Action(tool="run", args={"command": "python3 -c 'print(6 * 7)' > notes/answer.txt"}),
                Action(tool="view", args={"path": "notes/answer.txt"}),
                *rest,
                Action(tool="run", args={"command": "rm -r notes"}),  # risky: a checkpoint comes first
                Action(tool="run", args={"command": "ls; cat notes/plan.txt"}),
            ]
        )


def kill_bwrap(backend: BwrapBackend, episode: str) -> None:
    """Take the episode's sandbox away as a reaper (or a lost disk) would: its tmpfs unmounted, its directory gone."""
    killed = []
    for path in backend.state_dir.glob("sandboxes/tf-*/record.json"):
        record = json.loads(path.read_text())
        if record["labels"].get("episode") == episode:
            for mount in record["mounts"]:
                subprocess.run(["umount", "-l", mount], check=True)
            shutil.rmtree(path.parent)
            killed.append(record["id"])
    assert len(killed) == 1, killed


LINEAGE = Lineage("recovery-test", 0, "tasks", "params", "code")


def make_rollout(world: SimpleNamespace, backend: Any, **knobs: Any) -> Rollout:
    """``knobs``: Rollout's fields and RecoveryConfig's (a checkpoint every 3 steps unless said otherwise)."""
    recovery = {name: knobs.pop(name) for name in list(knobs) if name in RecoveryConfig.model_fields}
    return Rollout(
        backend=backend,
        image=world.image.name,
        image_digest=world.image.digest,
        snapshots=world.snapshots,
        grader=world.grader,
        limits=Limits(),
        env_limits=EnvLimits(max_turns=20),
        lineage=LINEAGE,
        recovery=RecoveryConfig(**{"checkpoint_every": 3, **recovery}),
        store=world.store,
        **knobs,
    )


def open_world(root: Path, tasks: list[Task], backend: BwrapBackend) -> SimpleNamespace:
    store = open_store(f"file://{root / 'store'}")
    snapshots = SnapshotStore(store, root / "cache")
    grader = Grader(backend, backend.image.name, backend.image.digest, snapshots, Limits())
    return SimpleNamespace(store=store, snapshots=snapshots, grader=grader, image=backend.image, tasks=tasks)


def bundled_world(
    root: Path, backend: BwrapBackend, task_ids: tuple[str, ...], *, author_only: bool = False
) -> SimpleNamespace:
    """Bundled tickets ``task_ids``, ingested and validated; a store, a snapshot cache and one grader.
    ``author_only``: each statement without what validation saw fail (the tiny model's 2,048 positions hold a few
    turns of the author's text alone)."""
    world = open_world(root, [], backend)
    src = REPO_ROOT / "tasks_src"
    tasks, _ = ingest_github_issues(src / "tickets" / "github_issues.jsonl", src / "repos", world.snapshots)
    cfg = ValidateConfig(runs=1)
    picked = [t for t in tasks if t.task_id in task_ids]
    world.tasks = [validate_task(t, backend, world.image.name, world.snapshots, Limits(), cfg) for t in picked]
    if author_only:
        world.tasks = [_author_only(t) for t in world.tasks]
    assert sorted(t.task_id for t in world.tasks if t.validation.valid) == sorted(task_ids)
    world.root = root
    return world


def _author_only(task: Task) -> Task:
    if task.statement is None:
        return task
    return task.model_copy(update={"problem_statement": task.statement.author_text(task.problem_statement)})
