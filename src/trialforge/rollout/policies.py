"""Policies: given what the environment has shown so far, choose the next action.

A policy starts one ``EpisodePolicy`` per episode from a ``TaskView``: the
task's id and problem statement, never its patches. Scripted policies that
replay known answers are built from the task set itself, explicitly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from trialforge.rollout.env import Action
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


def patch_to_actions(patch: str) -> list[Action]:
    """Turn a unified diff into ``replace``/``create``/``run rm`` tool calls, one per hunk."""
    actions: list[Action] = []
    for block in re.split(r"(?=^diff --git )", patch, flags=re.MULTILINE):
        header = re.match(r"diff --git a/(\S+) b/(\S+)", block)
        if not header:
            continue
        path = header.group(2)
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
