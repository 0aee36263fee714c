"""What the loop leaves in the object store, and reads back: the task set a run started on, per iteration its
rollout's record and its update's, the learner's checkpoints, and the episodes a policy published (with their
steps).

Every record is written last, after what it describes: its presence marks a step as done, so a resumed run
skips it instead of doing it twice.
"""

from __future__ import annotations

import os
import socket
import sys
from collections import defaultdict
from dataclasses import fields
from typing import Any

from pydantic import BaseModel

from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EpisodeRecord, StepRecord
from trialforge.tasks.schema import Difficulty


class StageResult(BaseModel):
    """A task-set flow's output: the version it published and what each step kept and dropped."""

    version: str
    tasks: int
    funnels: list[dict[str, Any]]


class ShardNode(BaseModel):
    """Where a shard ran: the process that ran it, which opened its sandboxes (so they live on that machine), and
    the Ray node of that process when it is connected to a Ray cluster."""

    hostname: str
    pid: int
    ray_node_id: str | None = None  # None: a process not connected to Ray
    ray_node_ip: str | None = None

    @classmethod
    def here(cls) -> ShardNode:
        ray = sys.modules.get("ray")  # not imported for this: a process Ray runs, or one connected to it, has it
        if ray is None or not ray.is_initialized():
            return cls(hostname=socket.gethostname(), pid=os.getpid())
        node_id, node_ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
        return cls(hostname=socket.gethostname(), pid=os.getpid(), ray_node_id=node_id, ray_node_ip=node_ip)

    def __str__(self) -> str:
        on_ray = f" on ray node {self.ray_node_id[:8]} ({self.ray_node_ip})" if self.ray_node_id else ""
        return f"{self.hostname} pid {self.pid}{on_ray}"


class ShardReport(BaseModel):
    """One shard's outcome, timed from when it held its sandbox slots to when its part was published."""

    shard_id: str
    episodes: int
    statuses: dict[str, int]
    started_at: float  # epoch seconds
    finished_at: float
    node: ShardNode

    @property
    def work_s(self) -> float:
        return self.finished_at - self.started_at


class IterationRecord(BaseModel):
    """How an iteration's rollout ended: what the learner's step and the next iteration's sampler need."""

    kept: list[str] = []  # task ids of the learner's groups the sampler kept (the train batch)
    rates: dict[str, float] = {}  # live pass rates of the learner after this iteration
    difficulty: dict[str, Difficulty] = {}  # per task: the learner's newest measured pass@k (NAME@VERSION)
    sampler: dict[str, Any] = {}  # the sampler's stats (SamplerStats.as_dict)


class TrainResult(BaseModel):
    checkpoint: str | None  # the learner's weights after this iteration (None: nothing to learn from yet)
    stats: dict[str, Any] | None  # the step's (``decision``: trained or skipped; ``health``: the learning gate's)
    resumed: bool = False  # an earlier attempt of this run had already taken this step


def run_record_key(run_id: str) -> str:
    return f"runs/{run_id}.json"


def start_run(store: ObjectStore, run_id: str, taskset: StageResult) -> StageResult:
    """Record the task set a run trains on (and the funnels that made it) before its first rollout."""
    store.put_bytes(run_record_key(run_id), taskset.model_dump_json().encode())
    return taskset


def started_run(store: ObjectStore, run_id: str) -> StageResult | None:
    """The task set a run recorded at its start, or None for a run not started: a resumed run keeps its task
    set even if curating again would give another version (validation timings are part of a task)."""
    key = run_record_key(run_id)
    return StageResult.model_validate_json(store.get_bytes(key)) if store.exists(key) else None


def iteration_key(run_id: str, iteration: int) -> str:
    return f"runs/{run_id}/iteration-{iteration}.json"


def read_iteration(store: ObjectStore, run_id: str, iteration: int) -> IterationRecord | None:
    key = iteration_key(run_id, iteration)
    return IterationRecord.model_validate_json(store.get_bytes(key)) if store.exists(key) else None


def load_episodes(
    store: ObjectStore, run_id: str, iteration: int, policy: str, seeds: list[int] | None = None
) -> list[EpisodeRecord]:
    """A policy's published episodes of one iteration (those with ``seeds``, if given), with their steps."""
    where = {"run": run_id, "iteration": str(iteration)}
    chosen = {"policy": policy} | ({"seed": [str(s) for s in seeds]} if seeds is not None else {})
    episodes = datasets.read_table(store, "episodes", filters=where | chosen)
    if episodes.num_rows == 0:
        return []
    steps = datasets.read_table(store, "steps", filters={**where, "episode_id": episodes["episode_id"].to_pylist()})
    by_episode: dict[str, list[StepRecord]] = defaultdict(list)
    if steps.num_rows:
        for row in steps.select([f.name for f in fields(StepRecord)]).to_pylist():
            by_episode[row["episode_id"]].append(StepRecord(**row))
    columns = [f.name for f in fields(EpisodeRecord) if f.name != "step_rows"]
    records = [
        EpisodeRecord(**row, step_rows=sorted(by_episode[row["episode_id"]], key=lambda s: s.step))
        for row in episodes.select(columns).to_pylist()
    ]
    return sorted(records, key=lambda e: e.seed)  # plan order: seeds grow with the job's index


def checkpoint_key(run_id: str, learner: str, version: int) -> str:
    """Where the train step keeps the learner after update number ``version``: the repair policy's is this
    object, a language model's the objects under it less ``.pt`` (``train.hf_checkpoint``)."""
    return f"checkpoints/{run_id}/{learner}-v{version}.pt"


def train_record_key(run_id: str, iteration: int) -> str:
    """What the train step of an iteration did (trained or skipped, and why): written last, it marks the step taken."""
    return f"runs/{run_id}/train-{iteration}.json"
