"""The run summary: metrics.json for DVC, and a table for the person who ran it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic: DVC and readers never see half a metrics file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


def print_summary(metrics: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    tasks = Table(title="Tasks", show_lines=False)
    for col in ("stage", "seen", "kept", "dropped (reason: count)"):
        tasks.add_column(col)
    for stage, row in metrics.get("tasks", {}).items():
        dropped = ", ".join(f"{k}: {v}" for k, v in row["dropped"].items()) or "-"
        tasks.add_row(stage, str(row["seen"]), str(row["kept"]), dropped)
    console.print(tasks)
    eps = metrics.get("episodes", {})
    table = Table(title=f"Episodes: {eps.get('episodes', 0)}  (env error rate {eps.get('env_error_rate', 0):.1%})")
    table.add_column("policy")
    table.add_column("pass rate")
    table.add_column("by iteration")
    for policy, rate in sorted(eps.get("pass_rate", {}).items()):
        curve = " ".join(f"{v:.2f}" if v is not None else "-" for v in eps["pass_rate_by_iteration"].get(policy, []))
        table.add_row(policy, f"{rate:.3f}", curve)
    console.print(table)
    for label, key in (
        ("task set version", "task_set_version"),
        ("episodes", "episodes_uri"),
        ("metrics", "metrics_path"),
        ("report", "report_path"),
    ):
        if key in metrics:
            console.print(f"{label}: {metrics[key]}")
