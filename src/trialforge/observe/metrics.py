"""Run metrics computed from the episode and step tables read back from the store (one source of truth).

``episode_metrics`` and ``task_metrics`` feed the printed summary; ``run_metrics`` computes the process metrics of
every iteration and of the run overall. An episode *passes* when it ended ``ok`` with reward >= ``PASS_REWARD``; a
pass rate is over the episodes the policy answers for (``ok``, ``timeout``, ``policy_error``), never infrastructure
failures; *mean reward* is over ``ok`` episodes; ``pass_rate`` is over train-split tasks, ``heldout_pass_rate`` over
eval-split ones. Latencies, zero-variance groups and throughput: docs/observability.md,
"How the metrics are defined".
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pandas as pd

from trialforge.errors import TrialforgeError
from trialforge.observe.attribution import attribute, category_counts, endings
from trialforge.observe.summary import write_json
from trialforge.rollout.endings import counts_by_side
from trialforge.rollout.env import TOOL_NAMES
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import Status

PASS_REWARD = 1.0
STATUSES: tuple[str, ...] = get_args(Status)
ACCOUNTABLE = ("ok", "timeout", "policy_error")  # outcomes the policy answers for
SANDBOX_TOOLS = sorted(TOOL_NAMES - {"submit"})  # submit never reaches the sandbox: its exec_s is 0 by design
PERCENTILES = (50, 90, 99)
CDF_QUANTILES = tuple(round(i / 20, 2) for i in range(21))
LATENCIES = ("sandbox_s", "exec_s", "verify_s")
REWARD_BINS = 10  # equal bins over [0, 1]
DISTRIBUTIONS = frozenset({"reward_hist", "steps_hist", "tool_calls_hist", "latency_cdf"})  # not scalars
_DIGITS = 6
_EPISODE_COLUMNS = [
    "episode_id", "iteration", "task_id", "tier", "policy", "group_id", "attempt", "status", "cause", "termination",
    "reward", "integrity_flags", "steps", "tool_calls", "tokens_in", "tokens_out", "duration_s", "sandbox_s",
    "verify_s", "split", "changed",
]  # fmt: skip
_STEP_COLUMNS = ["iteration", "tool", "exec_s"]


class RunNotFoundError(TrialforgeError):
    """The store holds no episodes for the requested run (or iteration)."""


@dataclass(frozen=True)
class IterationTiming:
    """What only the orchestrator knows about an iteration; every field optional."""

    wall_s: float | None = None  # wall-clock seconds of the iteration's rollout
    trainer_idle: float | None = None  # fraction of the iteration the trainer waited for rollouts
    rollout_idle: float | None = None  # fraction of the iteration rollout workers waited for the trainer


@dataclass(frozen=True)
class RunData:
    run_id: str
    episodes: pd.DataFrame
    steps: pd.DataFrame


# --- the summary's metrics (kept for observe.run_report) ------------------------------------


def episode_metrics(episodes: pd.DataFrame) -> dict[str, Any]:
    """Mean reward of ok episodes per policy, on train tasks and (``heldout``) on eval tasks, per iteration."""
    if episodes.empty:
        return {"episodes": 0}
    episodes = with_split(episodes)
    ok = episodes[episodes["status"] == "ok"]
    iterations = sorted(episodes["iteration"].astype(int).unique())

    def curves(frame: pd.DataFrame) -> dict[str, list[float | None]]:
        table = frame.assign(iteration=frame["iteration"].astype(int)).groupby(["policy", "iteration"])["reward"].mean()
        table = table.round(4).unstack("iteration").reindex(columns=iterations)
        return {str(p): [None if pd.isna(v) else float(v) for v in row.to_list()] for p, row in table.iterrows()}

    train, held_out = ok[ok["split"] == "train"], ok[ok["split"] == "eval"]
    return {
        "episodes": len(episodes),
        "status_counts": episodes["status"].value_counts().to_dict(),
        "env_error_rate": round(float((episodes["status"] == "env_error").mean()), 4),
        "pass_rate": train.groupby("policy")["reward"].mean().round(4).to_dict(),
        "pass_rate_by_iteration": curves(train),
        "heldout_pass_rate": held_out.groupby("policy")["reward"].mean().round(4).to_dict(),
        "heldout_by_iteration": curves(held_out),
        "mean_steps": round(float(episodes["steps"].mean()), 3),
        "retries": int((episodes["attempt"] > 1).sum()),
        "endings": counts_by_side(endings(episodes)),
    }


def with_split(episodes: pd.DataFrame) -> pd.DataFrame:
    """Rows written before episodes carried their split were all train episodes."""
    if "split" in episodes.columns:
        return episodes.assign(split=episodes["split"].fillna("train"))
    return episodes.assign(split="train")


DROP_EXAMPLES = 3  # details kept per drop reason: what was wrong, e.g. a validation's first error line
DROP_DETAIL_CAP = 300


def task_metrics(funnels: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task stage: seen, kept, dropped by reason, the first details of each reason, and what records lost on the
    way (``noted``) (from Funnel.as_dict())."""
    return {
        f["stage"]: {
            "seen": f["seen"],
            "kept": f["kept"],
            "dropped": f["dropped"],
            "examples": _drop_examples(f),
            "noted": f.get("noted", {}),  # (a funnel stored before it counted them has none)
        }
        for f in funnels
    }


