"""What validation learns of a task's blinded assertions, from the gold patch's observed runs.

The fixed tree's runs observe every assertion the host could judge (``testrun.blinding.instrument``)
while the test still runs as written. For each graded test that passed, each observation is put to the
host's own check: a slot the host would judge differently from the test process (a value it cannot
rebuild, such as a user object equal to a string) stays in process when the task is graded, and so does
every slot reading the same module constant or parameter column (its value stays in the file). The
record (``HostJudged``) also says how much of the verdict the host judges: tests all of whose assertions
are host-judged, and assertions, over the graded tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trialforge.tasks.schema import HostJudged
from trialforge.testrun.blinding import FileAnalysis, TestFunction, calibrate_test, close_demotions
from trialforge.testrun.report import TestReport


def calibrate(
    analyses: Mapping[str, FileAnalysis], runs: Sequence[TestReport], fail_to_pass: list[str], pass_to_pass: list[str]
) -> HostJudged:
    """The host-judged record of a validated task, from its fixed tree's observed ``runs``."""
    demoted: dict[str, set[str]] = {}
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
    in_process = {key for rel, keys in demoted.items() for key in close_demotions(analyses[rel], keys)}
    recorded = {key: value for key, value in recorded.items() if key not in in_process}
    record = HostJudged(in_process=sorted(in_process), param_rows=param_rows, recorded=recorded)
    for test_id in (*fail_to_pass, *pass_to_pass):
        found = _test(analyses, test_id)
        slots = [s for s in found[1].slots if s.key not in in_process] if found else []
        assertions = found[1].assertions if found else 0
        entirely = bool(slots) and len(slots) >= assertions
        if test_id in fail_to_pass:
            record.fail_to_pass += 1
            record.fail_to_pass_host_judged += entirely
            record.fail_to_pass_anchored += any(not s.weak for s in slots)
        else:
            record.pass_to_pass += 1
            record.pass_to_pass_host_judged += entirely
        record.assertions += max(assertions, len(slots))
        record.assertions_host_judged += len(slots)
        record.weak += sum(s.weak for s in slots)
    return record


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
