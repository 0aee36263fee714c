"""Per task family: could the learner fix its tasks at all, and did its pass rate move on them?

A family (``Task.family``: a synthetic task's mutation, a ticket's source kind) whose fixes lie
outside the repair policy's action space stays at 0 however well the policy learns; its ``learnable`` verdict
says so, with the commonest reason, so a flat curve there is not read as a training failure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pandas as pd

from trialforge.observe.metrics import ACCOUNTABLE, PASS_REWARD, with_split
from trialforge.rollout.reach import family_reach
from trialforge.tasks.schema import Task


def family_metrics(tasks: Sequence[Task], episodes: pd.DataFrame, learner: str) -> dict[str, dict[str, Any]]:
    """``{family: {tasks: {train, eval}, reachable, unreachable_reasons, train, heldout, learnable}}``;
    ``train`` and ``heldout`` are the learner's pass rates at the first and last iteration it has episodes of
    the family on that split (None without any)."""
    family_of = {t.task_id: t.family() for t in tasks}
    splits = Counter((family_of[t.task_id], t.split) for t in tasks)
    if episodes.empty:  # a dataset with nothing published reads back without columns
        own = pd.DataFrame(columns=["family", "split", "iteration", "status", "reward"])
    else:
        own = with_split(episodes[episodes["policy"] == learner])
        own = own.assign(family=own["task_id"].map(family_of))
    out: dict[str, dict[str, Any]] = {}
    for family, reach in family_reach(tasks).items():
        mine = own[own["family"] == family]
        out[family] = {
            "tasks": {"train": splits[family, "train"], "eval": splits[family, "eval"]},
            "reachable": reach["reachable"],
            "unreachable_reasons": reach["unreachable_reasons"],
            "train": _first_and_last(mine, "train"),
            "heldout": _first_and_last(mine, "eval"),
            "learnable": _learnable(reach),
        }
    return out


def _learnable(reach: dict[str, Any]) -> str:
    if reach["reachable"] == 0:
        return "no: " + next(iter(reach["unreachable_reasons"]))  # ordered commonest first
    if reach["reachable"] < reach["tasks"]:
        return f"partly: {reach['reachable']} of {reach['tasks']} reachable"
    return "yes"


def _first_and_last(episodes: pd.DataFrame, split: str) -> dict[str, Any] | None:
    """Pass rate (passes over the episodes the policy answers for, as ``observe.metrics``) at the first and the
    last iteration with such episodes."""
    accountable = episodes[(episodes["split"] == split) & episodes["status"].isin(ACCOUNTABLE)]
    if accountable.empty:
        return None
    passed = (accountable["status"] == "ok") & (accountable["reward"] >= PASS_REWARD)
    rates = passed.groupby(accountable["iteration"].astype(int)).mean()
    return {
        "first_iteration": int(rates.index[0]),
        "first": round(float(rates.iloc[0]), 4),
        "last_iteration": int(rates.index[-1]),
        "last": round(float(rates.iloc[-1]), 4),
    }
