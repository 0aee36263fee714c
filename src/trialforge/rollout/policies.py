"""Policies: given what the environment has shown so far, choose the next action.

A policy starts one ``EpisodePolicy`` per episode from a ``TaskView``: the
task's id and problem statement, never its patches. Scripted policies that
replay known answers are built from the task set itself, explicitly.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from trialforge.errors import PolicyError
from trialforge.rollout.env import Action
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.patches import patch_blocks, touched_paths
from trialforge.tasks.schema import Task


@dataclass(frozen=True)
class TaskView:
    task_id: str
    problem_statement: str


@dataclass
class Decision:
    action: Action
    logprob: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class EpisodePolicy(Protocol):
    def act(self, observation: str) -> Decision: ...


class Policy(Protocol):
    name: str
    version: str

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy: ...


class _Script:
    """Plays a fixed list of actions, then submits."""

    def __init__(self, actions: list[Action]) -> None:
        self.actions = list(actions)

    def act(self, observation: str) -> Decision:
        return Decision(self.actions.pop(0) if self.actions else Action(tool="submit"))


class NoopPolicy:
    """Submits at once: the floor every task must score 0 on."""

    name = "noop"
    version = "scripted"

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        return _Script([])


class GoldPolicy:
    """Replays each task's gold patch through the edit tools: the ceiling every valid task must score 1 on."""

    name = "gold"
    version = "scripted"

    def __init__(self, tasks: list[Task]) -> None:
        self.patches = {t.task_id: t.gold_patch for t in tasks}

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        return _Script(patch_to_actions(self.patches[view.task_id]))


class ReplayPolicy:
    """Plays recorded actions again: each task's steps from an earlier episode, then submits.

    For reproducing, rescoring or debugging an episode (read back from the ``steps`` dataset), and for
    scripted tests. Its version names the recording, so replays of different recordings never share ids.
    """

    def __init__(self, recordings: dict[str, list[Action]], name: str = "replay") -> None:
        self.recordings = {task_id: list(actions) for task_id, actions in recordings.items()}
        self.name = name
        blob = json.dumps({k: [a.model_dump() for a in v] for k, v in sorted(self.recordings.items())}, sort_keys=True)
        self.version = "replay-" + hashlib.sha256(blob.encode()).hexdigest()[:12]

    @classmethod
    def from_episodes(cls, episodes: list[EpisodeRecord], name: str = "replay") -> ReplayPolicy:
        """One recording per task: the steps of its first episode in ``episodes`` (its submit included)."""
        recordings: dict[str, list[Action]] = {}
        for episode in episodes:
            steps = sorted(episode.step_rows, key=lambda s: s.step)
            recordings.setdefault(episode.task_id, [Action(tool=s.tool, args=json.loads(s.args)) for s in steps])
        return cls(recordings, name)

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        if view.task_id not in self.recordings:
            raise PolicyError(f"policy {self.name} has no recording for task {view.task_id}")
        return _Script(self.recordings[view.task_id])


def patch_to_actions(patch: str) -> list[Action]:
    """Turn a unified diff into ``replace``/``create``/``run rm`` tool calls, one per hunk."""
    actions: list[Action] = []
    for block in patch_blocks(patch):
        if not (paths := touched_paths(block)):
            continue
        path = paths[-1]
        if re.search(r"^\+\+\+ /dev/null$", block, re.MULTILINE):
            actions.append(Action(tool="run", args={"command": f"rm -f -- '{path}'"}))
            continue
        new_file = re.search(r"^--- /dev/null$", block, re.MULTILINE) is not None
        for old, new in _hunks(block):
            if new_file:
                actions.append(Action(tool="create", args={"path": path, "content": new}))
            else:
                actions.append(Action(tool="replace", args={"path": path, "old": old, "new": new}))
    return actions


def _hunks(block: str) -> list[tuple[str, str]]:
    hunks: list[tuple[list[str], list[str]]] = []
    last = ""
    for line in block.splitlines(keepends=True):
        if line.startswith("@@"):
            hunks.append(([], []))
        elif hunks and line.startswith("\\"):  # "\ No newline at end of file" applies to the line before
            old, new = hunks[-1]
            for side in (old,) if last == "-" else (new,) if last == "+" else (old, new):
                side[-1] = side[-1].rstrip("\n")
        elif hunks and line[:1] in (" ", "-", "+"):
            old, new = hunks[-1]
            last = line[0]
            if last in (" ", "-"):
                old.append(line[1:])
            if last in (" ", "+"):
                new.append(line[1:])
    return [("".join(old), "".join(new)) for old, new in hunks]
