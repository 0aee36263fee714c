"""Is a batch fit to train on? A batch with too many infrastructure failures is not.

Rewards of a batch where many episodes died of sandbox or verifier faults are a biased sample
(the tasks that break infrastructure drop out of it), so the trainer refuses such a batch
instead of learning from it. Thresholds are plain floats (``observe.max_env_error_rate`` and
``observe.max_verifier_error_rate`` in params.yaml); a rate *above* its threshold is unhealthy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from trialforge.errors import TrialforgeError

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


@dataclass(frozen=True)
class HealthThresholds:
    max_env_error_rate: float = 0.2
    max_verifier_error_rate: float = 0.05


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
