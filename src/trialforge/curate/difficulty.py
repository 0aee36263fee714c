"""Measured difficulty: pass@k per task from the rollouts of one policy version.

Only ``ok`` episodes count: an episode the infrastructure broke says nothing about the task. An
episode is solved when its reward reaches ``success`` (1.0: every named test passed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import comb

import pandas as pd

from trialforge.curate.tiers import policy_key, tier_of_measured
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.schema import Difficulty

Episodes = Iterable[EpisodeRecord] | pd.DataFrame
COLUMNS = ["task_id", "policy", "policy_version", "status", "reward"]


@dataclass(frozen=True)
class Outcomes:
    """``n`` ok episodes of one task, ``c`` of them solved."""

    n: int
    c: int

    @property
    def rate(self) -> float:
        return self.c / self.n


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n episodes with c solved: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n episodes, got n={n}: sample more or lower k")
    return 1.0 - comb(n - c, k) / comb(n, k)


def count_outcomes(
    episodes: Episodes, policy: str, version: str | None = None, success: float = 1.0
) -> dict[str, Outcomes]:
    """Per task: ok episodes of ``policy`` (of ``version``; any version when None) and how many were solved.

    ``episodes`` are EpisodeRecords or the stored episodes table
    (``datasets.read_pandas(store, "episodes", filters=...)``).
    """
    frame = _frame(episodes)
    mine = frame[(frame["policy"] == policy) & (frame["status"] == "ok")]
    if version is not None:
        mine = mine[mine["policy_version"] == version]
    solved = mine.assign(solved=mine["reward"].astype(float) >= success)
    counts = solved.groupby("task_id")["solved"].agg(["size", "sum"])
    return {str(task_id): Outcomes(int(row["size"]), int(row["sum"])) for task_id, row in counts.iterrows()}


def measure_difficulty(
    episodes: Episodes, policy: str, version: str, k: int = 1, success: float = 1.0
) -> dict[str, Difficulty]:
    """One ``Difficulty`` per task that ``policy@version`` ran ok episodes on (``policy_version`` = NAME@VERSION).

    A task with fewer than ``k`` ok episodes is measured at k = n (recorded in ``Difficulty.k``): an
    unbiased pass@k needs n >= k, and a smaller k is honest where a missing record would not be.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    key = policy_key(policy, version)
    return {
        task_id: difficulty_of(outcome, k, key)
        for task_id, outcome in count_outcomes(episodes, policy, version, success).items()
    }


def difficulty_of(outcome: Outcomes, k: int, key: str) -> Difficulty:
    k_used = min(k, outcome.n)
    rate = pass_at_k(outcome.n, outcome.c, k_used)
    return Difficulty(
        tier=tier_of_measured(rate, outcome.n, outcome.c), pass_at_k=round(rate, 6), k=k_used, policy_version=key
    )


def _frame(episodes: Episodes) -> pd.DataFrame:
    if isinstance(episodes, pd.DataFrame):
        missing = [c for c in COLUMNS if c not in episodes.columns]
        if missing:
            raise ValueError(f"episodes table lacks columns {missing}; read it from the 'episodes' dataset")
        return episodes[COLUMNS]
    return pd.DataFrame([[getattr(e, c) for c in COLUMNS] for e in episodes], columns=COLUMNS)
