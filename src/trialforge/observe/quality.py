"""The quality records of a task set, excluded tasks' included, and the share of tasks failing each gate.

A kept task carries its ``QualityRecord``; the gate's funnel carries those of the tasks it dropped
(``QualityFunnel``). ``finish_run`` gathers both and stores them next to the task set it trained on
(dataset ``quality``, partition ``task_set=VERSION``, one row per audited task), so the report, rebuilt
from the store alone, shows every audit. ``quality_metrics`` is the one place the shares are computed:
``metrics.json``, the report and ``benchmarks/quality.py`` all print its figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from trialforge.quality.gate import AUDIT_ERROR
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.tasks.quality_record import GATES, LEAK_KINDS, QualityRecord
from trialforge.tasks.schema import Task

DATASET = "quality"
CHECKS = (*GATES, AUDIT_ERROR)  # what a task can fail, in the order the report lists them
SCHEMA = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("verdict", pa.string(), nullable=False),  # pass: kept; fail: excluded
        pa.field("failed_gates", pa.list_(pa.string()), nullable=False),
        pa.field("verifier_version", pa.string(), nullable=False),
        pa.field("verifier_runs", pa.int64(), nullable=False),
        pa.field("record", pa.string(), nullable=False),  # the whole QualityRecord as JSON
    ]
)


def gather_records(tasks: Iterable[Task], funnels: Iterable[dict[str, Any]]) -> list[QualityRecord]:
    """Every audited task's record: the kept tasks' own, then the quality funnel's excluded ones."""
    kept = [t.quality for t in tasks if t.quality is not None]
    excluded = [
        QualityRecord.model_validate(r) for f in funnels if f["stage"] == "quality" for r in f.get("excluded", [])
    ]
    return kept + excluded


def write_records(store: ObjectStore, task_set: str, records: Sequence[QualityRecord]) -> None:
    """One row per record under ``task_set=VERSION``; rewriting the same task set replaces its part."""
    rows = [
        {
            "task_id": r.task_id,
            "verdict": r.verdict,
            "failed_gates": r.failed_gates,
            "verifier_version": r.verifier_version,
            "verifier_runs": r.verifier_runs,
            "record": r.model_dump_json(),
        }
        for r in records
    ]
    datasets.write_rows(store, DATASET, rows, SCHEMA, partition={"task_set": task_set}, part="all")


def read_records(store: ObjectStore, task_sets: Sequence[str]) -> list[QualityRecord]:
    """The stored records of these task sets (none when the sets were never audited or never reported)."""
    table = datasets.read_table(store, DATASET, filters={"task_set": list(task_sets)})
    if not table.num_rows:
        return []
    return [QualityRecord.model_validate_json(text) for text in table.column("record").to_pylist()]


def quality_metrics(records: Sequence[QualityRecord]) -> dict[str, Any]:
    """Tasks failing each check (a gate's share is over the tasks that ran it), leak kinds, verifier runs.

    A gate's failure is counted whether or not it is enforced (``leaks`` is reported, not enforced, by
    default); ``excluded`` counts the tasks that were dropped (per check: those of its failing tasks).
    """
    runs = sum(r.verifier_runs for r in records)
    failing = {}
    for check in CHECKS:
        ran = [r for r in records if check == AUDIT_ERROR or check in r.gates_run]
        failed = [r for r in ran if check in r.failed_gates]
        excluded = sum(r.verdict == "fail" for r in failed)
        failing[check] = {"tasks": len(failed), "share": _share(len(failed), len(ran)), "excluded": excluded}
    leak_kinds = {}
    for kind in LEAK_KINDS:
        count = sum(any(s.kind == kind for s in r.leaks) for r in records)
        leak_kinds[kind] = {"tasks": count, "share": _share(count, len(records))}
    return {
        "tasks": len(records),
        "excluded": sum(r.verdict == "fail" for r in records),
        "failing": failing,
        "leak_kinds": leak_kinds,
        "verifier_runs": runs,
        "verifier_runs_per_task": _share(runs, len(records)),
        "host_judged": host_judged_metrics(records),
    }


def host_judged_metrics(records: Sequence[QualityRecord]) -> dict[str, Any]:
    """How much of the audited tasks' verdicts the host judges (docs/verification.md): graded tests whose every
    assertion's expected value stays on the host, and assertions, summed over the tasks validation calibrated."""
    known = [r.host_judged for r in records if r.host_judged is not None]
    total = {
        field: sum(getattr(k, field) for k in known)
        for field in ("fail_to_pass", "fail_to_pass_host_judged", "pass_to_pass", "pass_to_pass_host_judged",
                      "assertions", "assertions_host_judged", "weak")
    }  # fmt: skip
    return {
        **total,
        "fail_to_pass_share": _share(total["fail_to_pass_host_judged"], total["fail_to_pass"]),
        "pass_to_pass_share": _share(total["pass_to_pass_host_judged"], total["pass_to_pass"]),
        "assertion_share": _share(total["assertions_host_judged"], total["assertions"]),
        "tasks_calibrated": len(known),
        "tasks_uncalibrated": len(records) - len(known),
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None
