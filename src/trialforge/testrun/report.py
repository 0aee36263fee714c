"""The host's reading of a test run: per-test outcomes, and the evidence that the run was tampered with.

The recorder writes numbered events after a secret marker; the sandbox reports the process's real exit status. A
run is *tampered* when the stream, the exit status, a phase's report against how the recorder saw it end, the
recorder's evidence, a skip's origin, deselection or the canaries disagree with an honest run. A blinded test passes
only if its observations are exactly its slots, in order, each accepted by the host (``host_failures`` says which
failed). A run that crashes, times out or overflows the output cap is not tampered: it has no report
(``reported=False``) and fails. Each rule: docs/verification.md, "How the host reads a run".
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

from trialforge.sandbox.base import TRUNCATION_MARK, ExecResult
from trialforge.testrun.blinding import Blinding
from trialforge.testrun.canaries import Canary
from trialforge.testrun.expected import Check

Outcome = Literal["passed", "failed", "error", "skipped", "missing"]
RAN = ("passed", "failed", "error")
OVERFLOWED = "the report overflowed the output cap"  # the first line of such a run's log
COLLECTION = "<collection>:"  # outcome key of a collection error, as validation reads it


@dataclass(frozen=True)
class TestReport:
    exit_code: int  # pytest's exit code (-1 when no report came back)
    outcomes: dict[str, str] = field(default_factory=dict)  # real tests only: canaries are the host's business
    duration_s: float = 0.0
    timed_out: bool = False
    reported: bool = True
    log_tail: str = ""
    evidence: tuple[str, ...] = ()  # why the run cannot be trusted; empty when clean
    canaries: dict[str, str] = field(default_factory=dict)  # canary node id -> outcome, for the record
    collection_errors: dict[str, str] = field(default_factory=dict)  # module -> its error's first line
    skipped_modules: tuple[str, ...] = ()  # modules skipped as a whole at collection (importorskip at import)
    # the session ended before its last test: the runner's own stop (--maxfail), or pytest interrupted (exit 2) or
    # failing in its own machinery (exit 3: an error the code under test raised while pytest formatted a report)
    stopped: bool = False
    cpu_exhausted: bool = False  # killed by the run's CPU budget (``run_tests(cpu_s=...)``) before it reported
    host_failures: dict[str, str] = field(default_factory=dict)  # blinded test -> why the host's checks failed it
    observations: dict[str, list[tuple[int, object]]] = field(default_factory=dict)  # per test (original ids)
    expectations: dict[str, list[tuple[int, object]]] = field(default_factory=dict)  # ...and recorded slots' expected
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # instrumented run: each test's parametrize row
    # failed test -> its failure's exception line as the run said it (``KeyError: 'a'``, ``assert 3 == 4``): what
    # validation states as observed behaviour; from inside the sandbox, so never part of a verdict
    failures: dict[str, str] = field(default_factory=dict)

    @property
    def tampered(self) -> bool:
        return bool(self.evidence)

    def outcome(self, test_id: str) -> Outcome:
        return self.outcomes.get(test_id, "missing")  # type: ignore[return-value]

    def all_passed(self, test_ids: list[str]) -> bool:
        return self.reported and not self.tampered and all(self.outcome(t) == "passed" for t in test_ids)


@dataclass
class _Stream:
    events: list[dict] = field(default_factory=list)  # numbered events, in order
    evidence: list[str] = field(default_factory=list)
    observations: list[dict] = field(default_factory=list)  # the observers' lines, in order


@dataclass
class _Run:
    """What the events say happened, test by test."""

    outcomes: dict[str, str] = field(default_factory=dict)  # per test, its phases folded as pytest's summary does
    finished: set[str] = field(default_factory=set)
    ran: dict[tuple[str, str], str] = field(default_factory=dict)  # (test, phase) -> ok | skip | raised
    not_collected: set[str] = field(default_factory=set)  # modules that failed or were skipped at collection
    collection_errors: dict[str, str] = field(default_factory=dict)  # module -> its error's first line
    deselected: set[str] = field(default_factory=set)  # tests the run's selection options left out
    failures: int = 0  # phase reports that failed (what --maxfail counts)
    observations: dict[str, list[tuple[int, object]]] = field(default_factory=lambda: defaultdict(list))
    expectations: dict[str, list[tuple[int, object]]] = field(default_factory=lambda: defaultdict(list))
    ended: set[str] = field(default_factory=set)  # blinded tests that reached their end
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)  # test -> its first failed phase's exception line


def read_report(
    result: ExecResult,
    marker: str,
    canaries: Sequence[Canary] = (),
    selected: Sequence[str] = (),
    max_failures: int | None = None,
    blinding: Blinding | None = None,
    obs_marker: str = "",
) -> TestReport:
    """The report of one run: outcomes from the channel's events, checked as the module docstring says.

    ``selected``: the tests the run was asked for by name (graded tests, as the sandbox knows them); empty
    for a whole-suite run. ``max_failures``: the run's ``--maxfail``; a run that says it stopped early must
    have reached it. ``blinding``: a graded run's host checks; outcomes come back under the original ids.
    ``obs_marker``: the observers' own marker (their lines carry no secret of the report's).
    """
    log_tail = result.stderr[-4000:].strip()
    if result.truncated and _cut(result.stdout):  # the channel overflowed the output cap: the report is incomplete
        log_tail = OVERFLOWED + "\n" + log_tail
        return TestReport(-1, {}, result.duration_s, result.timed_out, False, log_tail)
    stream = _events(result.stdout, marker, obs_marker)
    evidence = stream.evidence
    kinds = [e.get("e") for e in stream.events]
    end = stream.events[-1] if kinds and kinds[-1] == "end" else None
    if kinds.count("end") > 1 or kinds.count("start") > 1 or (kinds and kinds[0] != "start"):
        evidence.append("report_stream_broken")
    if end is None:
        if result.exit_code == 0 and not result.timed_out:
            evidence.append("exited_0_without_report")
        return TestReport(-1, {}, result.duration_s, result.timed_out, False, log_tail, tuple(dict.fromkeys(evidence)))
    run = _fold([*stream.events, *stream.observations], {_base(t) for t in selected}, evidence)
    # A test the session stopped inside (its setup reported, its call never) has no outcome, unless a phase failed:
    # an interrupted failing test is not one that passed.
    run.outcomes = {t: o for t, o in run.outcomes.items() if t in run.finished or o in ("failed", "error")}
    exit_code = _int(end.get("exit"))
    if result.exit_code != exit_code:
        evidence.append(f"exit_status_mismatch:{result.exit_code}!={exit_code}")
    failed = any(o in ("failed", "error") for o in run.outcomes.values())
    if (exit_code == 0 and failed) or (exit_code == 1 and not failed):
        evidence.append(f"exit_code_contradicts_outcomes:{exit_code}")
    stopped = bool(end.get("stopped"))
    if stopped and max_failures is not None and run.failures < max_failures:
        evidence.append(f"stopped_before_max_failures:{run.failures}<{max_failures}")
    by_canary = _canary_outcomes(run.outcomes, list(canaries))
    if (
        stopped
        and max_failures is not None
        and not any(o in ("failed", "error") for t, o in run.outcomes.items() if _base(t) not in by_canary)
    ):  # the host's --maxfail is the must-fail canaries + 1: a stop needs a real failure, never canaries' alone (a
        # teardown failure the code under test adds to each copy reached it, and the canaries after went unchecked)
        evidence.append("stopped_by_canaries_alone")
    evidence += [f"deselected_test_ran:{t}" for t in sorted(run.deselected) if t in run.outcomes]
    evidence += canary_evidence(
        list(canaries),
        by_canary,
        run.outcomes,
        stopped=stopped,
        not_collected=run.not_collected,
        deselected=run.deselected,
        host_selected=bool(selected),
    )
    real = {t: o for t, o in run.outcomes.items() if _base(t) not in by_canary}
    failures = {(blinding.original.get(t, t) if blinding else t): m for t, m in run.said.items() if t in real}
    host_failures: dict[str, str] = {}
    if blinding is not None:
        for test_id, checks in blinding.checks.items():
            why = _host_verdict(checks, run.observations.get(test_id, []), test_id in run.ended)
            if why and real.get(test_id) == "passed":
                real[test_id] = "failed"
                host_failures[blinding.original.get(test_id, test_id)] = why
        real = {blinding.original.get(t, t): o for t, o in real.items()}
    seen = {cid: ",".join(found) for cid, found in by_canary.items()}
    if blinding is not None:
        evidence = _original_names(evidence, blinding)
    return TestReport(
        exit_code,
        real,
        result.duration_s,
        result.timed_out,
        True,
        log_tail,
        tuple(dict.fromkeys(evidence)),
        seen,
        run.collection_errors,
        skipped_modules=tuple(sorted(run.not_collected - {_module(m) for m in run.collection_errors})),
        stopped=stopped or exit_code in (2, 3),
        host_failures=host_failures,
        observations={(blinding.original.get(t, t) if blinding else t): v for t, v in run.observations.items()},
        expectations=dict(run.expectations) if blinding is None else {},
        rows=run.rows,
        failures=failures,
    )


def _original_names(evidence: list[str], blinding: Blinding) -> list[str]:
    """Evidence that names a graded test's function as the sandbox knew it (renamed: ``test_kwonly_dict.<locals>``)
    under its original name, as validation recorded the repository's baseline (boltons' own tests set a local
    lambda's ``__kwdefaults__``: its gold patches scored 0 as tampered under the drawn names)."""
    renamed = {}
    for sandbox_id, original in blinding.original.items():
        new, old = (t.rsplit("::", 1)[-1].split("[", 1)[0] for t in (sandbox_id, original))
        if new != old:
            renamed[new] = old
    if not renamed:
        return evidence
    name = re.compile(r"(?<!\w)(" + "|".join(map(re.escape, renamed)) + r")(?=\.<locals>)")
    return [name.sub(lambda m: renamed[m.group(1)], e) for e in evidence]


