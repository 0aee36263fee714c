"""The rollouts' settings (``rollout`` in params.yaml): which policies run, how many episodes of each, and the
episodes' bounds and recovery. ``Params`` embeds ``RolloutParams`` as is; a ``RolloutParams`` is the
``EnvLimits`` every episode's environment gets and the rollout's ``RecoveryConfig``."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from trialforge.rollout.context import ContextParams
from trialforge.rollout.env import EnvLimits
from trialforge.rollout.models import ModelSpec
from trialforge.section import Section

BUILTIN_POLICIES = ("gold", "noop", "random_edit", "repair", "lm")  # scripted ones and the two learners
_POLICY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


class RecoveryConfig(Section):
    """How an episode survives infrastructure faults, and whether its policy may roll back (``rollout`` in
    params.yaml: ``RolloutParams`` derives from this class)."""

    env_retries: int = Field(1, ge=0)  # whole attempts again after an env_error
    # steps between periodic checkpoints (taken only if the workspace changed; 0: only before risky commands)
    checkpoint_every: int = Field(5, ge=0)
    max_recoveries: int = Field(2, ge=0)  # sandbox restores per attempt; one more failure ends it as env_error
    allow_rollback: bool = False  # offer the ``restore`` tool (roll back to a named checkpoint)


class RolloutParams(EnvLimits, RecoveryConfig):
    policies: list[str] = ["gold", "noop", "repair"]  # built-in names or names defined under `models`
    models: dict[str, ModelSpec] = {}  # fixed language-model policies by name (rollout/models.py)
    group_size: int = Field(4, ge=1)
    eval_group_size: int = Field(4, ge=0)  # learner episodes per held-out task each iteration (0: no held-out curve)
    reference_group_size: int = Field(1, ge=1)  # episodes per task of the scripted policies (gold, noop: no sampling)
    # Which tasks the scripted policies (the canary that grading still works) run on each iteration. used: the
    # tasks whose rewards the iteration uses (the learner's draws and the held-out set); all: every task. A run
    # without a learner always runs them on every task (they are all it rolls out).
    reference_tasks: Literal["used", "all"] = "used"
    # max_turns, observation_cap: ``EnvLimits``
    # env_retries, checkpoint_every, max_recoveries, allow_rollback: ``RecoveryConfig``
    durable_checkpoints: bool = False  # keep episode checkpoints in the object store, not only in memory
    setup: str = ""  # shell command run once per task in its sandbox; every episode of the task starts after it
    setup_timeout_s: float = Field(600.0, gt=0)
    max_new_tokens: int = Field(256, ge=1)  # per turn of an LM policy
    temperature: float = Field(1.0, ge=0.0)  # an LM policy's sampling temperature (0: greedy)
    context: ContextParams = ContextParams()  # how an LM policy's episode keeps within its context window

    @model_validator(mode="after")
    def _known_policies(self) -> RolloutParams:
        shadowing = sorted(set(self.models) & set(BUILTIN_POLICIES))
        if shadowing:
            raise ValueError(f"models {shadowing} would shadow built-in policies {list(BUILTIN_POLICIES)}: rename them")
        badly_named = sorted(n for n in self.models if not _POLICY_NAME.match(n))
        if badly_named:
            raise ValueError(f"model names {badly_named} must be a letter then up to 63 letters, digits, '_', '.', '-'")
        unknown = [n for n in self.policies if n not in BUILTIN_POLICIES and n not in self.models]
        if unknown:
            known = [*BUILTIN_POLICIES, *self.models]
            raise ValueError(f"policies {unknown} are neither built in nor defined in rollout.models; known: {known}")
        return self
