"""Exports of graded trajectories for the trainers people already run: verl and TRL.

Each ``ok`` episode becomes one row, its conversation rebuilt from the stored steps (the opening the policy saw, then
per step an assistant tool call and the environment's answer); episodes that ended in an infrastructure or verifier
fault carry no reward and are never exported. An export is one Parquet part, published like every dataset at
``datasets/verl/export=NAME/part-all.parquet`` or ``datasets/trl/export=NAME/part-all.parquet``; exporting NAME again
replaces it. Tool-call ``arguments`` and ``tools`` are JSON text.
Columns and why: docs/storage.md, "Exports for verl and TRL".
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import pyarrow as pa

from trialforge.errors import StoreError
from trialforge.rollout.env import TOOLS, opening
from trialforge.store import datasets, query
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EPISODE_SCHEMA
from trialforge.tasks.schema import Task
from trialforge.tasks.taskset import from_table

SCHEMA_VERSION = 1
VERL = "verl"
TRL = "trl"
TASKS = "tasks"
PART = "all"
TrlLayout = Literal["prompt_completion", "messages"]

# Episode columns copied into every exported row: the lineage that says where the row came from.
LINEAGE = (
    "run_id",
    "iteration",
    "episode_id",
    "task_id",
    "group_id",
    "sample",
    "task_set_version",
    "image_digest",
    "policy",
    "policy_version",
    "verifier_version",
    "params_hash",
    "code_version",
)
_LINEAGE_FIELDS = [EPISODE_SCHEMA.field(name) for name in LINEAGE]
_METADATA = {datasets.SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()}

PROMPT_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
TOOL_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.list_(TOOL_CALL)),
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
    ]
)

VERL_SCHEMA = pa.schema(
    [
        pa.field("data_source", pa.string(), nullable=False),
        pa.field("prompt", pa.list_(PROMPT_MESSAGE), nullable=False),
        pa.field("ability", pa.string(), nullable=False),
        pa.field("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())]), nullable=False),
        pa.field(
            "extra_info",
            pa.struct([("index", pa.int64()), ("split", pa.string()), ("reward", pa.float64()), *_LINEAGE_FIELDS]),
            nullable=False,
        ),
        pa.field("messages", pa.list_(MESSAGE), nullable=False),
    ],
    metadata=_METADATA,
)

_TRL_COMMON = [
    pa.field("tools", pa.string(), nullable=False),
    pa.field("reward", pa.float64(), nullable=False),
    *_LINEAGE_FIELDS,
]
TRL_SCHEMAS: dict[str, pa.Schema] = {
    "prompt_completion": pa.schema(
        [
            pa.field("prompt", pa.list_(PROMPT_MESSAGE), nullable=False),
            pa.field("completion", pa.list_(MESSAGE), nullable=False),
            *_TRL_COMMON,
        ],
        metadata=_METADATA,
    ),
    "messages": pa.schema([pa.field("messages", pa.list_(MESSAGE), nullable=False), *_TRL_COMMON], metadata=_METADATA),
}


@dataclass(frozen=True)
class Trajectory:
    """An ``ok`` episode with its task and its conversation."""

    episode: dict[str, Any]
    task: Task
    messages: list[dict[str, Any]]

    def lineage(self) -> dict[str, Any]:
        return {name: self.episode[name] for name in LINEAGE}

    @property
    def prompt(self) -> list[dict[str, Any]]:
        """What the policy was given before it acted: the system message, if any, and the opening."""
        return self.messages[: 1 + next(i for i, m in enumerate(self.messages) if m["role"] == "user")]

    @property
    def completion(self) -> list[dict[str, Any]]:
        return self.messages[len(self.prompt) :]


@dataclass(frozen=True)
class Export:
    dataset: str
    name: str
    key: str
    uri: str  # what a trainer's data path points at (download it first where the trainer wants local files)
    rows: int


# --- conversations -----------------------------------------------------------------------


def conversation(
    problem_statement: str, step_rows: Sequence[dict[str, Any]], *, system_prompt: str | None = None
) -> list[dict[str, Any]]:
    """OpenAI-style messages of one episode from its step rows (in step order).

    An assistant message carries the text the policy said with its call, when the policy recorded it
    (``info["content"]``, as LLM policies do); arguments stay the JSON text the step stored.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": opening(problem_statement)})
    for step in step_rows:
        call_id = f"call_{step['step']}"
        call = {"id": call_id, "type": "function", "function": {"name": step["tool"], "arguments": step["args"]}}
        said = json.loads(step["info"] or "{}").get("content") or ""
        messages.append({"role": "assistant", "content": said, "tool_calls": [call]})
        messages.append({"role": "tool", "content": step["observation"], "tool_call_id": call_id, "name": step["tool"]})
    return messages