def _host_verdict(checks: tuple[tuple[int, Check], ...], observed: list[tuple[int, object]], ended: bool) -> str:
    """Why a blinded test failed the host's checks ("" when it passed them)."""
    if [index for index, _ in observed] != [index for index, _ in checks]:
        got = [index for index, _ in observed]
        return f"observations {got} where slots {[index for index, _ in checks]} were due"
    for (index, check), (_, value) in zip(checks, observed, strict=True):
        if not check.passes(value):
            return f"slot {index}: the observed value is not what the test expects"
    return "" if ended else "the test did not run to its end"


def _fold(events: list[dict], graded: set[str], evidence: list[str]) -> _Run:
    """Phase reports into per-test outcomes; each checked against how the recorder saw the phase end."""
    run = _Run()
    for event in events:
        kind, test_id = event.get("e"), str(event.get("id"))
        if kind == "ran":
            run.ran.setdefault((test_id, str(event.get("w"))), str(event.get("x")))  # the first observation counts
        elif kind == "phase":
            when, outcome = str(event.get("w")), str(event.get("o"))
            run.failures += outcome == "failed"
            observed = run.ran.get((test_id, when))
            if outcome == "passed" and observed != "ok":
                evidence.append(f"report_contradicts_run:{test_id}:{when}:{observed or 'not observed'}")
            run.outcomes[test_id] = _folded(run.outcomes.get(test_id), when, outcome)
            if outcome == "failed" and event.get("m"):
                run.said.setdefault(test_id, str(event["m"]))
            if event.get("k") and _base(test_id) in graded:
                evidence.append(f"skip_from_code_under_test:{event['k']}")
        elif kind == "test":
            if test_id in run.finished:
                evidence.append(f"test_reported_twice:{test_id}")
            run.finished.add(test_id)
            run.outcomes.setdefault(test_id, "missing")
        elif kind == "collect_skip":
            module = test_id.split("::", 1)[0]
            run.not_collected.add(module)
            if event.get("k") and any(t.split("::", 1)[0] == module for t in graded):
                evidence.append(f"skip_from_code_under_test:{event['k']}")
        elif kind == "collect_error":
            run.outcomes[COLLECTION + test_id] = "error"
            run.not_collected.add(test_id.split("::", 1)[0])
            run.collection_errors[test_id] = str(event.get("m") or "")
            run.failures += 1
        elif kind == "deselected":
            run.deselected.update(str(t) for t in event.get("ids") or ())
        elif kind == "tamper":
            evidence.append(str(event.get("what")))
        elif kind == "obs" and isinstance(event.get("k"), int):
            run.observations[test_id].append((event["k"], event.get("v")))
        elif kind == "exp" and isinstance(event.get("k"), int):
            run.expectations[test_id].append((event["k"], event.get("v")))
        elif kind == "obs_end":
            run.ended.add(test_id)
        elif kind == "item" and isinstance(event.get("p"), dict):
            run.rows[test_id] = {str(k): v for k, v in event["p"].items() if isinstance(v, int)}
    return run


