"""The run summary: metrics.json for DVC, and a table for the person who ran it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text  # free text, not markup: a reason may hold brackets


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic: DVC and readers never see half a metrics file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


def funnel_file(stage: str) -> str:
    """Where a task step's funnel (``Funnel.as_dict``: every drop with its reason) is kept, under run.out_dir."""
    return f"funnel/{stage}.json"


def write_funnels(out_dir: Path, funnels: list[dict[str, Any]]) -> None:
    for funnel in funnels:
        write_json(out_dir / funnel_file(funnel["stage"]), funnel)


def print_tasks(funnels: dict[str, Any], console: Console | None = None, footer: str = "") -> None:
    """The funnel: per task step, what it saw, kept and dropped by reason, then the first few drops of each reason
    (``observe.metrics.task_metrics``); ``footer``: a line after it."""
    console = console or Console()
    tasks = Table(title="Tasks", show_lines=False)
    for col in ("stage", "seen", "kept", "dropped (reason: count)"):
        tasks.add_column(col)
    for stage, row in funnels.items():
        dropped = ", ".join(f"{k}: {v}" for k, v in row["dropped"].items()) or "-"
        tasks.add_row(stage, str(row["seen"]), str(row["kept"]), dropped)
    console.print(tasks)
    for stage, row in funnels.items():
        if row.get("noted"):  # kept or not, what records carry a mark of (underspecified) or lost (unstable ids)
            console.print(Text(f"  {stage} noted: " + ", ".join(f"{k}: {v}" for k, v in row["noted"].items())))
        for reason, shown in row.get("examples", {}).items():
            console.print(Text(f"  {stage}/{reason}:", style="bold"))
            for line in shown:
                console.print(Text(f"    {line}"))
    if footer:
        console.print(Text(footer))


def print_summary(metrics: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    print_tasks(metrics.get("tasks", {}), console)
    judged = (metrics.get("quality") or {}).get("host_judged") or {}
    if judged.get("fail_to_pass"):
        console.print(
            f"judged on the host (expected values never in the sandbox): {judged['fail_to_pass_host_judged']} of "
            f"{judged['fail_to_pass']} fail-to-pass tests ({judged['fail_to_pass_share']:.0%}), "
            f"{judged['assertions_host_judged']} of {judged['assertions']} assertions ({judged['assertion_share']:.0%})"
        )
    eps = metrics.get("episodes", {})
    table = Table(title=f"Episodes: {eps.get('episodes', 0)}  (env error rate {eps.get('env_error_rate', 0):.1%})")
    table.add_column("policy")
    table.add_column("pass rate")
    table.add_column("by iteration")
    for label, rates, curves in (
        ("", eps.get("pass_rate", {}), eps.get("pass_rate_by_iteration", {})),
        (" (held-out)", eps.get("heldout_pass_rate", {}), eps.get("heldout_by_iteration", {})),
    ):
        for policy, rate in sorted(rates.items()):
            curve = " ".join("-" if v is None else f"{v:.2f}" for v in curves.get(policy, []))
            table.add_row(policy + label, f"{rate:.3f}", curve)
    console.print(table)
    if eps.get("endings"):
        console.print(Text(endings_line(eps["endings"])))
    if metrics.get("updates"):
        _print_health(metrics["updates"], console)
    if metrics.get("families"):
        _print_families(metrics["families"], console)
    for label, key in (
        ("task set version", "task_set_version"),
        ("episodes", "episodes_uri"),
        ("metrics", "metrics_path"),
        ("report", "report_path"),
    ):
        if key in metrics:
            console.print(f"{label}: {metrics[key]}")
    if metrics.get("tracking"):
        console.print(Text(tracking_line(metrics["tracking"])))


def endings_line(endings: dict[str, dict[str, int]]) -> str:
    """``endings: model (graded) submitted 3, context_exhausted 2; infrastructure (unknown) sandbox 1``: the causes
    that occurred, by who answers for them."""
    label = {"model": "model (graded)", "infrastructure": "infrastructure (unknown)"}
    parts = [
        f"{label.get(side, side)} " + ", ".join(f"{cause} {n}" for cause, n in causes.items() if n)
        for side, causes in endings.items()
        if any(causes.values())
    ]
    return "endings: " + "; ".join(parts)


def tracking_line(tracking: dict[str, Any]) -> str:
    """Where the run is in MLflow, or why it is not (``observe.tracking.RunTracker.summary``)."""
    run, off = tracking.get("mlflow_run_id"), tracking.get("off")
    if run is None:
        return f"tracking: off: {off}"
    where = f"MLflow run {run} (experiment {tracking['experiment']})"
    if off:
        return f"tracking: {where}, then no more: {off}"
    if tracking.get("serve"):
        return f"tracking: {where} in {tracking['uri']}; `{tracking['serve']}`, then {tracking['url']}"
    return f"tracking: {where}: {tracking['url']}"


def _print_health(updates: list[dict[str, Any]], console: Console) -> None:
    """Per iteration: did the learner train, on how much signal; then every check that warned or refused, with
    its reason on a line of its own (a table cell would fold it out of reading)."""
    table = Table(title="Learning health")
    for col in ("iteration", "decision", "informative / drawn", "zero variance", "entropy"):
        table.add_column(col)
    flagged = []
    for u in updates:
        h = u.get("health", {})
        decision = u.get("decision", "trained")  # records from before the learning gate: every one was a step
        table.add_row(
            str(u.get("iteration", "-")),
            decision,
            _of(h.get("informative_groups"), h.get("groups")),
            _num(h.get("zero_variance_share"), ".0%"),
            _num(h.get("entropy"), ".3f"),
        )
        flagged += [(u.get("iteration", "-"), v) for v in h.get("verdicts", []) if v["status"] in ("warn", "refuse")]
    console.print(table)
    for iteration, v in flagged:
        console.print(Text(f"  iteration {iteration}: {v['status']} {v['check']}: {v['reason']}"))


def _print_families(families: dict[str, dict[str, Any]], console: Console) -> None:
    """Per task family: its tasks, how many the policy can reach, the learner's pass rates first -> last; then
    why the out-of-reach ones are."""
    table = Table(title="Families (pass rate: first -> last iteration)")
    for col in ("family", "tasks train/eval", "in reach", "train", "held-out", "learnable"):
        table.add_column(col)
    for family, f in families.items():
        table.add_row(
            family,
            f"{f['tasks']['train']}/{f['tasks']['eval']}",
            str(f["reachable"]),
            first_to_last(f["train"]),
            first_to_last(f["heldout"]),
            f["learnable"].split(":", 1)[0],
        )
    console.print(table)
    for family, f in families.items():
        for reason, count in f["unreachable_reasons"].items():
            console.print(Text(f"  {family}: {count} out of reach: {reason}"))


def first_to_last(rates: dict[str, Any] | None) -> str:
    """A family's pass rates at its first and last iteration (``observe.families``), in a few words."""
    if rates is None:
        return "-"
    return f"{rates['first']:.2f} → {rates['last']:.2f}"


def _of(part: int | None, whole: int | None) -> str:
    return "-" if part is None else f"{part}/{whole}"


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
