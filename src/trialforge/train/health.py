"""Is a batch fit to train on? Two questions, asked before every training step.

Did the environment break (``check_health``, ``assert_trainable``)? An env or verifier error rate *above* its
threshold (``observe.max_env_error_rate``, ``observe.max_verifier_error_rate``: plain floats) stops the run. Is there
anything to learn (``learning_health``, per learner policy: gold and noop never dilute it)? Each check
(``effective_batch``, ``zero_variance``, ``saturation``, ``entropy``, ``reward_hacking``, ``model_failures``) has a
threshold and an
action in ``observe.learning``: ``refuse`` skips the step (no update, no version bump, no checkpoint), ``warn`` only
reports, ``off`` skips the check; every verdict carries its reason into the train record, the metrics and the report.
What each check measures and why: docs/learning.md, "Health gates".
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trialforge.errors import TrialforgeError
from trialforge.rollout.endings import ending
from trialforge.section import Section
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.patches import is_test_path, touched_paths

log = logging.getLogger(__name__)


class UnhealthyBatchError(TrialforgeError):
    """A batch failed the health check; its rewards must not reach the trainer."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__(
            "refusing to train on an unhealthy batch: " + "; ".join(reasons) + ". Look at the failure attribution "
            "(`trialforge report RUN`), fix the infrastructure, or raise the thresholds under `observe:` "
            "in params.yaml"
        )
        self.reasons = reasons


class HealthThresholds(Section):
    """Did the environment break? (``observe`` in params.yaml: ``ObserveParams`` derives from this class.)"""

    max_env_error_rate: float = Field(0.2, ge=0.0, le=1.0)  # above this an iteration is unhealthy: no training
    max_verifier_error_rate: float = Field(0.05, ge=0.0, le=1.0)


@dataclass(frozen=True)
class Health:
    healthy: bool
    reasons: list[str] = field(default_factory=list)


def check_health(metrics: dict[str, Any], thresholds: HealthThresholds) -> Health:
    """``metrics`` is one iteration's (or a run's overall) process metrics from ``observe.metrics``."""
    episodes = metrics.get("episodes", 0)
    if not episodes:
        return Health(False, ["the batch has no episodes"])
    checks = (
        ("env error rate", metrics["env_error_rate"], thresholds.max_env_error_rate, _causes(metrics)),
        (
            "verifier error rate",
            metrics["verifier_error_rate"],
            thresholds.max_verifier_error_rate,
            f"{metrics['failures']['verifier']} of {episodes} episodes",
        ),
    )
    reasons = [
        f"{label} {rate:.1%} exceeds {limit:.1%} ({detail})" for label, rate, limit, detail in checks if rate > limit
    ]
    return Health(not reasons, reasons)


def assert_trainable(health: Health) -> None:
    """Raise ``UnhealthyBatchError`` unless ``health`` is healthy; call it before every training step."""
    if not health.healthy:
        log.error("refusing an unhealthy batch", extra={"reasons": health.reasons})
        raise UnhealthyBatchError(health.reasons)


def _causes(metrics: dict[str, Any]) -> str:
    by_cause = metrics["env_error_rate_by_cause"]
    return "by cause: " + ", ".join(f"{cause} {rate:.1%}" for cause, rate in by_cause.items())


# --- is there anything to learn? -------------------------------------------------------------

Action = Literal["refuse", "warn", "off"]
PASS_REWARD = 1.0


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(ge=0.0)
    action: Action


class LearningGate(BaseModel):
    """``observe.learning``: each check's threshold and what a batch that fails it gets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    effective_batch: Check = Check(threshold=1, action="refuse")  # fewer informative groups: nothing to learn
    zero_variance: Check = Check(threshold=0.75, action="warn")  # share of drawn groups with all-equal rewards
    saturation: Check = Check(threshold=1.0, action="warn")  # share of a tier's groups all 0 or all 1
    entropy: Check = Check(threshold=0.05, action="warn")  # mean nats per sampled decision: below, collapsed
    reward_hacking: Check = Check(threshold=0.25, action="refuse")  # pass-rate jump with suspicious passes rising
    # share of the episodes the model itself ended in a failure of format or budget (FORMAT_OR_BUDGET): above it,
    # the batch's lesson is the context or the reply format (rollout.context, the prompt), not the task
    model_failures: Check = Check(threshold=0.5, action="warn")

    @model_validator(mode="before")
    @classmethod
    def _over_defaults(cls, data: Any) -> Any:
        """``{entropy: {action: off}}`` keeps the default threshold (and the other way round)."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            k: {**fields[k].default.model_dump(), **v} if k in fields and isinstance(v, dict) else v
            for k, v in data.items()
        }


