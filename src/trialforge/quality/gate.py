"""The quality gate: audit each task, keep one ``QualityRecord`` per task, drop the tasks that fail.

Per task: the gold patch goes through the real verifier first (the control: if it does not score 1,
no other grading says anything and the task fails with ``audit_error``); then the weak-test audit,
the leak check and the shortcut audit run as ``cfg.gates`` asks, and ``underspecified`` reads what validation found
the statement never states (``tasks.underspecified``). A gate that finds a problem is named
in ``failed_gates``; the task is dropped when one of them is in ``cfg.enforce``. Once it has failed an enforced
gate nothing could keep it, so the verifier runs still to come are not spent: the weak-test audit stops at its
first passing wrong fix, and the audits after it are recorded as skipped, with why. A verifier run that
could not decide (infrastructure fault, verifier error) also fails the task as ``audit_error``: an
unaudited task is not a passed one, and the funnel says which it was so a rerun can pick it up.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trialforge.errors import PatchError
from trialforge.funnel import Funnel
from trialforge.progress import tracked_map
from trialforge.quality.change import Change
from trialforge.quality.leaks import find_leaks
from trialforge.quality.probe import Probe
from trialforge.quality.settings import QualityConfig
from trialforge.quality.shortcuts import audit_shortcuts
from trialforge.quality.weak_tests import audit_tests
from trialforge.scratch import scratch_dir
from trialforge.tasks.host_judged import HostJudged
from trialforge.tasks.quality_record import Attempt, Gate, QualityRecord
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.verify.grader import VERIFIER_VERSION, Grader

log = logging.getLogger(__name__)

AUDIT_ERROR = "audit_error"
HOST_JUDGED = "host_judged"  # enforced whenever quality.min_host_judged asks for a share


@dataclass
class QualityFunnel(Funnel):
    """The gate's funnel also carries the whole record of every task it dropped.

    A kept task carries its record on the task; a dropped one would take its record (the wrong fix that
    passed, the leak spans, the shortcut that solved it) with it. The funnel travels wherever a step's
    funnel goes (``out/funnel/quality.json``, the run's record, ``finish_run``), so the report finds them.
    """

    excluded: list[QualityRecord] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return super().as_dict() | {"excluded": [r.model_dump(mode="json") for r in self.excluded]}


def run_quality_gate(
    tasks: list[Task],
    grader: Grader,
    snapshots: SnapshotStore,
    cfg: QualityConfig,
    *,
    seed: int = 0,
    concurrency: int = 1,
) -> tuple[list[Task], dict[str, QualityRecord], QualityFunnel]:
    """Audit every task (``concurrency`` at a time; each audit grades one candidate at a time); return the kept
    tasks, every record by task id, the funnel. ``seed``: the order in which mutation families are sampled."""

    def one(task: Task) -> QualityRecord:
        return audit_task(task, grader, snapshots, cfg, seed)

    records = tracked_map("quality gate", one, tasks, concurrency)
    funnel = QualityFunnel("quality")
    kept = []
    for task, record in zip(tasks, records, strict=True):
        if record.verdict == "pass":
            funnel.keep()
            kept.append(task)
        else:
            blocking = [g for g in record.failed_gates if g in (AUDIT_ERROR, HOST_JUDGED) or g in cfg.enforce]
            funnel.drop(task.task_id, blocking[0], "; ".join(record.reasons))
            funnel.excluded.append(record)
    return kept, {r.task_id: r for r in records}, funnel


def audit_task(
    task: Task, grader: Grader, snapshots: SnapshotStore, cfg: QualityConfig, seed: int = 0
) -> QualityRecord:
    """Run ``cfg.gates`` on one task and judge it."""
    start = time.monotonic()
    record = QualityRecord(task_id=task.task_id, gates_run=list(cfg.gates), verifier_version=VERIFIER_VERSION,
                           host_judged=task.validation.host_judged)  # fmt: skip
    if "underspecified" in cfg.gates and task.statement is not None:  # validation's check: no verifier run
        record.underspecified = [*task.statement.missing_exceptions, *map(repr, task.statement.missing_literals)]
    blinded = host_judged_problem(task, cfg)
    if blinded:  # nothing could keep it: no verifier run is spent on it
        return _judged(record, [blinded, *_problems(record)], cfg, start)
    with scratch_dir("quality") as tmp:
        base = snapshots.materialize(task.snapshot)
        try:
            gold = Change.apply(base, task.gold_patch, Path(tmp) / "gold")
            tests = Change.apply(base, task.test_patch, Path(tmp) / "tests")
        except PatchError as exc:
            return _judged(record, [f"{AUDIT_ERROR}: {exc}"], cfg, start)
        if "leaks" in cfg.gates:
            record.leaks = find_leaks(task, gold, tests, cfg.leak_kinds)
        if {"weak_tests", "shortcuts"} & set(cfg.gates) and not _skipped(record, cfg, "weak_tests", "shortcuts"):
            probe = Probe(task, grader, base, Path(tmp))
            record.control = probe.grade("gold", "the gold patch", gold.texts())
            if record.control.scores:
                limit = max(cfg.min_timeout_s, cfg.timeout_factor * record.control.duration_s)
                record.candidate_timeout_s = probe.limit_tests(limit)
                if "weak_tests" in cfg.gates:
                    record.mutants = audit_tests(gold, probe, max_mutants=cfg.max_mutants, seed=seed,
                                                 stop_at_pass="weak_tests" in cfg.enforce)  # fmt: skip
                if "shortcuts" in cfg.gates and not _skipped(record, cfg, "shortcuts"):
                    record.shortcuts = audit_shortcuts(gold, probe)
            record.verifier_runs = probe.runs
    return _judged(record, _problems(record), cfg, start)


def host_judged_problem(task: Task, cfg: QualityConfig) -> str:
    """The ``host_judged`` problem of a task whose verdict the test process decides too much of ("" if none): read
    from its validation record alone, so it costs no verifier run."""
    known = task.validation.host_judged
    unknown = "" if known else " (not calibrated: validated before blinding)"
    if cfg.require_host_judged and not (known and known.fail_to_pass_anchored):
        return (f"{HOST_JUDGED}: no fail-to-pass test has an assertion the host judges with a value no one could "
                f"guess{unknown}: a forged report would need no right value (quality.require_host_judged)"
                f"{_why(known) if known else ''}")  # fmt: skip
    if cfg.require_host_judged and known.fail_to_pass_anchored < known.fail_to_pass:
        # A policy that fixes what the anchored tests check could forge the verdicts of the others in process (a
        # hypothesis engine steered from the package, a test-aware helper): every test must need a value of its own.
        loose = known.fail_to_pass - known.fail_to_pass_anchored
        return (f"{HOST_JUDGED}: {loose} of {known.fail_to_pass} fail-to-pass tests have no assertion the host "
                f"judges with a value no one could guess: their verdicts could be forged beside an honest fix of the "
                f"others (quality.require_host_judged){_why(known)}")  # fmt: skip
    opened = task.validation.baseline_evidence
    if cfg.require_host_judged and opened and known and known.fail_to_pass_host_judged < known.fail_to_pass:
        # The repository's own code trips detectors (testrun/baseline.py), so a policy's use of the same calls is no
        # evidence: a verdict the test process decides could be bought through that blind spot; the host's could not.
        return (f"{HOST_JUDGED}: the repository's own code opens detector blind spots ({', '.join(opened[:3])}), so "
                f"every fail-to-pass test must be judged on the host; {known.fail_to_pass_host_judged} of "
                f"{known.fail_to_pass} are (quality.require_host_judged)")  # fmt: skip
    share = known.fail_to_pass_share if known else 0.0
    if cfg.min_host_judged <= 0 or share >= cfg.min_host_judged:
        return ""
    return (f"{HOST_JUDGED}: {share:.0%} of the fail-to-pass tests are judged on the host{unknown}, "
            f"below quality.min_host_judged {cfg.min_host_judged:.0%}")  # fmt: skip


def _why(known: HostJudged) -> str:
    """The first unanchored tests, each with why (``HostJudged.unanchored``)."""
    shown = [f"{test_id}: {why}" for test_id, why in list(known.unanchored.items())[:3]]
    more = len(known.unanchored) - len(shown)
    return f"; {'; '.join(shown)}{f'; and {more} more' if more > 0 else ''}" if shown else ""


def _skipped(record: QualityRecord, cfg: QualityConfig, *gates: Gate) -> bool:
    """Whether the task already failed an enforced gate: then it is dropped whatever ``gates`` would find, and they
    are recorded as not run (with why) instead of spending verifier runs on it."""
    checked = (("underspecified", record.underspecified), ("leaks", record.leaks),
               ("weak_tests", record.passing_mutants))  # fmt: skip
    failed = [g for g, found in checked if found and g in cfg.enforce]
    if not failed:
        return False
    for gate in gates:
        if gate in record.gates_run:
            record.gates_run.remove(gate)
            record.skipped[gate] = f"the task had already failed {failed[0]}, which is enforced"
    return True


def _problems(record: QualityRecord) -> list[str]:
    """One ``gate: what was wrong`` line per failed check."""
    problems = []
    control = record.control
    if control is not None and not control.scores:
        problems.append(f"{AUDIT_ERROR}: the gold patch does not score 1 with the verifier "
                        f"(reward {control.reward}, {control.status}: {control.reason})")  # fmt: skip
    undecided = [a for a in [*record.mutants, *record.shortcuts] if a.undecided]
    if undecided:
        problems.append(f"{AUDIT_ERROR}: {len(undecided)} verifier run(s) did not decide, e.g. "
                        f"{undecided[0].kind}: {undecided[0].status}: {undecided[0].reason}")  # fmt: skip
    record.weak = bool(record.passing_mutants)
    if record.weak:
        shown = "; ".join(_label(m) for m in record.passing_mutants[:3])
        problems.append(f"weak_tests: {len(record.passing_mutants)} of {record.mutants_tried} wrong fixes "
                        f"score 1 ({shown})")  # fmt: skip
    if record.leaks:
        shown = "; ".join(f"{s.kind} {s.text!r} at {s.field}[{s.start}:{s.end}]" for s in record.leaks[:3])
        problems.append(f"leaks: {len(record.leaks)} span(s) give the answer away ({shown})")
    if record.solving_shortcuts:
        problems.append(f"shortcuts: {', '.join(s.kind for s in record.solving_shortcuts)} score 1")
    if record.underspecified:
        problems.append(f"underspecified: the fail-to-pass tests require {', '.join(record.underspecified)}, "
                        "which the statement never states")  # fmt: skip
    return problems


def _label(attempt: Attempt) -> str:
    return f"{attempt.kind}: {attempt.note}"


def _judged(record: QualityRecord, problems: list[str], cfg: QualityConfig, start: float) -> QualityRecord:
    failed = list(dict.fromkeys(p.split(":", 1)[0] for p in problems))
    record.failed_gates = failed
    record.reasons = problems
    blocking = [g for g in failed if g in (AUDIT_ERROR, HOST_JUDGED) or g in cfg.enforce]
    record.verdict = "fail" if blocking else "pass"
    record.duration_s = round(time.monotonic() - start, 3)
    log.info(
        "quality audit",
        extra={"task_id": record.task_id, "verdict": record.verdict, "failed_gates": failed,
               "verifier_runs": record.verifier_runs},
    )  # fmt: skip
    return record