def _drop_examples(funnel: dict[str, Any]) -> dict[str, list[str]]:
    examples: dict[str, list[str]] = {}
    for detail in funnel.get("details", []):
        shown = examples.setdefault(str(detail.get("reason", "")), [])
        if detail.get("detail") and len(shown) < DROP_EXAMPLES:
            shown.append(f"{detail.get('ref', '?')}: {str(detail['detail'])[:DROP_DETAIL_CAP]}")
    return {reason: shown for reason, shown in examples.items() if shown}


# --- process metrics ------------------------------------------------------------------------


def load_run(store: ObjectStore, run_id: str, iteration: int | None = None) -> RunData:
    """The run's episode and step rows (one iteration's when given), straight from the stored Parquet."""
    filters: datasets.Filters = {"run": run_id}
    if iteration is not None:
        filters["iteration"] = str(iteration)
    episodes = datasets.read_pandas(store, "episodes", filters=filters)
    if episodes.empty:
        what = f"run {run_id!r}" + ("" if iteration is None else f" iteration {iteration}")
        raise RunNotFoundError(
            f"no episodes of {what} in {store.uri('datasets/episodes')}: check the run id and the store URL"
        )
    return RunData(run_id, episodes, datasets.read_pandas(store, "steps", filters=filters))


def run_metrics(store: ObjectStore, run_id: str, timing: dict[int, IterationTiming] | None = None) -> dict[str, Any]:
    data = load_run(store, run_id)
    return {"run_id": run_id, **process_metrics(data.episodes, data.steps, timing)}


def process_metrics(
    episodes: pd.DataFrame, steps: pd.DataFrame, timing: dict[int, IterationTiming] | None = None
) -> dict[str, Any]:
    """``{"iterations": {"0": {...}, ...}, "overall": {...}}``; ``timing`` is keyed by iteration."""
    timing = timing or {}
    episodes = with_split(episodes).assign(changed=episodes["final_diff"].fillna("") != "")[
        _EPISODE_COLUMNS
    ]  # the wide text columns (diffs, reports) only slow every selection down
    steps = steps if steps.empty else steps[_STEP_COLUMNS]
    numbers = sorted(int(i) for i in episodes["iteration"].unique())
    iterations = {
        str(i): iteration_metrics(_of_iteration(episodes, i), _of_iteration(steps, i), timing.get(i)) for i in numbers
    }
    overall = iteration_metrics(episodes, steps, _combined([timing[i] for i in numbers if i in timing], len(numbers)))
    return {"iterations": iterations, "overall": overall}


