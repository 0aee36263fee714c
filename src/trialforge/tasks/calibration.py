"""What validation learns of a task's blinded assertions, from the gold patch's observed runs.

The fixed tree's runs observe every assertion the host could judge (``testrun.blinding.instrument``)
while the test still runs as written. For each graded test that passed, each observation is put to the
host's own check: a slot the host would judge differently from the test process (a value it cannot
rebuild, such as a user object equal to a string) stays in process when the task is graded, and so does
every slot reading the same module constant or parameter column (its value stays in the file). The
record (``HostJudged``) also says how much of the verdict the host judges: tests all of whose assertions
are host-judged, and assertions, over the graded tests.

A recorded expectation (``Interval(at(9), at(12))``, computed by the gold patch's code) is kept only if a **proof
run** reproduces it: the tests holding one, alone and files in reverse order (``recorded_tests``). A graded run runs
fewer tests than validation, so a value that depends on what ran before (marshmallow's fields carry a global
creation counter) would differ there and fail the gold patch; such a slot stays in process instead.

A recorded expectation's code is taken out of the graded test, so it must not be what runs the fix: in ``start, _ =
span(7); assert start == floor(7)`` the closed side is ``floor(7)``, the function under repair, and a graded run without
it would pass an unfixed ``floor``. So a fail-to-pass test's recorded side must have computed the same value before the
fix (``before``: the unfixed tree's observed runs); one that computed another, or was never reached, runs the changed
code and stays in process, where the test runs it as written.
"""

from __future__ import annotations

import ast
import decimal
import fractions
from collections.abc import Collection, Mapping, Sequence

from trialforge.tasks.schema import HostJudged
from trialforge.tasks.visible import WorkspaceText
from trialforge.testrun.blinding import (
    FileAnalysis,
    Slot,
    TestFunction,
    blind,
    calibrate_test,
    close_demotions,
    due_slots,
    host_check,
)
from trialforge.testrun.expected import Check, decode
from trialforge.testrun.report import TestReport


def recorded_tests(analyses: Mapping[str, FileAnalysis], test_ids: Sequence[str]) -> list[str]:
    """Of ``test_ids``, those holding a recorded slot, files in reverse order: the proof run's selection."""
    holding = [t for t in test_ids if (found := _test(analyses, t)) and any(s.recorded for s in found[1].slots)]
    files = list(dict.fromkeys(t.split("::", 1)[0] for t in holding))[::-1]
    return [t for rel in files for t in holding if t.startswith(rel + "::")]


def calibrate(
    analyses: Mapping[str, FileAnalysis],
    runs: Sequence[TestReport],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    proof: Sequence[TestReport] = (),
    before: Sequence[TestReport] = (),
    hidden: Collection[str] = (),
    workspace: WorkspaceText | None = None,
) -> HostJudged:
    """The host-judged record of a validated task, from its fixed tree's observed ``runs``; ``proof``: the proof
    runs of ``recorded_tests`` (a recorded expectation they do not reproduce, or did not run, stays in process);
    ``before``: the unfixed tree's observed runs (module docstring); ``hidden``: slot keys kept in process whatever
    the runs say (recorded sides whose removal hid an effect: ``tasks.validate``); ``workspace``: what the policy
    can read, where a slot's expected value found anchors nothing (``tasks.visible``)."""
    demoted: dict[str, set[str]] = {}
    for key in hidden:
        demoted.setdefault(key.split("::", 1)[0], set()).add(key)
    param_rows: dict[str, int] = {}
    recorded: dict[str, object] = {}
    for test_id in (*fail_to_pass, *pass_to_pass):
        found = _test(analyses, test_id)
        if found is None:
            continue
        analysis, test = found
        row = _row(test, runs, test_id)
        if test.parametrize is not None and row is not None:
            param_rows[test_id] = row
        keys = demoted.setdefault(analysis.rel, set())
        for report in runs:
            observed, expected = report.observations.get(test_id, []), report.expectations.get(test_id, [])
            keys |= calibrate_test(analysis, test, row, observed, expected, recorded)
        keys |= _not_reproduced(test, test_id, recorded, proof)
        if test_id in fail_to_pass:
            keys |= {slot.key for slot in _run_the_fix(test, test_id, recorded, before)}
    in_process = {key for rel, keys in demoted.items() for key in close_demotions(analyses[rel], keys)}
    recorded = {key: value for key, value in recorded.items() if key not in in_process}
    record = HostJudged(in_process=sorted(in_process), param_rows=param_rows, recorded=recorded)
    left: dict[str, list[object]] = {}  # each file's constants its graded copy keeps (``_left``)
    for test_id in (*fail_to_pass, *pass_to_pass):
        found = _test(analyses, test_id)
        # the slots this id's row reaches: a row whose branch holds no slot is judged in process, however many the
        # test has elsewhere
        kept = [s for s in found[1].slots if s.key not in in_process] if found else []
        slots = due_slots(*found, param_rows.get(test_id), kept) if found else []
        assertions = found[1].assertions if found else 0
        entirely = bool(slots) and len(slots) >= assertions
        if test_id in fail_to_pass:
            record.fail_to_pass += 1
            record.fail_to_pass_host_judged += entirely
            if found and found[0].rel not in left:
                left[found[0].rel] = _left(found[0])  # once per file: it walks every slot of the file
            kept = left[found[0].rel] if found else []
            why = _unanchored(found, slots, param_rows.get(test_id), recorded, workspace, kept)
            record.fail_to_pass_anchored += not why
            if why:
                record.unanchored[test_id] = why
        else:
            record.pass_to_pass += 1
            record.pass_to_pass_host_judged += entirely
        record.assertions += max(assertions, len(slots))
        record.assertions_host_judged += len(slots)
        record.weak += sum(_weak(s, recorded) for s in slots)
    return record


