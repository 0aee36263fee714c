"""Synthetic task ingest from the bundled repositories: the funnel, validated tasks per minute, where time goes.

    PYTHONPATH=src .venv/bin/python benchmarks/ingest.py [--max-total N] [--runs R] [--concurrency C]
                                                         [--baseline N] [--out PATH]

Synthesizes and validates tasks from tasks_src/repos/{ledgerlite,textkit,schedwise} in real bubblewrap
sandboxes, then prints the funnel per family (enumerated -> candidates -> compiled -> broke a test ->
stated -> validated, flaky-rejected), validated tasks per minute of wall time, and the time split
between sandbox lifecycle, test execution and our own host-side work (each measured around the calls,
summed over workers). ``--max-total`` is per repository; the defaults yield over 200 validated tasks.
``--out`` writes the task set as Parquet; ``--metrics`` writes the funnel as JSON.

Baseline, measured in the same run: ``--baseline N`` tasks of the first repository are validated again,
once with every task running its own fixed tree's suite and once sharing those runs (as synthesis
does: all its tasks have the original repository as their fixed tree); the ratio is the time saved.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
from trialforge.store.objstore import open_store
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.synthesize import STAGES, SynthesisConfig, SynthesisFunnel, synthesize
from trialforge.tasks.taskset import write_tasks
from trialforge.tasks.validate import SuiteRuns, ValidateConfig, validate_task

REPOS = Path(__file__).resolve().parents[1] / "tasks_src" / "repos"
BUNDLED = ("ledgerlite", "textkit", "schedwise")


def run(args: argparse.Namespace, console: Console) -> tuple[list[Task], list[tuple[str, SynthesisFunnel]]]:
    """Synthesize from every bundled repository in turn; return the tasks and each repository's funnel."""
    image = base_image()
    backend = BwrapBackend(image)
    cfg = SynthesisConfig(
        max_per_file=args.max_per_file,
        max_total=args.max_total,
        seed=args.seed,
        validate=ValidateConfig(runs=args.runs),
        concurrency=args.concurrency,
    )
    tasks: list[Task] = []
    funnels: list[tuple[str, SynthesisFunnel]] = []
    with tempfile.TemporaryDirectory(prefix="tf-bench-ingest-") as tmp:
        store = args.store or f"file://{tmp}/store"
        snapshots = SnapshotStore(open_store(store), Path(tmp) / "cache")
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        try:
            with Progress(*columns, console=console, transient=True) as bar:
                for repo in args.repos:
                    found, funnel = synthesize(
                        REPOS / repo, repo, backend, image.name, snapshots, cfg, progress=_bars(bar, repo)
                    )
                    tasks += found
                    funnels.append((repo, funnel))
                    console.print(f"{repo}: {funnel.kept} validated of {funnel.seen} candidates "
                                  f"in {funnel.timings.wall_s:.0f}s")  # fmt: skip
            if args.baseline and tasks:
                sharing_baseline(tasks, args.baseline, backend, image.name, snapshots, cfg, console)
        finally:
            backend.close()
    return tasks, funnels


def sharing_baseline(tasks: list[Task], n: int, backend: BwrapBackend, image: str, snapshots: SnapshotStore,
                     cfg: SynthesisConfig, console: Console) -> None:  # fmt: skip
    """Validate ``n`` tasks of one repository with and without shared suite runs; print both and the ratio."""
    sample = [t for t in tasks if t.repo == tasks[0].repo][:n]
    walls = []
    for shared in (None, SuiteRuns()):

        def one(task: Task, shared: SuiteRuns | None = shared) -> Task:
            return validate_task(task, backend, image, snapshots, cfg.limits, cfg.validate, shared)

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, cfg.concurrency)) as pool:
            checked = list(pool.map(one, sample))
        walls.append(time.perf_counter() - start)
        verdicts = [(t.validation.valid, t.fail_to_pass) for t in checked]
        if verdicts != [(True, t.fail_to_pass) for t in sample]:
            raise SystemExit("validation gave other verdicts on a second pass: the comparison measures nothing")
    console.print(f"baseline: {len(sample)} {sample[0].repo} tasks validated in {walls[0]:.1f}s with a suite run "
                  f"per task, {walls[1]:.1f}s sharing the fixed tree's: {walls[0] / walls[1]:.2f}x")  # fmt: skip


