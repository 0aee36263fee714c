"""Trajectory records: one row per episode and one per step, with their Parquet schemas beside them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

import pyarrow as pa

SCHEMA_VERSION = 4  # 2: episodes gained ``recoveries``; 3: ``split`` (train, or eval: held out, never trained on);
# 4: ``cpu_s`` and ``verify_cpu_s``, CPU measured by the sandboxes' cgroups

Status = Literal["ok", "env_error", "timeout", "policy_error", "verifier_error"]


@dataclass
class StepRecord:
    run_id: str
    iteration: int
    episode_id: str
    step: int
    tool: str
    args: str  # JSON
    observation: str
    action_error: bool
    exec_s: float
    policy_s: float
    tokens_in: int
    tokens_out: int
    logprob: float | None
    info: str  # JSON: what the policy needs to learn from this step


@dataclass
class EpisodeRecord:
    run_id: str
    iteration: int
    episode_id: str
    task_id: str
    task_set_version: str
    tier: str
    policy: str
    policy_version: str
    group_id: str
    sample: int
    seed: int
    backend: str
    image_digest: str
    attempt: int
    status: Status
    cause: str  # why a non-ok episode ended as it did
    termination: str  # submitted | max_turns | context_exhausted | invalid_actions | timeout | error
    reward: float | None  # None when unknown: never 0, never trained on
    verifier_version: str
    verifier_report: str  # JSON
    integrity_flags: str  # JSON list
    final_diff: str
    steps: int
    tool_calls: int
    tokens_in: int
    tokens_out: int
    duration_s: float
    sandbox_s: float
    policy_s: float
    exec_s: float
    verify_s: float
    params_hash: str
    code_version: str
    recoveries: str = "[]"  # JSON list: every restore after a sandbox failure, resume and restart (rollout.checkpoints)
    split: str = "train"  # the task's split: an eval episode measures the policy and never reaches the loss
    # CPU seconds its sandboxes' cgroups counted while the episode held them, and the verifier's sandbox; None
    # when a sandbox could not be read (no cgroup: unprivileged bwrap; a dead container) or it was never measured.
    cpu_s: float | None = None
    verify_cpu_s: float | None = None
    step_rows: list[StepRecord] = field(default_factory=list, repr=False)

    def row(self) -> dict:
        data = asdict(self)
        data.pop("step_rows")
        return data

    def to_dict(self) -> dict:
        """The episode with its steps, as JSON-ready data (checkpoints and paused batches keep episodes so)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> EpisodeRecord:
        return cls(**{**data, "step_rows": [StepRecord(**s) for s in data.get("step_rows", [])]})


EPISODE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("iteration", pa.int32()),
        ("episode_id", pa.string()),
        ("task_id", pa.string()),
        ("task_set_version", pa.string()),
        ("tier", pa.string()),
        ("policy", pa.string()),
        ("policy_version", pa.string()),
        ("group_id", pa.string()),
        ("sample", pa.int32()),
        ("seed", pa.int64()),
        ("backend", pa.string()),
        ("image_digest", pa.string()),
        ("attempt", pa.int32()),
        ("status", pa.string()),
        ("cause", pa.string()),
        ("termination", pa.string()),
        ("reward", pa.float64()),
        ("verifier_version", pa.string()),
        ("verifier_report", pa.string()),
        ("integrity_flags", pa.string()),
        ("final_diff", pa.string()),
        ("steps", pa.int32()),
        ("tool_calls", pa.int32()),
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("duration_s", pa.float64()),
        ("sandbox_s", pa.float64()),
        ("policy_s", pa.float64()),
        ("exec_s", pa.float64()),
        ("verify_s", pa.float64()),
        ("params_hash", pa.string()),
        ("code_version", pa.string()),
        ("recoveries", pa.string()),
        ("split", pa.string()),
        ("cpu_s", pa.float64()),
        ("verify_cpu_s", pa.float64()),
    ],
    metadata={b"trialforge.schema_version": str(SCHEMA_VERSION).encode()},
)

STEP_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("iteration", pa.int32()),
        ("episode_id", pa.string()),
        ("step", pa.int32()),
        ("tool", pa.string()),
        ("args", pa.string()),
        ("observation", pa.string()),
        ("action_error", pa.bool_()),
        ("exec_s", pa.float64()),
        ("policy_s", pa.float64()),
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("logprob", pa.float64()),
        ("info", pa.string()),
    ],
    metadata={b"trialforge.schema_version": str(SCHEMA_VERSION).encode()},
)
