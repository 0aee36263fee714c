"""Orchestration: what the Prefect flows in ``flows/`` run, and how.

The flows are wiring only; this package holds what they share:

- here, the flows' typed boundary: validated parameter types and the small results they return;
- ``shards``: rollout work as shards of episodes, published idempotently, resumable, and the store
  traffic around them (task sets in, episodes and checkpoints out); no Prefect in it;
- ``runners``: where shards run (threads here, or a Ray cluster), with Prefect retries, concurrency
  limits, artifacts and progress;
- ``serve``: the deployments of ``prefect.yaml`` served from one process, and a local Prefect server;
- ``cli``: ``trialforge serve`` and ``trialforge flow``.

Kept light (pydantic only): the CLI imports this package at startup.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from trialforge.tasks.schema import Difficulty

RunId = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
        description="names the run's episodes and checkpoints; pass a dead run's id to resume it",
    ),
]
Runner = Literal["default", "ray"]
ShardSize = Annotated[int, Field(ge=1, le=10_000, description="episodes per Prefect task")]
Iteration = Annotated[int, Field(ge=0)]
TaskSetVersion = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$", description="content hash of a task set")]


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


class RolloutResult(BaseModel):
    run_id: str
    iteration: int
    wall_s: float  # the flow's rollout, from starting its task runner to the last shard's report
    reports: list[ShardReport]  # the shards this flow ran (an earlier attempt's published ones are skipped)
    record: IterationRecord

    @property
    def episodes(self) -> int:
        return sum(r.episodes for r in self.reports)

    @property
    def work_s(self) -> float:
        """Summed inside the shards: with one shard at a time, the rest of ``wall_s`` is orchestration."""
        return sum(r.work_s for r in self.reports)


class TrainResult(BaseModel):
    checkpoint: str | None  # the learner's weights after this iteration (None: nothing to learn from yet)
    stats: dict[str, Any] | None  # the step's (``decision``: trained or skipped; ``health``: the learning gate's)
    resumed: bool = False  # an earlier attempt of this run had already taken this step