def judged_values(
    analyses: Mapping[str, FileAnalysis], tests: Sequence[str], record: HostJudged
) -> dict[str, list[object]]:
    """Each of ``tests`` -> the values the host judges it by, as grading's checks hold them (an expected side, a
    unittest method's expected arguments, a ``match=`` pattern; guessable ``None`` and bools left out): kept out of
    every sandbox, so a statement must not show them either (``tasks.observed``)."""
    by_file: dict[str, list[str]] = {}
    for test_id in tests:
        if "::" in test_id and test_id.split("::", 1)[0] in analyses:
            by_file.setdefault(test_id.split("::", 1)[0], []).append(test_id)
    found: dict[str, list[object]] = {}
    for rel, ids in by_file.items():
        blinded = blind(analyses[rel], ids, record.in_process, record.param_rows, recorded=record.recorded)
        if blinded is None:
            continue
        for sandbox_id, checks in blinded[1].checks.items():
            values = found.setdefault(blinded[1].original.get(sandbox_id, sandbox_id), [])
            for _, check in checks:
                values += check_values(check)
    return {t: [v for v in values if v is not None and not isinstance(v, bool)] for t, values in found.items()}


def observed_actuals(
    analyses: Mapping[str, FileAnalysis], tests: Sequence[str], record: HostJudged, before: Sequence[TestReport]
) -> dict[str, tuple[str, object]]:
    """Each of ``tests`` -> the actual side of its first comparison the host judged failing in the ``before`` runs
    (its source) and the value it had there: what the code under test computed, never what the test expects. A value
    the host could not rebuild as a plain value (an object of the package) is left out."""
    found: dict[str, tuple[str, object]] = {}
    for test_id in tests:
        located = _test(analyses, test_id)
        if located is None:
            continue
        analysis, test = located
        slots = {s.index: s for s in test.slots if s.key not in record.in_process and s.actual is not None}
        for index, encoded in (o for report in before for o in report.observations.get(test_id, [])):
            slot = slots.get(index)
            check = host_check(analysis, test, record.param_rows.get(test_id), slot, record.recorded) if slot else None
            value = decode(encoded)
            if slot and check and check.kind in ("compare", "unittest") and not check.passes(encoded):
                if type(value) in _PLAIN:
                    found[test_id] = (ast.unparse(slot.actual), value)
                break
    return found


_PLAIN = (int, float, str, bytes, list, tuple, dict, set, frozenset, decimal.Decimal, fractions.Fraction)


def _unanchored(
    found: tuple[FileAnalysis, TestFunction] | None,
    slots: Sequence[Slot],
    row: int | None,
    recorded: Mapping[str, object],
    workspace: WorkspaceText | None,
    left: Sequence[object],
) -> str:
    """Why a fail-to-pass test has no anchor ("" when it has one): what a user reads to see why the gate dropped it;
    ``left``: the constants its file's graded copy keeps (``_left``)."""
    if found is None:
        return "no test function the host reads (generated, inherited or not Python)"
    test = found[1]
    if not test.blindable:
        return "its body does not run once to its end as written (a decorator, a return, several parametrize marks)"
    if not test.slots:
        return "no assertion the host can judge" + (" (all in loops, helpers or branches)" if test.assertions else "")
    if not slots:
        return "every assertion the host could judge stays in process (calibration: the gold patch's runs showed why)"
    strong = [s for s in slots if not _weak(s, recorded)]
    if not strong:
        return "only guessable checks (truthiness, None, a bool, a class, a raises without its message)"
    if all(_readable(*found, row, s, recorded, workspace, left) for s in strong):
        return "every expected value it has is readable in the workspace (tasks/visible.py)"
    return ""


def _readable(
    analysis: FileAnalysis,
    test: TestFunction,
    row: int | None,
    slot: Slot,
    recorded: Mapping[str, object],
    workspace: WorkspaceText | None,
    left: Sequence[object],
) -> bool:
    """Whether the policy's code can read what ``slot`` expects (every value it expects: ``tasks.visible``); ``left``:
    the constants the graded file keeps (``_left``)."""
    if workspace is None or slot.actual is None:
        return False
    check = host_check(analysis, test, row, slot, recorded)
    values = [v for v in check_values(check) if v is not None] if check else []
    inputs = _inputs(analysis, test, slot)
    return bool(values) and all(workspace.answers(v, inputs, left) for v in values)