@dataclass(frozen=True)
class Verdict:
    check: str
    status: Literal["ok", "warn", "refuse", "off"]
    value: float | None
    threshold: float
    reason: str


@dataclass
class LearningHealth:
    """The learner's batch as the gate saw it, and a verdict per check."""

    groups: int  # drawn (rolled out) this iteration
    informative_groups: int  # of those, with at least two different rewards
    kept_groups: int  # the batch the sampler kept
    effective_episodes: int  # ok episodes of kept groups: what carries a nonzero advantage
    zero_variance_share: float | None
    saturation: dict[str, dict[str, int]]  # tier -> groups, all_zero, all_one
    entropy: float | None  # mean over sampled decisions; None when the policy records none
    pass_rate: float | None
    previous_pass_rate: float | None
    suspicious_pass_share: float | None  # passes whose diff touches tests or carries an integrity flag
    model_failures: dict[str, int] = field(default_factory=dict)  # episodes of each FORMAT_OR_BUDGET ending
    model_failure_share: float | None = None  # of every episode of the batch
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def trainable(self) -> bool:
        return not any(v.status == "refuse" for v in self.verdicts)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"trainable": self.trainable}


def learning_health(
    episodes: Sequence[EpisodeRecord],
    kept: Sequence[str],
    previous: Sequence[EpisodeRecord],
    gate: LearningGate,
) -> LearningHealth:
    """``episodes``: the learner's train-split episodes of this iteration (every group drawn, steps attached);
    ``kept``: the task ids of the groups the sampler kept; ``previous``: the same of the iteration before."""
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for e in episodes:
        groups[e.task_id].append(e)
    rewards = {t: [e.reward for e in g if e.status == "ok" and e.reward is not None] for t, g in groups.items()}
    informative = {t for t, r in rewards.items() if len(r) >= 2 and max(r) > min(r)}
    saturation: dict[str, dict[str, int]] = {}
    for task_id, group in sorted(groups.items()):
        row = saturation.setdefault(group[0].tier, {"groups": 0, "all_zero": 0, "all_one": 0})
        row["groups"] += 1
        known = rewards[task_id]
        row["all_zero"] += bool(known) and max(known) <= 0.0
        row["all_one"] += bool(known) and min(known) >= PASS_REWARD
    kept_set = set(kept) & informative
    now, before = _pass_rate(episodes), _pass_rate(previous)
    health = LearningHealth(
        groups=len(groups),
        informative_groups=len(informative),
        kept_groups=len(kept_set),
        effective_episodes=sum(len(rewards[t]) for t in kept_set),
        zero_variance_share=round(1 - len(informative) / len(groups), 4) if groups else None,
        saturation=saturation,
        entropy=_mean_entropy(episodes),
        pass_rate=now,
        previous_pass_rate=before,
        suspicious_pass_share=_suspicious_share(episodes),
        **_model_failures(episodes),
    )
    health.verdicts = _verdicts(health, _suspicious_share(previous), gate)
    return health