def iteration_metrics(
    episodes: pd.DataFrame, steps: pd.DataFrame, timing: IterationTiming | None = None
) -> dict[str, Any]:
    """Every process metric of one batch of episodes (and their steps)."""
    n = len(episodes)
    if n == 0:
        return {"episodes": 0}
    status = episodes["status"]
    train = episodes[episodes["split"] == "train"] if "split" in episodes.columns else episodes
    failures = attribute(episodes)
    env = failures[failures["category"] == "environment"]
    metrics: dict[str, Any] = {
        "episodes": n,
        "status_counts": {s: int((status == s).sum()) for s in STATUSES},
        "failures": category_counts(failures),
        "env_error_rate": _ratio(len(env), n),
        "env_error_rate_by_cause": {kind: _ratio(c, n) for kind, c in _counts(env["cause_kind"]).items()},
        "verifier_error_rate": _ratio(int((status == "verifier_error").sum()), n),
        "retried_episodes": int((episodes["attempt"] > 1).sum()),
        "retries": int((episodes["attempt"] - 1).clip(lower=0).sum()),
        "termination": _counts(episodes["termination"]),
        "endings": counts_by_side(endings(episodes)),  # who answers for each: model (graded) or infrastructure
        "mean_reward": _mean_by(episodes[status == "ok"], "policy", "reward"),
        "pass_rate": _pass_rate(train, ["policy"]),
        "heldout_pass_rate": _pass_rate(episodes[episodes["split"] == "eval"], ["policy"]),
        "pass_rate_by_tier": _pass_rate(train, ["tier"]),
        "pass_rate_by_policy_tier": _pass_rate(train, ["policy", "tier"]),
        "reward_hist": _reward_hist(episodes.loc[status == "ok", "reward"]),
        "steps": _mean(episodes["steps"]),
        "steps_hist": _counts(episodes["steps"].astype(int), by_value=True),
        "tool_calls": _mean(episodes["tool_calls"]),
        "tool_calls_hist": _counts(episodes["tool_calls"].astype(int), by_value=True),
        "tokens_in": _sum_by(episodes, "policy", "tokens_in"),  # prompt tokens (0 for scripted policies)
        "tokens_out": _sum_by(episodes, "policy", "tokens_out"),
        "zero_variance_groups": _zero_variance(episodes[status == "ok"]),
        "integrity_flags": _integrity(episodes),
        "throughput": _throughput(episodes, timing),
    }
    latencies = _latencies(episodes, steps)
    metrics["latency"] = {name: _percentiles(values) for name, values in latencies.items()}
    metrics["latency_cdf"] = {"quantiles": list(CDF_QUANTILES)} | {
        name: _quantiles(values, CDF_QUANTILES) for name, values in latencies.items()
    }
    if timing is not None:
        metrics["idle"] = {"trainer": timing.trainer_idle, "rollout": timing.rollout_idle}
    return metrics


def _of_iteration(frame: pd.DataFrame, iteration: int) -> pd.DataFrame:
    """A dataset with nothing published reads back without columns: it has no rows of any iteration."""
    return frame if frame.empty else frame[frame["iteration"].astype(int) == iteration]


def _combined(timings: list[IterationTiming], iterations: int) -> IterationTiming | None:
    """The run's timing: wall times add up (only when every iteration has one); idle fractions average."""
    if not timings:
        return None
    walls = [t.wall_s for t in timings if t.wall_s is not None]
    return IterationTiming(
        wall_s=sum(walls) if len(walls) == iterations else None,
        trainer_idle=_mean_of([t.trainer_idle for t in timings]),
        rollout_idle=_mean_of([t.rollout_idle for t in timings]),
    )


