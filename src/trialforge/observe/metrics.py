"""Run metrics computed from the episode table (read back from the store: one source of truth)."""

from __future__ import annotations

from typing import Any

import pandas as pd



def episode_metrics(episodes: pd.DataFrame) -> dict[str, Any]:
    if episodes.empty:
        return {"episodes": 0}
    ok = episodes[episodes["status"] == "ok"]
    by_policy = ok.groupby("policy")["reward"].mean().round(4).to_dict()
    by_iteration = (
        ok.assign(iteration=ok["iteration"].astype(int))
        .groupby(["policy", "iteration"])["reward"]
        .mean()
        .round(4)
        .unstack("iteration")
    )
    return {
        "episodes": len(episodes),
        "status_counts": episodes["status"].value_counts().to_dict(),
        "env_error_rate": round(float((episodes["status"] == "env_error").mean()), 4),
        "pass_rate": by_policy,
        "pass_rate_by_iteration": {
            policy: [None if pd.isna(v) else float(v) for v in row.to_list()] for policy, row in by_iteration.iterrows()
        },
        "mean_steps": round(float(episodes["steps"].mean()), 3),
        "retries": int((episodes["attempt"] > 1).sum()),
    }


def task_metrics(funnels: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task stage: seen, kept and dropped by reason (from Funnel.as_dict())."""
    return {f["stage"]: {"seen": f["seen"], "kept": f["kept"], "dropped": f["dropped"]} for f in funnels}