def _inputs(analysis: FileAnalysis, test: TestFunction, slot: Slot) -> list[object]:
    """The test's input literals: the constants of its function, its decorators and the module constants it reads,
    less those of what ``slot`` expects (``_expected_nodes``). Another slot's expected value counts: a module spelling
    both is a copy of the test."""
    own = _expected_nodes(analysis, test, slot)
    reads = {n.id for side in _sides(slot) for n in ast.walk(side) if isinstance(n, ast.Name)}
    loads = {n.id for n in ast.walk(test.node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    given = [test.node, *(analysis.constants[name] for name in (loads - reads) & set(analysis.constants))]
    return [n.value for g in given for n in ast.walk(g) if isinstance(n, ast.Constant) and id(n) not in own]


def _expected_nodes(analysis: FileAnalysis, test: TestFunction, slot: Slot) -> set[int]:
    """The nodes of what ``slot`` expects: its expected side, the local and module constants that side reads, and
    every row's cell of the parameter columns it reads (what blinding takes out of the graded file)."""
    sides = _sides(slot)
    reads = {n.id for side in sides for n in ast.walk(side) if isinstance(n, ast.Name)}
    sources = [*sides, *(test.constants[name] for name in reads & set(test.constants))]
    sources += [analysis.constants[name] for name in reads & set(analysis.constants)]
    param = test.parametrize
    if param is not None:
        sources += [row[param.names.index(name)] for row in param.rows for name in reads & set(param.names)]
    return {id(node) for source in sources for node in ast.walk(source)}


def _left(analysis: FileAnalysis) -> list[object]:
    """The constants the graded file keeps: every one but what its slots expect (``_expected_nodes``; a constant only
    an expected side reads goes too, so this holds more than the graded file: the safe side)."""
    taken = {n for t in analysis.tests.values() for s in t.slots for n in _expected_nodes(analysis, t, s)}
    return [n.value for n in ast.walk(analysis.module) if isinstance(n, ast.Constant) and id(n) not in taken]


def _sides(slot: Slot) -> list[ast.expr]:
    return [side for side in (*slot.expected, slot.match, *(v for _, v in slot.options)) if side is not None]


def check_values(check: Check) -> tuple[object, ...]:
    """What a check expects: its expected side (a unittest method's expected arguments each; ``pytest.approx``'s
    value) and ``match=``."""
    expected = tuple(check.expected) if check.kind == "unittest" else (check.expected,)
    return (*(getattr(e, "expected", e) if type(e).__module__.startswith("_pytest") else e for e in expected),
            *(() if check.kind == "unittest" else (check.match,)))  # fmt: skip


def _weak(slot: Slot, recorded: Mapping[str, object]) -> bool:
    """A slot a forger passes by guessing: weak by its form, or a recorded expectation that came out None or a bool
    (``assert a.closed == b.closed``: the answer is one of two)."""
    if slot.weak:
        return True
    if not slot.recorded:
        return False
    value = decode(recorded.get(slot.key))
    return value is None or isinstance(value, bool)


def _run_the_fix(
    test: TestFunction, test_id: str, recorded: Mapping[str, object], before: Sequence[TestReport]
) -> list[Slot]:
    """``test``'s recorded slots whose expected side the unfixed tree's runs computed otherwise than the fixed tree's,
    or never computed."""
    moved = []
    for slot in (s for s in test.slots if s.recorded and s.key in recorded):
        values = [v for report in before for i, v in report.expectations.get(test_id, []) if i == slot.index]
        if not values or any(v != recorded[slot.key] for v in values):
            moved.append(slot)
    return moved


def _not_reproduced(
    test: TestFunction, test_id: str, recorded: Mapping[str, object], proof: Sequence[TestReport]
) -> set[str]:
    """Keys of ``test``'s recorded slots whose value some proof run did not compute once, as validation recorded it
    (none at all: no proof run, so nothing recorded is proven)."""
    keys = set()
    for slot in (s for s in test.slots if s.recorded):
        runs = [[v for i, v in report.expectations.get(test_id, []) if i == slot.index] for report in proof]
        if not runs or any(values != [recorded.get(slot.key)] for values in runs):
            keys.add(slot.key)
    return keys


def _test(analyses: Mapping[str, FileAnalysis], test_id: str) -> tuple[FileAnalysis, TestFunction] | None:
    if "::" not in test_id:
        return None
    rel, rest = test_id.split("::", 1)
    analysis = analyses.get(rel)
    test = analysis.tests.get(rest.split("[", 1)[0]) if analysis else None
    return (analysis, test) if analysis and test else None


def _row(test: TestFunction, runs: Sequence[TestReport], test_id: str) -> int | None:
    """Which row of its parametrize decorator ``test_id`` is, as the runs reported (None: not one decorator's)."""
    if test.parametrize is None:
        return None
    for report in runs:
        indices = report.rows.get(test_id, {})
        rows = {indices.get(name) for name in test.parametrize.names}
        if len(rows) == 1 and None not in rows and set(indices) == set(test.parametrize.names):
            return rows.pop()
    return None
