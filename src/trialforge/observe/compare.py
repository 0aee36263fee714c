"""Compare two runs metric by metric, from their stored episodes alone."""

from __future__ import annotations

from typing import Any, NamedTuple

from trialforge.observe.metrics import DISTRIBUTIONS, run_metrics
from trialforge.store.objstore import ObjectStore

_FINAL = ("pass_rate", "mean_reward")  # what learning is judged by: compared at each run's last iteration too


class MetricDelta(NamedTuple):
    metric: str
    a: float | None
    b: float | None
    delta: float | None  # b - a; None when either side lacks the metric


def compare_runs(store: ObjectStore, run_a: str, run_b: str) -> list[MetricDelta]:
    return compare_metrics(run_metrics(store, run_a), run_metrics(store, run_b))


def compare_metrics(a: dict[str, Any], b: dict[str, Any]) -> list[MetricDelta]:
    """Every numeric metric of either run (A's order, then metrics only B has)."""
    flat_a, flat_b = scalar_metrics(a), scalar_metrics(b)
    rows = []
    for name in flat_a | flat_b:
        va, vb = flat_a.get(name), flat_b.get(name)
        delta = None if va is None or vb is None else round(vb - va, 6)
        rows.append(MetricDelta(name, va, vb, delta))
    return rows


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float | None]:
    """Overall metrics flattened to dotted names (distributions left out), plus the final iteration's curves."""
    flat = scalar_leaves(metrics["overall"])
    final = metrics["iterations"][max(metrics["iterations"], key=int)]
    for key in _FINAL:
        flat |= scalar_leaves(final.get(key, {}), f"final.{key}.")
    return flat


def scalar_leaves(node: dict[str, Any], prefix: str = "", *, bools: bool = False) -> dict[str, float | None]:
    """The numbers of a nested metrics dict under dotted names (``latency.exec_s.p90``), distributions and lists
    left out; ``bools``: flags too, as 0 and 1 (the MLflow tracker logs a step's ``in_band``)."""
    flat: dict[str, float | None] = {}
    for key, value in node.items():
        if key in DISTRIBUTIONS:
            continue
        if isinstance(value, dict):
            flat |= scalar_leaves(value, f"{prefix}{key}.", bools=bools)
        elif isinstance(value, bool):
            if bools:
                flat[prefix + key] = int(value)
        elif value is None or isinstance(value, int | float):
            flat[prefix + key] = value
    return flat


def format_comparison(rows: list[MetricDelta], run_a: str, run_b: str) -> str:
    """A plain-text table, one metric per line: metric, A, B, B - A."""
    header = ("metric", run_a, run_b, "delta")
    cells = [header] + [(r.metric, _num(r.a), _num(r.b), _num(r.delta, signed=True)) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:+d}" if signed else str(value)
    return f"{value:+.4g}" if signed else f"{value:.4g}"