def trajectories(
    store: ObjectStore,
    selection: query.Selection = query.ALL,
    *,
    tasks: Sequence[Task] | None = None,
    system_prompt: str | None = None,
) -> list[Trajectory]:
    """The selection's ``ok`` episodes with their conversations, in a stable order.

    Tasks come from ``tasks`` when given, else from the published task sets
    (``datasets/tasks``, partition ``task_set=VERSION``) the episodes name. ``system_prompt``, when
    given, opens every conversation (the environment has none; an LLM policy may have used its own).
    """
    ok = replace(selection, statuses=("ok",))
    episode_rows = sorted(
        query.episodes(store, ok).to_pylist(),
        key=lambda e: (e["run_id"], e["iteration"], e["task_id"], e["policy"], e["sample"], e["episode_id"]),
    )
    if not episode_rows:
        raise StoreError(f"nothing to export: no ok episodes match {selection}")
    steps_of: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for step in query.steps(store, ok).to_pylist():
        steps_of[(step["run_id"], step["episode_id"])].append(step)
    task_of = _tasks(store, sorted({e["task_set_version"] for e in episode_rows}), tasks)
    result = []
    for episode in episode_rows:
        task = _task_of(task_of, episode, given=tasks is not None)
        step_rows = steps_of[(episode["run_id"], episode["episode_id"])]
        messages = conversation(task.problem_statement, step_rows, system_prompt=system_prompt)
        result.append(Trajectory(episode, task, messages))
    return result


def _task_of(task_of: dict[tuple[str, str], Task], episode: dict[str, Any], *, given: bool) -> Task:
    version, task_id = episode["task_set_version"], episode["task_id"]
    if (version, task_id) not in task_of:
        where = "the given tasks" if given else f"{TASKS} partition task_set={version}"
        raise StoreError(
            f"episode {episode['episode_id']} ran task {task_id!r}, which {where} does not hold; "
            "pass the task set the run used (tasks=...) or publish it (pipeline.publish_taskset)"
        )
    return task_of[(version, task_id)]


def _tasks(store: ObjectStore, versions: list[str], tasks: Sequence[Task] | None) -> dict[tuple[str, str], Task]:
    if tasks is not None:
        return {(version, t.task_id): t for version in versions for t in tasks}
    found = {}
    for version in versions:
        table = datasets.read_table(store, TASKS, filters={"task_set": version})
        if table.num_rows == 0:
            raise StoreError(
                f"task set {version} is not published in {store.uri(datasets.ROOT + '/' + TASKS)}: "
                "pass tasks=... or publish it (pipeline.publish_taskset)"
            )
        found.update({(version, t.task_id): t for t in from_table(table)})
    return found


# --- rows --------------------------------------------------------------------------------


def verl_row(index: int, trajectory: Trajectory, *, data_source: str, ability: str) -> dict[str, Any]:
    """One row of verl's RL dataset; ``messages`` (the whole episode) is what its multi-turn SFT dataset reads."""
    task = trajectory.task
    tests = {"task_id": task.task_id, "fail_to_pass": task.fail_to_pass, "pass_to_pass": task.pass_to_pass}
    reward = trajectory.episode["reward"]
    return {
        "data_source": data_source,
        "prompt": trajectory.prompt,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": json.dumps(tests, sort_keys=True)},
        "extra_info": {"index": index, "split": task.split, "reward": reward, **trajectory.lineage()},
        "messages": trajectory.messages,
    }


def trl_row(trajectory: Trajectory, *, layout: TrlLayout) -> dict[str, Any]:
    """One row of TRL's conversational prompt-completion type, or its language-modelling (``messages``) type."""
    conversation_columns: dict[str, Any] = (
        {"prompt": trajectory.prompt, "completion": trajectory.completion}
        if layout == "prompt_completion"
        else {"messages": trajectory.messages}
    )
    reward = trajectory.episode["reward"]
    return {**conversation_columns, "tools": json.dumps(TOOLS), "reward": reward, **trajectory.lineage()}


# --- exports -----------------------------------------------------------------------------


def export_verl(
    store: ObjectStore,
    name: str,
    selection: query.Selection = query.ALL,
    *,
    tasks: Sequence[Task] | None = None,
    system_prompt: str | None = None,
    data_source: str = "trialforge",
    ability: str = "coding",
) -> Export:
    """Publish the selection's ``ok`` episodes as verl Parquet at ``datasets/verl/export=NAME``."""
    chosen = trajectories(store, selection, tasks=tasks, system_prompt=system_prompt)
    rows = [verl_row(i, t, data_source=data_source, ability=ability) for i, t in enumerate(chosen)]
    return _publish(store, VERL, name, rows, VERL_SCHEMA)


def export_trl(
    store: ObjectStore,
    name: str,
    selection: query.Selection = query.ALL,
    *,
    tasks: Sequence[Task] | None = None,
    system_prompt: str | None = None,
    layout: TrlLayout = "prompt_completion",
) -> Export:
    """Publish the selection's ``ok`` episodes as TRL Parquet at ``datasets/trl/export=NAME``."""
    if layout not in TRL_SCHEMAS:
        raise StoreError(f"unknown TRL layout {layout!r}; layouts: {sorted(TRL_SCHEMAS)}")
    chosen = trajectories(store, selection, tasks=tasks, system_prompt=system_prompt)
    rows = [trl_row(t, layout=layout) for t in chosen]
    return _publish(store, TRL, name, rows, TRL_SCHEMAS[layout])


def _publish(store: ObjectStore, dataset: str, name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> Export:
    key = datasets.write_rows(store, dataset, rows, schema, partition={"export": name}, part=PART)
    return Export(dataset=dataset, name=name, key=key, uri=store.uri(key), rows=len(rows))
