"""The flows' typed boundary: the parameter types Prefect validates and the results the flows return.

Kept light (pydantic only): the CLI imports it at startup.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from trialforge.loop.records import IterationRecord, ShardReport

RunId = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
        description="names the run's episodes and checkpoints; pass a dead run's id to resume it",
    ),
]
ShardRunner = Literal["default", "ray"]  # where a round's shards run: threads of this process, or a Ray cluster
ShardSize = Annotated[int, Field(ge=1, le=10_000, description="episodes per Prefect task")]
Iteration = Annotated[int, Field(ge=0)]
TaskSetVersion = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$", description="content hash of a task set")]


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