def _verdicts(h: LearningHealth, suspicious_before: float | None, gate: LearningGate) -> list[Verdict]:
    out = []

    def judge(name: str, value: float | None, failed: bool, reason: str) -> None:
        check: Check = getattr(gate, name)
        status = "off" if check.action == "off" else check.action if failed else "ok"
        out.append(Verdict(name, status, value, check.threshold, reason if failed else ""))

    eb = gate.effective_batch.threshold
    judge(
        "effective_batch",
        h.kept_groups,
        h.kept_groups < eb,
        f"{h.kept_groups} informative groups in the batch (< {eb:g}) of {h.groups} rolled out: every other group "
        "got equal rewards, so a step would carry no advantage",
    )
    zv = gate.zero_variance.threshold
    judge(
        "zero_variance",
        h.zero_variance_share,
        h.zero_variance_share is not None and h.zero_variance_share > zv,
        f"{h.zero_variance_share:.0%} of the groups rolled out had all-equal rewards (> {zv:.0%}): rollouts are "
        "spent on tasks too hard or too easy for the learner now"
        if h.zero_variance_share is not None
        else "",
    )
    sat = gate.saturation.threshold
    saturated = {
        tier: row
        for tier, row in h.saturation.items()
        if row["groups"] >= 2 and (row["all_zero"] + row["all_one"]) / row["groups"] >= sat
    }
    judge(
        "saturation",
        max(((r["all_zero"] + r["all_one"]) / r["groups"] for r in h.saturation.values()), default=None),
        bool(saturated),
        "; ".join(
            f"tier {tier}: {r['all_zero']} of {r['groups']} groups all 0, {r['all_one']} all 1"
            for tier, r in saturated.items()
        ),
    )
    ent = gate.entropy.threshold
    judge(
        "entropy",
        h.entropy,
        h.entropy is not None and h.entropy < ent,
        f"mean entropy {h.entropy:.3f} nats per sampled decision (< {ent:g}): the policy has collapsed onto its "
        "choices and no longer explores"
        if h.entropy is not None
        else "",
    )
    jump = None if h.pass_rate is None or h.previous_pass_rate is None else h.pass_rate - h.previous_pass_rate
    rh = gate.reward_hacking.threshold
    suspicious = h.suspicious_pass_share or 0.0
    hacked = jump is not None and jump >= rh and suspicious > (suspicious_before or 0.0)
    judge(
        "reward_hacking",
        jump,
        hacked,
        f"pass rate jumped {h.previous_pass_rate:.2f} -> {h.pass_rate:.2f} while the share of passes that touch "
        f"tests or carry integrity flags rose to {suspicious:.0%}: inspect those diffs before training on them"
        if hacked
        else "",
    )
    mf = gate.model_failures.threshold
    share = h.model_failure_share
    judge(
        "model_failures",
        share,
        share is not None and share > mf,
        f"{share:.0%} of the episodes ended in the model's own failure of format or budget (> {mf:.0%}: "
        + ", ".join(f"{k} {n}" for k, n in h.model_failures.items() if n)
        + "): the batch teaches the context or the reply format, not the task; look at rollout.context, "
        "rollout.max_new_tokens and the prompt"
        if share is not None and share > mf
        else "",
    )
    for v in out:
        if v.status in ("warn", "refuse"):
            log.warning("learning health: %s %s: %s", v.check, v.status, v.reason)
    return out


FORMAT_OR_BUDGET = ("context_exhausted", "invalid_actions")  # model endings that are no attempt at the task


def _model_failures(episodes: Sequence[EpisodeRecord]) -> dict[str, Any]:
    ends = [ending(e.status, e.termination, e.cause, bool(e.final_diff)) for e in episodes]
    counts = {key: ends.count(key) for key in FORMAT_OR_BUDGET}
    share = round(sum(counts.values()) / len(ends), 4) if ends else None
    return {"model_failures": counts, "model_failure_share": share}


def _pass_rate(episodes: Sequence[EpisodeRecord]) -> float | None:
    ok = [e for e in episodes if e.status == "ok" and e.reward is not None]
    return round(sum(e.reward >= PASS_REWARD for e in ok) / len(ok), 4) if ok else None


def _suspicious_share(episodes: Sequence[EpisodeRecord]) -> float | None:
    passes = [e for e in episodes if e.status == "ok" and e.reward is not None and e.reward >= PASS_REWARD]
    if not passes:
        return None
    flagged = [e for e in passes if json.loads(e.integrity_flags or "[]") or _touches_tests(e.final_diff)]
    return round(len(flagged) / len(passes), 4)


def _touches_tests(diff: str) -> bool:
    return any(is_test_path(p) for p in touched_paths(diff))


def _mean_entropy(episodes: Sequence[EpisodeRecord]) -> float | None:
    """Mean of the ``entropy`` the policy recorded with each sampled decision (``StepRecord.info``)."""
    values = []
    for e in episodes:
        for step in e.step_rows:
            if step.logprob is not None and '"entropy"' in step.info:
                value = json.loads(step.info).get("entropy")
                if isinstance(value, int | float) and math.isfinite(value):
                    values.append(float(value))
    return round(sum(values) / len(values), 4) if values else None