def _latencies(episodes: pd.DataFrame, steps: pd.DataFrame) -> dict[str, pd.Series]:
    graded = episodes["status"].isin(["ok", "verifier_error"]) | (episodes["verify_s"] > 0)
    sandbox_steps = steps if steps.empty else steps[steps["tool"].isin(SANDBOX_TOOLS)]
    return {
        "sandbox_s": episodes.loc[episodes["sandbox_s"] > 0, "sandbox_s"],  # 0: the sandbox never started
        "exec_s": pd.Series(dtype=float) if sandbox_steps.empty else sandbox_steps["exec_s"],
        "verify_s": episodes.loc[graded, "verify_s"],
    }


def _pass_rate(episodes: pd.DataFrame, keys: list[str]) -> dict[str, Any]:
    """Passes over accountable episodes, per value of ``keys`` (nested dicts for two keys)."""
    accountable = episodes[episodes["status"].isin(ACCOUNTABLE)]
    passed = (accountable["status"] == "ok") & (accountable["reward"] >= PASS_REWARD)
    rates = passed.groupby([accountable[k] for k in keys]).mean()
    if len(keys) == 1:
        return {str(k): _round(v) for k, v in rates.items()}
    nested: dict[str, dict[str, float]] = {}
    for (outer, inner), value in rates.items():
        nested.setdefault(str(outer), {})[str(inner)] = _round(value)
    return nested


def _reward_hist(rewards: pd.Series) -> dict[str, list]:
    """Equal bins over [0, 1]; the last bin includes 1.0 (numpy's convention)."""
    counts, edges = np.histogram(rewards.dropna().clip(0.0, 1.0), bins=REWARD_BINS, range=(0.0, 1.0))
    return {"edges": [_round(e) for e in edges], "counts": [int(c) for c in counts]}


def _zero_variance(ok: pd.DataFrame) -> dict[str, Any]:
    distinct = ok.groupby([ok["iteration"].astype(int), ok["policy"], ok["group_id"]])["reward"].nunique()
    flat = (distinct <= 1).rename("flat").reset_index()
    return {
        "groups": len(flat),
        "zero_variance": int(flat["flat"].sum()),
        "fraction": _ratio(int(flat["flat"].sum()), len(flat)),
        "by_policy": {str(p): _round(v) for p, v in flat.groupby("policy")["flat"].mean().items()},
    }


def _integrity(episodes: pd.DataFrame) -> dict[str, Any]:
    """Episodes per flag kind (``edits_test_or_config:tests/x.py`` counts as ``edits_test_or_config``).

    ``tampered`` episodes are those whose graded run showed runtime evidence of tampering (reward 0),
    counted per kind of evidence (``tampered:canary_passed:mutated_copy`` counts as ``canary_passed``).
    """
    flags = episodes["integrity_flags"].fillna("[]").map(json.loads)
    kinds = flags.map(lambda found: {f.split(":", 1)[0] for f in found})
    flagged = kinds.map(bool)
    passed = (episodes["status"] == "ok") & (episodes["reward"] >= PASS_REWARD)
    per_kind = Counter(kind for found in kinds for kind in found)
    evidence = flags.map(lambda found: {f.split(":")[1] for f in found if f.startswith("tampered:") and ":" in f})
    return {
        "flagged_episodes": int(flagged.sum()),
        "flagged_passes": int((flagged & passed).sum()),
        "counts": dict(sorted(per_kind.items())),
        "tampered_episodes": int(evidence.map(bool).sum()),
        "tampered_evidence": dict(sorted(Counter(e for found in evidence for e in found).items())),
    }


def _throughput(episodes: pd.DataFrame, timing: IterationTiming | None) -> dict[str, Any]:
    if timing is not None and timing.wall_s:
        return {"episodes_per_s": _round(len(episodes) / timing.wall_s), "basis": "wall"}
    busy = float(episodes["duration_s"].sum())
    return {"episodes_per_s": _round(len(episodes) / busy) if busy > 0 else None, "basis": "episode_duration"}


# --- small numeric helpers --------------------------------------------------------------------


