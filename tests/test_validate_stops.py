"""A run that stops early says nothing of the tests it never reached (issue #45, tqdm-164ef7302b4c): they are unknown,
never failed, so never fail-to-pass; the stopped run is run again one module at a time for their real outcomes.

tqdm's bug (an AttributeError in ``tqdm.__del__``) surfaced inside pytest's own formatting of a failure and ended the
session (INTERNALERROR, exit 3) after tests_rich.py: 80 later tests were counted fail-to-pass, and a must-pass canary
planted after the stop went missing (``env_canaries_unreliable``)."""

from __future__ import annotations

import json

import pytest
from support.redteam_repo import write_tree

from tests.test_validate import _task_from, _validate
from trialforge.envspec import EnvSpec
from trialforge.sandbox.base import ExecResult, Limits, SandboxSpec
from trialforge.store.objstore import open_store
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import _judge
from trialforge.testrun.report import TestReport as Report  # not "Test*": pytest would collect it
from trialforge.testrun.report import read_report
from trialforge.testrun.run import run_tests
from trialforge.verify.grader import Grader

FIXED_CALC = "def double(x):\n    return x + x\n\n\ndef close():\n    return None\n"
# tqdm's pattern: before the fix, an error the code raises escapes into pytest's reporting of a failure (exit 3)
REPORTING = "import calc\n\n\ndef pytest_runtest_logreport(report):\n    if report.failed:\n        calc.close()\n"
STOPS_IN_REPORTING = {
    "calc.py": "def double(x):\n    return x + x + 1\n\n\ndef close():\n    raise SystemError('close failed')\n",
    "tests/conftest.py": REPORTING,
    "tests/test_a_double.py": "from calc import double\n\n\ndef test_double():\n    assert double(2) == 4\n",
    "tests/test_b_later.py": "from calc import double\n\n\ndef test_zero():\n    assert double(0) <= 1\n",
    "tests/test_c_later.py": "def test_one():\n    assert 1\n\n\ndef test_two():\n    assert 2\n",
}
# A test of the first module interrupts the session before the fix (exit 2, inside its call, so it never reports
# it); a later module's test fails on its own.
INTERRUPTS = {
    "calc.py": "def double(x):\n    return x + x + 1\n\n\ndef close():\n    raise KeyboardInterrupt\n",
    "tests/test_a_close.py": "import calc\n\n\ndef test_close():\n    assert calc.close() is None\n",
    "tests/test_b_double.py": "from calc import double\n\n\ndef test_double():\n    assert double(2) == 4\n",
    "tests/test_c_later.py": "def test_one():\n    assert 1\n",
}


@pytest.fixture
def snapshots(tmp_path):
    return SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")


def _graded(task, backend, image, snapshots) -> tuple[float, float]:
    grader = Grader(backend, image.name, image.digest, snapshots, Limits())
    return grader.grade(task, task.gold_patch).reward, grader.grade(task, "").reward


@pytest.mark.sandbox
def test_tests_after_a_stop_in_pytests_reporting_are_not_fail_to_pass(tmp_path, snapshots, bwrap_backend, base_image):
    fixed = {**STOPS_IN_REPORTING, "calc.py": FIXED_CALC}
    task = _task_from(tmp_path, snapshots, STOPS_IN_REPORTING, fixed)
    checked = _validate(task, bwrap_backend, base_image, snapshots, runs=2)
    assert checked.validation.valid, checked.validation.reason
    # alone, test_a_double.py stops again: it fails as a whole (one unit); the later modules ran to their end
    assert checked.fail_to_pass == ["tests/test_a_double.py::test_double"]
    assert checked.pass_to_pass == [
        "tests/test_b_later.py::test_zero",
        "tests/test_c_later.py::test_one",
        "tests/test_c_later.py::test_two",
    ]
    assert checked.validation.flaky_tests == [] and checked.validation.unknown_outcome == 0
    # each stopped run ran again one module at a time, where test_a_double.py stops again after its failure
    assert checked.validation.stopped_runs == 2
    assert _graded(checked, bwrap_backend, base_image, snapshots) == (1.0, 0.0)


@pytest.mark.sandbox
def test_a_later_modules_real_failure_before_the_fix_stays_fail_to_pass(tmp_path, snapshots, bwrap_backend, base_image):
    fixed = {**INTERRUPTS, "calc.py": FIXED_CALC}
    checked = _validate(_task_from(tmp_path, snapshots, INTERRUPTS, fixed), bwrap_backend, base_image, snapshots, 1)
    assert checked.validation.valid, checked.validation.reason
    assert checked.fail_to_pass == ["tests/test_b_double.py::test_double"]  # its real outcome, from its own run
    assert checked.pass_to_pass == ["tests/test_c_later.py::test_one"]
    # test_close never reported its call before the fix (the interrupt ended the session inside it): unknown
    assert checked.validation.unknown_examples == ["tests/test_a_close.py::test_close"]
    assert _graded(checked, bwrap_backend, base_image, snapshots) == (1.0, 0.0)


SELECTING = {
    "pytest": EnvSpec(test_cmd=("python3", "-m", "pytest", "-k", "not slow")),
    "unittest": EnvSpec(test_cmd=("python3", "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-k", "fast")),
}
MODULE = {  # the task's -k leaves test_slow out of every run of the suite
    "pytest": "def test_fast():\n    assert 1\n\n\ndef test_slow():\n    assert 0\n",
    "unittest": "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_fast(self):\n        pass\n\n"
    "    def test_slow(self):\n        self.fail()\n",
}


