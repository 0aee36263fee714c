"""The environment server's wire format: one typed model per request and answer (docs/env-server.md).

An episode is ``reset`` (a task: named, or drawn from a split and tier) -> ``step`` (one tool call) ... ->
``close`` (the verdict). A reward the verifier could not establish is ``null``, never 0.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"  # policy names and versions, as they appear in the datasets


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResetRequest(_Body):
    task_id: str | None = Field(None, max_length=256)  # None: drawn from `split` (and `tier`) with `seed`
    split: Literal["train", "eval"] = "train"
    tier: str | None = Field(None, max_length=64)
    seed: int | None = None  # the draw's seed and the episode's; None: the server's episode counter
    policy: str = Field("client", pattern=NAME)  # recorded as the episode's policy
    policy_version: str = Field("unversioned", pattern=NAME)


class Reset(BaseModel):
    episode_id: str
    task_id: str
    prompt: str  # the first user message
    tools: list[dict[str, Any]]  # OpenAI tool schemas
    max_turns: int


class StepRequest(_Body):
    episode_id: str = Field(max_length=64)
    tool: str = Field(max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)
    # Actions taken before this one (StepResult.turn of the previous answer, 0 after reset). Given, a retried
    # request (its answer was lost) gets the first answer again, and a request out of order is refused (409).
    turn: int | None = Field(None, ge=0)


class StepResult(BaseModel):
    observation: str
    done: bool  # the episode has ended (submitted, out of turns or time, or failed): close it for the verdict
    turn: int  # actions taken so far


class CloseRequest(_Body):
    episode_id: str = Field(max_length=64)


class Verdict(BaseModel):
    episode_id: str
    task_id: str
    status: str  # ok | env_error | verifier_error | policy_error | timeout
    reward: float | None  # None: unknown (any status but ok)
    cause: str
    flags: list[str]  # integrity flags (tampering evidence, audit findings)
    termination: str  # submitted (by the client, or by close) | max_turns | timeout | error
    steps: int


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    live: int
    max_live: int
    tasks: int