def _round(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else round(float(value), _DIGITS)


def _ratio(part: int, whole: int) -> float | None:
    return _round(part / whole) if whole else None


def _mean_of(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return _round(sum(present) / len(present)) if present else None


def _mean(values: pd.Series) -> dict[str, Any]:
    return {"mean": _round(values.mean()), "max": int(values.max())}


def _mean_by(frame: pd.DataFrame, key: str, column: str) -> dict[str, float | None]:
    return {str(k): _round(v) for k, v in frame.groupby(key)[column].mean().items()}


def _sum_by(frame: pd.DataFrame, key: str, column: str) -> dict[str, int]:
    return {str(k): int(v) for k, v in frame.groupby(key)[column].sum().items()}


def _counts(values: pd.Series, by_value: bool = False) -> dict[str, int]:
    """Counts with string keys (JSON), ordered by value when ``by_value``, else by count."""
    counts = values.value_counts()
    if by_value:
        counts = counts.sort_index()
    return {str(k): int(v) for k, v in counts.items()}


def _percentiles(values: pd.Series) -> dict[str, Any]:
    found = _quantiles(values, tuple(p / 100 for p in PERCENTILES))
    return {"n": int(values.notna().sum())} | {f"p{p}": found[i] if found else None for i, p in enumerate(PERCENTILES)}


def _quantiles(values: pd.Series, quantiles: tuple[float, ...]) -> list[float]:
    """Linear-interpolated quantiles (numpy's default); empty when there are no values."""
    data = values.dropna().to_numpy(dtype=float)
    return [_round(q) for q in np.quantile(data, quantiles)] if len(data) else []


# --- outputs ------------------------------------------------------------------------------------


def plot_tables(metrics: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """The DVC plot data of ``run_metrics``' output, as tidy tables named for their files."""
    iterations = metrics["iterations"]
    pass_rate = [
        {"iteration": int(i), "policy": policy, "split": split, "pass_rate": rate}
        for i, m in iterations.items()
        for split, key in (("train", "pass_rate"), ("eval", "heldout_pass_rate"))
        for policy, rate in m.get(key, {}).items()
    ]
    reward = [
        {"iteration": int(i), "bin_lo": edges[b], "bin_hi": edges[b + 1], "count": count}
        for i, m in iterations.items()
        if "reward_hist" in m
        for edges in [m["reward_hist"]["edges"]]
        for b, count in enumerate(m["reward_hist"]["counts"])
    ]
    steps = [
        {"iteration": int(i), "steps": int(value), "count": count}
        for i, m in iterations.items()
        for value, count in m.get("steps_hist", {}).items()
    ]
    cdf = metrics["overall"].get("latency_cdf", {"quantiles": []})
    latency = pd.DataFrame(
        {"quantile": cdf["quantiles"]}
        | {name: cdf[name] or [None] * len(cdf["quantiles"]) for name in LATENCIES if name in cdf}
    )
    return {
        "pass_rate": pd.DataFrame(pass_rate, columns=["iteration", "policy", "split", "pass_rate"]),
        "reward_hist": pd.DataFrame(reward, columns=["iteration", "bin_lo", "bin_hi", "count"]),
        "latency_cdf": latency,
        "steps_hist": pd.DataFrame(steps, columns=["iteration", "steps", "count"]),
    }


def write_metrics(out_dir: Path, metrics: dict[str, Any]) -> list[Path]:
    """``metrics.json`` (DVC metrics) and ``plots/*.csv`` (DVC plots); returns the paths written."""
    out_dir = Path(out_dir)
    write_json(out_dir / "metrics.json", metrics)
    written = [out_dir / "metrics.json"]
    for name, table in plot_tables(metrics).items():
        path = out_dir / "plots" / f"{name}.csv"
        write_text(path, table.to_csv(index=False))
        written.append(path)
    return written


def write_text(path: Path, text: str) -> None:
    """Atomic, like ``write_json``: a reader (DVC, a browser) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