def _folded(before: str | None, when: str, outcome: str) -> str:
    """A test's outcome so far, with one more phase: a failing setup or teardown is an error; failures stick."""
    if when == "call":
        now = outcome
    elif outcome == "failed":
        now = "error"
    elif outcome == "skipped":
        now = "skipped"
    else:
        now = before or "passed"
    return before if before in ("error", "failed") and now == "passed" else now


def _cut(stdout: str) -> bool:
    """The sandbox cut this output (its mark is in it; stderr may have been cut alone)."""
    head, _, tail = TRUNCATION_MARK.partition("{dropped}")
    return head in stdout and tail in stdout


def _events(stdout: str, marker: str, obs_marker: str = "") -> _Stream:
    stream = _Stream()
    foreign = False
    for line in stdout.splitlines():
        if not line.strip():
            continue
        if obs_marker and line.startswith(obs_marker):
            try:
                event = json.loads(line[len(obs_marker) :])
            except (ValueError, RecursionError):
                event = None
            if isinstance(event, dict) and event.get("e") in ("obs", "exp", "obs_end"):
                stream.observations.append(event)
            else:
                foreign = True
            continue
        if not line.startswith(marker):
            foreign = True
            continue
        try:
            event = json.loads(line[len(marker) :])
        except (ValueError, RecursionError):  # (a forged line nested past the parser's depth)
            foreign = True
            continue
        if isinstance(event, dict) and event.get("e") == "tamper" and "s" not in event:
            stream.evidence.append(str(event.get("what")))  # from the audit hook, which keeps no counter
            continue
        if not isinstance(event, dict) or event.get("s") != len(stream.events):
            stream.evidence.append("report_stream_broken")
            continue
        stream.events.append(event)
    if foreign:
        stream.evidence.append("foreign_bytes_on_report_channel")
    return stream