@pytest.mark.sandbox
@pytest.mark.parametrize("runner", ["pytest", "unittest"])
def test_a_module_run_apart_keeps_the_tasks_selection(tmp_path, bwrap_backend, base_image, runner):
    """The rerun of a stopped run, one module at a time, stands for the whole-suite run: the task's -k still chooses
    there (before, a test the task deselects ran in the rerun and counted before the fix), while a graded run, whose
    tests the host names, drops it."""
    tree = write_tree(tmp_path / "tree", {"tests/__init__.py": "", "tests/test_m.py": MODULE[runner]})
    sandbox = bwrap_backend.create(SandboxSpec(image=base_image.name, workspace=tree, limits=Limits()))
    try:
        apart = run_tests(sandbox, ["tests/test_m.py"], timeout=60, env=SELECTING[runner], keep_selection=True)
        named = run_tests(sandbox, ["tests/test_m.py"], timeout=60, env=SELECTING[runner])
    finally:
        sandbox.close()
    fast, slow = (f"tests/test_m.py::{n}" if runner == "pytest" else f"tests/test_m.py::T::{n}" for n in ("test_fast",
                  "test_slow"))  # fmt: skip
    assert apart.outcomes == {fast: "passed"} and not apart.evidence
    assert named.outcomes == {fast: "passed", slow: "failed"}


A, B, C = "tests/test_a.py::test_a", "tests/test_b.py::test_b", "tests/test_c.py::test_c"
MISSING = ("canary_missing:self_contained",)


def _judged(before: list[Report], after: list[Report]) -> Task:
    task = Task(
        task_id="t", source=Source(kind="synthetic", ref="x"), repo="r", snapshot="s", problem_statement="p",
        gold_patch="", test_patch="",
    )  # fmt: skip
    return _judge(task, before, after, 0.0)


@pytest.mark.pure
def test_a_test_the_session_stopped_inside_has_no_outcome():
    """tqdm's run stopped while pytest formatted a failing test's call: its setup had passed, and it read as passed
    (a must-fail canary too: ``canary_passed``, a task called tampered). Only a failed phase is an outcome alone."""
    marker = "0" * 48
    events = [{"e": "start"}]
    for test, call in ((A, "passed"), (B, None), (C, "failed")):
        for when, outcome in (("setup", "passed"), ("call", call)):
            if outcome:
                events += [{"e": "ran", "id": test, "w": when, "x": "ok" if outcome == "passed" else "raised"}]
                events += [{"e": "phase", "id": test, "w": when, "o": outcome}]
        if test == A:
            events.append({"e": "test", "id": A})
    events.append({"e": "end", "exit": 3, "stopped": False})
    stream = "".join(f"{marker}{json.dumps({**e, 's': i})}\n" for i, e in enumerate(events))
    report = read_report(ExecResult(3, stream, "INTERNALERROR> SystemError: x", 1.0), marker)
    assert report.reported and report.stopped and not report.evidence
    assert report.outcomes == {A: "passed", C: "failed"}  # B stopped in its call: unknown


@pytest.mark.pure
def test_a_test_a_stopped_run_never_reported_is_unknown_not_failed():
    """What the module-by-module runs cannot explain (one of them timed out) stays a stopped run: its later tests are
    in neither list, and the canaries it never reached are not the environment's fault."""
    stopped = Report(3, {A: "failed"}, stopped=True, evidence=MISSING)
    after = Report(0, {A: "passed", B: "passed", C: "passed"})
    judged = _judged([stopped], [after])
    assert (judged.fail_to_pass, judged.pass_to_pass) == ([A], [])
    assert (judged.validation.unknown_outcome, judged.validation.stopped_runs) == (2, 1)
    assert judged.validation.flaky_tests == []
    # another run that went to its end knows them: B passed (pass-to-pass), C failed in it (fail-to-pass)
    whole = Report(1, {A: "failed", B: "passed", C: "failed"})
    judged = _judged([stopped, whole], [after, after])
    assert (judged.fail_to_pass, judged.pass_to_pass) == ([A, C], [B])
    assert judged.validation.flaky_tests == [] and judged.validation.unstable_ids == 0
    # failing one way in one run and another way in the next is still failing before the fix; passing once is flaky
    errored = Report(1, {A: "error", B: "passed", C: "passed"})
    judged = _judged([whole, errored], [after, after])
    assert (judged.fail_to_pass, judged.pass_to_pass, judged.validation.flaky_tests) == ([A], [B], [C])


@pytest.mark.pure
def test_a_stop_that_leaves_nothing_failing_says_so():
    judged = _judged([Report(2, {A: "passed"}, stopped=True)], [Report(0, {A: "passed", B: "passed"})])
    assert judged.validation.reason.startswith("tests_stopped: 1 run(s) stopped early")
    assert B in judged.validation.reason


@pytest.mark.pure
def test_a_missing_canary_is_excused_only_in_a_run_that_stopped():
    after = Report(0, {A: "passed"})
    whole = Report(1, {A: "failed"}, evidence=MISSING)
    assert _judged([whole], [after]).validation.reason.startswith("env_canaries_unreliable")
    # a stop explains a missing canary, nothing else: a must-fail canary that passed is forced whoever stopped
    forced = Report(3, {A: "failed"}, stopped=True, evidence=("canary_passed:self_contained",))
    assert _judged([forced], [after]).validation.reason.startswith("tampered")
    assert _judged([Report(3, {A: "failed"}, stopped=True, evidence=MISSING)], [after]).validation.valid