def _bars(bar: Progress, repo: str) -> Callable[[str, int, int], None]:
    """A progress callback drawing one bar per phase (screen, validate) of one repository."""
    ids: dict[str, TaskID] = {}

    def update(phase: str, done: int, total: int) -> None:
        if phase not in ids:
            ids[phase] = bar.add_task(f"{repo}: {phase}", total=total)
        bar.update(ids[phase], completed=done)

    return update


def family_table(funnel: SynthesisFunnel) -> Table:
    table = Table(title="Funnel per mutation family (all repositories)")
    for name in ("family", "enumerated", *STAGES, "flaky_rejected", "kept %"):
        table.add_column(name, justify="left" if name == "family" else "right")
    rows = funnel.by_family()
    for family, row in rows.items():
        table.add_row(family, *(str(row[k]) for k in ("enumerated", *STAGES, "flaky_rejected")), _pct(row))
    total = funnel.stage_totals()
    table.add_row("TOTAL", str(sum(funnel.enumerated.values())), *(str(total[s]) for s in STAGES),
                  str(funnel.dropped["flaky"]), _pct(total), style="bold")  # fmt: skip
    return table


def repo_table(funnels: list[tuple[str, SynthesisFunnel]]) -> Table:
    table = Table(title="Funnel per repository")
    for name in ("repository", *STAGES, "wall s"):
        table.add_column(name, justify="left" if name == "repository" else "right")
    for repo, funnel in funnels:
        totals = funnel.stage_totals()
        table.add_row(repo, *(str(totals[s]) for s in STAGES), f"{funnel.timings.wall_s:.0f}")
    return table


def _pct(row: dict) -> str:
    return f"{100 * row['validated'] / row['candidates']:.0f}%" if row["candidates"] else "-"


def time_report(total: SynthesisFunnel, console: Console) -> None:
    t = total.timings
    minutes = t.wall_s / 60
    console.print(f"\nvalidated tasks: {total.kept} in {minutes:.1f} min -> {total.kept / minutes:.1f} tasks/minute")
    console.print(f"wall {t.wall_s:.0f}s; busy {t.busy_s:.0f}s summed over workers, of which:")
    for label, seconds in (("sandbox lifecycle", t.sandbox_s), ("test execution", t.tests_s), ("our own", t.ours_s)):
        console.print(f"  {label:<18} {seconds:8.1f}s  {100 * seconds / max(t.busy_s, 1e-9):5.1f}%")
    console.print(f"dropped: {dict(total.dropped.most_common())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-total", type=int, default=110, help="candidates per repository (after sampling)")
    parser.add_argument("--max-per-file", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3, help="validation runs per configuration (flaky detection)")
    parser.add_argument("--concurrency", type=int, default=1, help="sandboxes at once (the machine is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", type=int, default=8, help="tasks re-validated with and without sharing")
    parser.add_argument("--repos", nargs="+", default=list(BUNDLED), choices=BUNDLED)
    parser.add_argument("--store", default="", help="object store URL for snapshots (default: a temp dir)")
    parser.add_argument("--out", type=Path, help="write the validated task set here (Parquet)")
    parser.add_argument("--metrics", type=Path, help="write the merged funnel here (JSON)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # `kill` must unwind like Ctrl-C, so every sandbox is closed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console = Console()
    if not console.is_terminal:
        console.width = 160  # a log file: do not squeeze the tables into 80 columns
    tasks, funnels = run(args, console)
    total = SynthesisFunnel.merged(f for _, f in funnels)  # walls add up: repositories ran one after another
    console.print(repo_table(funnels))
    console.print(family_table(total))
    time_report(total, console)
    if args.out:
        version = write_tasks(args.out, tasks)
        console.print(f"wrote {len(tasks)} tasks to {args.out} (task-set version {version})")
    if args.metrics:
        args.metrics.write_text(json.dumps(total.as_dict(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