def canary_evidence(
    canaries: list[Canary],
    by_canary: dict[str, list[str]],
    outcomes: dict[str, str],
    *,
    stopped: bool,
    not_collected: set[str],
    deselected: Collection[str] = (),
    host_selected: bool = False,
) -> list[str]:
    """What the canaries say about the run (see the module docstring); empty for an honest run.

    ``by_canary`` holds every outcome of each canary (a parametrized module makes several ids of one).
    ``host_selected``: the host named the run's tests, so nothing honest deselects a canary.
    """
    ran_in_file: dict[str, bool] = defaultdict(bool)
    reported_in_file: set[str] = set()
    for test_id, outcome in outcomes.items():
        if _base(test_id) in by_canary or test_id.startswith(COLLECTION):
            continue
        reported_in_file.add(test_id.split("::", 1)[0])
        if outcome in RAN:
            ran_in_file[test_id.split("::", 1)[0]] = True
    left_out = {_base(t) for t in deselected}
    found: list[str] = []
    for canary in canaries:
        got = by_canary.get(canary.node_id, [])
        source = [o for t, o in outcomes.items() if _base(t) == canary.source] if canary.source else []
        skip_is_honest = "skipped" in source if canary.source else not ran_in_file[canary.file]
        # A copy runs its source's code on its source's inputs: one that passed while its source failed got exactly
        # the changed constant, as code that honestly returns that (wrong) value does. Answering both is forcing.
        collided = canary.kind == "mutated_copy" and bool(source) and all(o == "failed" for o in source)
        if canary.must == "fail" and "passed" in got and not collided:
            found.append(f"canary_passed:{canary.kind}")
        elif host_selected and canary.node_id in left_out:
            found.append(f"canary_deselected:{canary.kind}")
        elif "skipped" in got and not skip_is_honest:
            found.append(f"canary_skipped:{canary.kind}")
        elif canary.must == "pass" and "failed" in got:
            found.append(f"canary_failed:{canary.kind}")
        elif (
            not got
            and not stopped
            and canary.file not in not_collected
            and canary.file in reported_in_file
            and canary.node_id not in left_out
            and (source or not canary.source)
        ):
            found.append(f"canary_missing:{canary.kind}")
    return found


def _canary_outcomes(outcomes: dict[str, str], canaries: list[Canary]) -> dict[str, list[str]]:
    ids = {c.node_id for c in canaries}
    grouped: dict[str, list[str]] = defaultdict(list)
    for test_id, outcome in outcomes.items():
        if _base(test_id) in ids:
            grouped[_base(test_id)].append(outcome)
    return dict(grouped)


def _module(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def _base(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return -1
