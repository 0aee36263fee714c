"""The quality gate over a task set: audited tasks per minute, verifier runs per task, and the share of tasks
failing each gate.

    PYTHONPATH=src .venv/bin/python benchmarks/quality.py [--source bundled|synthesized] [--tasks N]
        [--max-mutants N] [--concurrency C] [--metrics PATH]

``bundled`` (the default) ingests tasks_src/tickets with the pipeline's own steps and validates them once
each (``validate.runs=1``); ``synthesized`` injects bugs into the repositories of tasks_src/repos
(``tasks.synthesize``, validated once each) and audits ``--tasks`` of them, drawn evenly from each
repository. Both run on a temporary object store (``open_runtime``); then the gate runs with the real
verifier in bubblewrap sandboxes. Only the gate is timed. The table lists every task's findings; the
reasons below it say what each failing task got wrong, so a person can judge the gates as well as count
them. The shares are ``observe.quality.quality_metrics``', the figures the run report shows.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import tempfile
import time
from itertools import zip_longest
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.observe.quality import quality_metrics
from trialforge.quality.gate import run_quality_gate
from trialforge.quality.settings import QualityConfig
from trialforge.runtime import Runtime, open_runtime
from trialforge.tasks.quality_record import LEAK_KINDS, QualityRecord
from trialforge.tasks.schema import Task
from trialforge.tasks.synthesize import SynthesisConfig, synthesize
from trialforge.tasks.validate import ValidateConfig

ROOT = Path(__file__).resolve().parents[1]


def run(args: argparse.Namespace, console: Console) -> tuple[dict[str, QualityRecord], float, dict]:
    """Make the task set, then time the gate; return its records, its wall time and the funnels that made it."""
    with tempfile.TemporaryDirectory(prefix="tf-bench-quality-") as tmp:
        overrides = {
            "run.store": f"file://{tmp}/store",
            "run.out_dir": f"{tmp}/out",
            "sources.tickets": str(ROOT / "tasks_src/tickets/github_issues.jsonl"),
            "sources.repos": str(ROOT / "tasks_src/repos"),
            "sources.eval_set": str(ROOT / "tasks_src/eval/heldout.jsonl"),
            "validate.runs": 1,
            "sandbox.concurrency": args.concurrency,
        }
        params = load_params(ROOT / "params.yaml", overrides)
        with open_runtime(params) as rt:
            make = synthesized_tasks if args.source == "synthesized" else bundled_tasks
            tasks, funnels = make(rt, args, console)
            console.print(f"auditing {len(tasks)} {args.source} tasks ...")
            cfg = QualityConfig(max_mutants=args.max_mutants, leak_kinds=list(LEAK_KINDS))  # every kind of leak
            start = time.perf_counter()
            _, records, _ = run_quality_gate(
                tasks, rt.grader(), rt.snapshots, cfg, seed=args.seed, concurrency=args.concurrency
            )
            wall = time.perf_counter() - start
    return records, wall, funnels


def bundled_tasks(rt: Runtime, args: argparse.Namespace, console: Console) -> tuple[list[Task], dict]:
    tasks, ingested = pipeline.ingest(rt)
    tasks, validated = pipeline.validate(rt, tasks)
    console.print(f"ingested {ingested.kept} of {ingested.seen}, validated {validated.kept}")
    return tasks, {"ingest": ingested.as_dict(), "validate": validated.as_dict()}


def synthesized_tasks(rt: Runtime, args: argparse.Namespace, console: Console) -> tuple[list[Task], dict]:
    """``args.tasks`` tasks, as evenly from each bundled repository as its validated tasks allow."""
    repos = sorted(p for p in (ROOT / "tasks_src/repos").iterdir() if p.is_dir())
    per_repo = -(-args.tasks // len(repos))
    # Candidates to screen per repository: about half of the bugs injected survive screening and validation.
    cfg = SynthesisConfig(max_total=2 * per_repo, seed=args.seed, validate=ValidateConfig(runs=1),
                          concurrency=args.concurrency)  # fmt: skip
    made, funnels = [], {}
    for repo in repos:
        tasks, funnel = synthesize(repo, repo.name, rt.backend, rt.image.name, rt.snapshots, cfg)
        random.Random(args.seed).shuffle(tasks)
        made.append(tasks)
        funnels[f"synthesize:{repo.name}"] = funnel.as_dict()
        console.print(f"synthesized {len(tasks)} validated tasks from {repo.name} ({funnel.seen} candidates)")
    drawn = [t for column in zip_longest(*made) for t in column if t is not None][: args.tasks]
    return drawn, funnels


def task_table(records: dict[str, QualityRecord]) -> Table:
    table = Table(title="Quality gate per task")
    for name in ("task", "verdict", "failed gates", "mutants", "passing", "leaks", "shortcuts scoring", "runs", "s"):
        table.add_column(name, justify="left" if name in ("task", "verdict", "failed gates", "leaks") else "right")
    for record in records.values():
        leaks = ", ".join(f"{k}×{n}" for k in LEAK_KINDS if (n := sum(s.kind == k for s in record.leaks)))
        table.add_row(
            record.task_id, record.verdict, ", ".join(record.failed_gates) or "-", str(record.mutants_tried),
            str(len(record.passing_mutants)), leaks or "-", ", ".join(s.kind for s in record.solving_shortcuts) or "-",
            str(record.verifier_runs), f"{record.duration_s:.0f}",
        )  # fmt: skip
    return table


def summary(records: dict[str, QualityRecord], wall: float) -> dict:
    figures = quality_metrics(list(records.values()))
    return figures | {
        "wall_s": round(wall, 1),
        "tasks_per_minute": round(len(records) / (wall / 60), 2) if wall else None,
        "seconds_per_verifier_run": round(wall / max(figures["verifier_runs"], 1), 2),
    }


def report(records: dict[str, QualityRecord], totals: dict, console: Console) -> None:
    console.print(task_table(records))
    console.print(f"\naudited {totals['tasks']} tasks in {totals['wall_s']:.0f}s -> {totals['tasks_per_minute']} "
                  f"tasks/minute; {totals['verifier_runs_per_task']:.2f} verifier runs per task "
                  f"({totals['seconds_per_verifier_run']}s each, wall)")  # fmt: skip
    for gate, row in totals["failing"].items():
        console.print(f"  failing {gate:<12} {row['tasks']:3d} tasks  {_pct(row['share'])}")
    for kind, row in totals["leak_kinds"].items():
        console.print(f"    leak kind {kind:<15} {row['tasks']:3d} tasks  {_pct(row['share'])}")
    console.print(f"dropped with every gate enforced: {totals['excluded']} of {totals['tasks']}\n")
    for record in records.values():
        for reason in record.reasons:
            console.print(f"[bold]{record.task_id}[/bold]: {reason}", highlight=False, markup=True)


def _pct(share: float | None) -> str:
    return "    -" if share is None else f"{100 * share:5.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=("bundled", "synthesized"), default="bundled", help="the task set")
    parser.add_argument("--tasks", type=int, default=16, help="synthesized tasks audited (bundled: all of them)")
    parser.add_argument("--max-mutants", type=int, default=8, help="wrong fixes graded per task")
    parser.add_argument("--concurrency", type=int, default=2, help="tasks audited at once (the machine is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--metrics", type=Path, help="write the summary and every record here (JSON)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind like Ctrl-C: every sandbox is closed
    console = Console()
    if not console.is_terminal:
        console.width = 160
    records, wall, funnels = run(args, console)
    totals = summary(records, wall)
    report(records, totals, console)
    if args.metrics:
        data = {"summary": totals, "funnels": funnels, "records": [r.model_dump() for r in records.values()]}
        args.metrics.write_text(json.dumps(data, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
