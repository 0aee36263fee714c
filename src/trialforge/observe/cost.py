"""What episodes cost: resource-seconds, retries and tokens, per episode, per valid trajectory and per unit of
reward, by task tier and by failure cause, priced when ``observe.prices`` says what a unit costs.

The basis is what a cluster bills for, reservations: an episode holds ``sandbox.cpus`` CPUs and
``sandbox.memory_mb`` for its whole duration, so reserved CPU-seconds are ``duration_s × cpus`` and memory
GB-seconds ``duration_s × memory_mb / 1024``. Used CPU-seconds come from the sandboxes' cgroup counters; episodes
that could not be read are left out of them (``cpu_measured`` counts the rest). A valid trajectory's cost divides
everything spent by the ``ok`` episodes. Training is priced per GPU-hour of CUDA update time, inference per million
tokens. What each figure means and why: docs/observability.md, "Cost".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from trialforge.config import Params, Prices
from trialforge.observe.attribution import CATEGORIES, cause_kind

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class CostRates:
    cpus: float  # each sandbox's CPU reservation
    memory_gb: float  # and its memory reservation
    prices: Prices = field(default_factory=Prices)  # what a unit costs (observe.prices)

    @classmethod
    def from_params(cls, params: Params) -> CostRates:
        return cls(cpus=params.sandbox.cpus, memory_gb=params.sandbox.memory_mb / 1024, prices=params.observe.prices)


def episode_costs(episodes: pd.DataFrame, rates: CostRates) -> pd.DataFrame:
    """One row per episode: its resource-seconds, retries, tokens and money (columns ``_SUMMED``)."""
    held = episodes["duration_s"].astype(float)
    tokens = episodes["tokens_in"].astype(float) + episodes["tokens_out"].astype(float)
    frame = pd.DataFrame(
        {
            "sandbox_s": held,
            "reserved_cpu_s": held * rates.cpus,
            "reserved_memory_gb_s": held * rates.memory_gb,
            "used_cpu_s": _used_cpu(episodes),
            "verify_s": episodes["verify_s"].astype(float),
            "retries": (episodes["attempt"].astype(int) - 1).clip(lower=0),
            "tokens": tokens,
        },
        index=episodes.index,
    )
    frame["money"] = (
        frame["reserved_cpu_s"] / SECONDS_PER_HOUR * rates.prices.cpu_hour
        + frame["reserved_memory_gb_s"] / SECONDS_PER_HOUR * rates.prices.memory_gb_hour
        + tokens / 1e6 * rates.prices.per_million_tokens
    )
    return frame


_SUMMED = [
    "sandbox_s",
    "reserved_cpu_s",
    "used_cpu_s",
    "reserved_memory_gb_s",
    "verify_s",
    "retries",
    "tokens",
    "money",
]


def _used_cpu(episodes: pd.DataFrame) -> pd.Series:
    """Measured CPU-seconds, sandbox and verifier; NaN where either was not measured (stores before schema 4)."""
    missing = pd.Series(float("nan"), index=episodes.index)
    sandbox = pd.to_numeric(episodes.get("cpu_s", missing), errors="coerce")
    return sandbox + pd.to_numeric(episodes.get("verify_cpu_s", missing), errors="coerce")


def cost_metrics(episodes: pd.DataFrame, rates: CostRates, gpu_s: float = 0.0) -> dict[str, Any]:
    """Totals, per episode, per valid trajectory and per unit of reward; by tier and by failure cause.
    ``gpu_s``: the trainer's update seconds on CUDA, priced per GPU-hour."""
    if episodes.empty:
        return {"episodes": 0}
    costs = episode_costs(episodes, rates)
    ok = episodes["status"] == "ok"
    reward = float(episodes.loc[ok, "reward"].astype(float).sum())
    totals = _totals(costs)
    training = gpu_s / SECONDS_PER_HOUR * rates.prices.gpu_hour
    spent = totals["money"] + training
    failed = episodes[~ok]
    # used CPU per episode, valid trajectory and unit of reward: over the episodes whose use was measured
    measured = costs["used_cpu_s"].notna()
    used, n = totals["used_cpu_s"], int(measured.sum())
    measured_reward = float(episodes.loc[ok & measured, "reward"].astype(float).sum())
    billed = {k: v for k, v in totals.items() if k != "used_cpu_s"}
    if not n:
        totals["used_cpu_s"] = None  # unknown, not zero
    by_cause = failed.assign(cause_key=failed["status"].map(CATEGORIES) + ":" + failed["cause"].map(cause_kind))
    return {
        "currency": rates.prices.currency,
        "episodes": len(episodes),
        "valid": int(ok.sum()),
        "reward": _round(reward),
        "totals": totals | {"training_gpu_s": _round(gpu_s), "training_money": _round(training)},
        "money": _round(spent),
        "per_episode": {k: _round(v / len(episodes)) for k, v in billed.items()} | {"used_cpu_s": _per(used, n)},
        "per_valid_trajectory": {k: _per(v, int(ok.sum())) for k, v in billed.items()}
        | {"all_in": _per(spent, ok.sum()), "used_cpu_s": _per(used, int((ok & measured).sum()))},
        "per_unit_reward": {k: _per(v, reward) for k, v in billed.items()}
        | {"all_in": _per(spent, reward), "used_cpu_s": _per(used, measured_reward)},
        # the share of sandbox time spent on episodes that gave no valid trajectory
        "wasted_sandbox_share": _per(float(costs.loc[~ok, "sandbox_s"].sum()), totals["sandbox_s"]),
        "cpu_measured": n,
        # of the CPU reserved for the episodes whose use was measured, the share their code used
        "cpu_used_share": _per(used, float(costs.loc[measured, "reserved_cpu_s"].sum())),
        "by_tier": _grouped(episodes, costs, episodes["tier"].astype(str)),
        "by_failure": _grouped(failed, costs.loc[failed.index], by_cause["cause_key"]),
    }


def _grouped(episodes: pd.DataFrame, costs: pd.DataFrame, keys: pd.Series) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(keys.unique()):
        mine = keys == key
        valid = int((episodes.loc[mine, "status"] == "ok").sum())
        totals = _totals(costs[mine])
        out[str(key)] = {
            "episodes": int(mine.sum()),
            "valid": valid,
            "sandbox_s": totals["sandbox_s"],
            "money": totals["money"],
            "money_per_valid": _per(totals["money"], valid),
            "sandbox_s_per_valid": _per(totals["sandbox_s"], valid),
        }
    return out


def _totals(costs: pd.DataFrame) -> dict[str, float]:
    return {k: _round(float(costs[k].sum())) or 0.0 for k in _SUMMED}


def _per(value: float | None, count: float) -> float | None:
    return _round(value / count) if count and value is not None else None


def _round(value: float) -> float | None:
    """Six significant digits: a cent's fraction per episode is still a figure, not 0."""
    return None if value is None else float(f"{float(value):.6g}")


def run_costs(episodes: pd.DataFrame, rates: CostRates, updates: list[dict[str, Any]]) -> dict[str, Any]:
    """``cost_metrics`` over the run and per iteration; ``updates`` (the train step's stats) give GPU time."""
    gpu = {int(u["iteration"]): float(u["seconds"]) for u in updates if str(u.get("device", "")).startswith("cuda")}
    numbers = sorted(int(i) for i in episodes["iteration"].unique()) if not episodes.empty else []
    return {
        "overall": cost_metrics(episodes, rates, sum(gpu.values())),
        "iterations": {
            str(i): cost_metrics(episodes[episodes["iteration"].astype(int) == i], rates, gpu.get(i, 0.0))
            for i in numbers
        },
    }
