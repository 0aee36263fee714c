"""Failure attribution: every episode that did not end ``ok`` is blamed on exactly one party.

The status says who failed (the policy, the environment, the verifier, or the clock); the
``cause`` column says how. A cause's *kind* is its text before the first colon (sandbox faults
are recorded as ``"start: cannot start sandbox ..."``, verifier faults as
``"test_patch_does_not_apply: ..."``), so causes group without parsing free text. ``endings`` names how each
episode ended, ok ones included, for the counts of every ending by who answers for it (``rollout.endings``).
"""

from __future__ import annotations

import pandas as pd

from trialforge.errors import TrialforgeError
from trialforge.rollout.endings import ending

CATEGORIES: dict[str, str] = {
    "policy_error": "policy",
    "env_error": "environment",
    "verifier_error": "verifier",
    "timeout": "timeout",
}
COLUMNS = ["episode_id", "iteration", "task_id", "policy", "status", "category", "cause_kind", "cause"]
_KIND_MAX = 60  # a cause without a colon is free text: keep its kind short enough to group and print


class UnknownStatusError(TrialforgeError):
    """An episode row carries a status this module does not know how to attribute."""


def cause_kind(cause: str | None) -> str:
    """``"start: cannot start sandbox tf-1: ..."`` -> ``"start"``; an empty cause is ``"unknown"``."""
    kind = (cause or "").split(":", 1)[0].strip()
    return kind[:_KIND_MAX] if kind else "unknown"


def attribute(episodes: pd.DataFrame) -> pd.DataFrame:
    """One row per non-ok episode with its category and cause (columns ``COLUMNS``), in episode order."""
    if episodes.empty:
        return pd.DataFrame(columns=COLUMNS)
    failed = episodes[episodes["status"] != "ok"]
    unknown = sorted(set(failed["status"]) - set(CATEGORIES))
    if unknown:
        raise UnknownStatusError(
            f"episode statuses {unknown} have no failure category; known: ok, {', '.join(CATEGORIES)} "
            "(a newer writer? update trialforge.observe.attribution.CATEGORIES)"
        )
    table = failed.assign(
        category=failed["status"].map(CATEGORIES),
        cause_kind=failed["cause"].map(cause_kind),
        iteration=failed["iteration"].astype(int),
    )
    return table[COLUMNS].reset_index(drop=True)


def endings(episodes: pd.DataFrame) -> list[str]:
    """How each episode ended (a key of ``rollout.endings.ENDINGS``), in row order. The frame has ``final_diff``,
    or ``changed`` (whether the final diff is not empty) where the diffs were left out."""
    if episodes.empty:
        return []
    diffs = episodes["changed"] if "changed" in episodes.columns else episodes["final_diff"].fillna("") != ""
    columns = (episodes["status"], episodes["termination"].fillna(""), episodes["cause"].fillna(""), diffs)
    rows = zip(*columns, strict=True)
    return [ending(str(s), str(t), str(c), bool(d)) for s, t, c, d in rows]


def category_counts(table: pd.DataFrame) -> dict[str, int]:
    """Failures per category from ``attribute``'s table; every category is present, zero included."""
    counts = table["category"].value_counts()
    return {category: int(counts.get(category, 0)) for category in CATEGORIES.values()}
