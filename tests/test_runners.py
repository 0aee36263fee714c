"""Test runners beyond bare pytest: a task's ``EnvSpec.test_cmd`` and ``env``, under the same recorder.

unittest suites run in-process under the recorder, reported with pytest's ids and outcomes, with
canaries in unittest's form and the same tamper evidence; pytest options from the test command reach
pytest unless they would defeat the report; the spec's variables reach the run (a src layout imports)
except those that would swap the interpreter; a rejection says which error stopped the suite.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from support.fixtasks import fix_task

from trialforge.envspec import EnvSpec
from trialforge.funnel import Funnel
from trialforge.observe.metrics import task_metrics
from trialforge.observe.summary import print_summary
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.store.objstore import open_store
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.patches import test_files as files_of_tests  # not "test_*": pytest would collect it
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, record_verdicts, validate_task
from trialforge.testrun.canaries import plant
from trialforge.testrun.command import PYTEST_REFUSED, log_dropped, pytest_args, run_env, unittest_plan
from trialforge.testrun.prepare import prepare
from trialforge.testrun.run import run_tests
from trialforge.verify.grader import Grader, Verdict

UNITTEST = EnvSpec(test_cmd=("python3", "-m", "unittest", "discover", "-s", "tests", "-t", "."))


@pytest.fixture
def snapshots(tmp_path):
    return SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _task(tmp_path: Path, snapshots: SnapshotStore, base: dict[str, str], fixed: dict[str, str], env=None) -> Task:
    return fix_task(tmp_path, snapshots, base, fixed, env=env)


def _validate(task: Task, backend, image, snapshots, runs: int = 1) -> Task:
    return validate_task(task, backend, image.name, snapshots, Limits(), ValidateConfig(runs=runs))


def _run(backend, image, tree: Path, env: EnvSpec, ids=None, **prepare_args):
    guard = prepare(tree, ids or [], files_of_tests(tree), runner=env.runner, rng=random.Random(7), **prepare_args)
    sandbox = backend.create(SandboxSpec(image=image.name, workspace=tree, limits=Limits()))
    try:
        return run_tests(sandbox, ids, timeout=60, guard=guard, env=env), guard
    finally:
        sandbox.close()


# --- unittest ------------------------------------------------------------------------------------------------

BUGGY = "def double(x):\n    return x + x + 1\n\n\ndef half(x):\n    return x // 2\n"
FIXED = "def double(x):\n    return x + x\n\n\ndef half(x):\n    return x // 2\n"
UT_TESTS = """import unittest

from calc import double, half


class TestDouble(unittest.TestCase):
    def test_two(self):
        self.assertEqual(double(2), 4)

    def test_zero(self):
        self.assertEqual(double(0), 0)


class TestHalf(unittest.TestCase):
    def test_even(self):
        self.assertEqual(half(4), 2)

    @unittest.skip("not yet")
    def test_later(self):
        pass


def test_a_function_unittest_does_not_collect():
    assert double(1) == 99
"""
UT_BASE = {"calc.py": BUGGY, "tests/__init__.py": ""}
UT_FIXED = {"calc.py": FIXED, "tests/__init__.py": "", "tests/test_calc.py": UT_TESTS}


@pytest.mark.sandbox
def test_a_unittest_only_repository_validates_with_pytest_style_ids(tmp_path, snapshots, bwrap_backend, base_image):
    task = _task(tmp_path, snapshots, UT_BASE, UT_FIXED, env=UNITTEST)
    checked = _validate(task, bwrap_backend, base_image, snapshots, runs=2)
    assert checked.validation.valid, checked.validation.reason
    assert checked.fail_to_pass == [
        "tests/test_calc.py::TestDouble::test_two",
        "tests/test_calc.py::TestDouble::test_zero",
    ]
    assert checked.pass_to_pass == ["tests/test_calc.py::TestHalf::test_even"]  # the skipped test is neither
    # the planted canaries are TestCase classes and methods (pytest-style functions would be missing: tampered)
    assert checked.validation.runs == 4


@pytest.mark.sandbox
def test_a_test_command_that_finds_no_test_is_rejected_saying_so(tmp_path, snapshots, bwrap_backend, base_image):
    bare = EnvSpec(test_cmd=("python3", "-m", "unittest", "discover", "-s", "tests", "-p", "check_*.py"))
    checked = _validate(_task(tmp_path, snapshots, UT_BASE, UT_FIXED, env=bare), bwrap_backend, base_image, snapshots)
    expected = "no_tests_ran: `python3 -m unittest discover -s tests -p check_*.py` found no test"
    assert checked.validation.reason.startswith(expected)


# Every kind of result unittest knows; the same file run by pytest and by the unittest driver must agree.
KINDS = """import unittest


class TestKinds(unittest.TestCase):
    def test_pass(self):
        self.assertEqual(1 + 1, 2)

    def test_fail(self):
        self.assertEqual(1 + 1, 3)

    def test_error(self):
        raise RuntimeError("boom")

    @unittest.skip("no")
    def test_skipped(self):
        pass

    def test_skip_inside(self):
        self.skipTest("later")

    @unittest.expectedFailure
    def test_xfail(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_xpass(self):
        pass

    def test_subtest_fails(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertLess(i, 2)

    def test_subtests_pass(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertLess(i, 5)


class TestSetUpRaises(unittest.TestCase):
    def setUp(self):
        raise ValueError("setup")

    def test_a(self):
        pass


class TestClassFixtureRaises(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise ValueError("class")

    def test_b(self):
        pass

    def test_c(self):
        pass


class TestTearDownClassRaises(unittest.TestCase):
    @classmethod
    def tearDownClass(cls):
        raise ValueError("teardown class")

    def test_d(self):
        pass

    def test_e(self):
        pass


class TestAsync(unittest.IsolatedAsyncioTestCase):
    async def test_async_passes(self):
        self.assertEqual(await self.value(), 3)

    async def test_async_fails(self):
        self.assertEqual(await self.value(), 4)

    async def value(self):
        return 3
"""


@pytest.mark.sandbox
def test_unittest_outcomes_are_the_ones_pytest_reports(tmp_path, bwrap_backend, base_image):
    tree = _write(tmp_path / "kinds", {"tests/__init__.py": "", "tests/test_kinds.py": KINDS})
    by_unittest, _ = _run(bwrap_backend, base_image, tree, EnvSpec(test_cmd=("python3", "-m", "unittest")))
    by_pytest, _ = _run(bwrap_backend, base_image, tree, EnvSpec())
    assert by_unittest.evidence == () and by_pytest.evidence == ()
    assert by_unittest.outcomes == by_pytest.outcomes
    assert by_unittest.exit_code == by_pytest.exit_code == 1
    kinds = "tests/test_kinds.py::"
    assert {t.removeprefix(kinds): o for t, o in by_unittest.outcomes.items()} == {
        "TestKinds::test_pass": "passed",
        "TestKinds::test_fail": "failed",
        "TestKinds::test_error": "failed",
        "TestKinds::test_skipped": "skipped",
        "TestKinds::test_skip_inside": "skipped",
        "TestKinds::test_xfail": "skipped",
        "TestKinds::test_xpass": "failed",
        "TestKinds::test_subtest_fails": "failed",
        "TestKinds::test_subtests_pass": "passed",
        "TestSetUpRaises::test_a": "failed",
        "TestClassFixtureRaises::test_b": "error",
        "TestClassFixtureRaises::test_c": "error",
        "TestTearDownClassRaises::test_d": "passed",
        "TestTearDownClassRaises::test_e": "error",
        "TestAsync::test_async_passes": "passed",
        "TestAsync::test_async_fails": "failed",
    }
    # each failure's exception line, as validation states it: the same from either runner
    failing = kinds + "TestAsync::test_async_fails"
    assert by_unittest.failures[failing] == by_pytest.failures[failing] == "AssertionError: 3 != 4"


@pytest.mark.sandbox
def test_unittest_selection_by_id_runs_only_those_tests(tmp_path, bwrap_backend, base_image):
    tree = _write(tmp_path / "select", UT_FIXED)
    ids = ["tests/test_calc.py::TestDouble::test_two", "tests/test_calc.py::TestHalf"]
    report, guard = _run(bwrap_backend, base_image, tree, UNITTEST, ids, copy_from=ids[:1])
    assert report.evidence == ()
    assert report.outcomes == {
        "tests/test_calc.py::TestDouble::test_two": "passed",
        "tests/test_calc.py::TestHalf::test_even": "passed",
        "tests/test_calc.py::TestHalf::test_later": "skipped",
    }
    assert set(report.canaries) == {c.node_id for c in guard.canaries}  # the canaries ran with them


@pytest.mark.sandbox
def test_a_unittest_name_pattern_selects_and_the_canaries_it_leaves_out_are_no_evidence(
    tmp_path, bwrap_backend, base_image
):
    tree = _write(tmp_path / "pattern", {**UT_FIXED, "calc.py": BUGGY})
    env = EnvSpec(test_cmd=(*UNITTEST.test_cmd, "-k", "zero"))
    report, guard = _run(bwrap_backend, base_image, tree, env, plant_in=["tests/test_calc.py"])
    assert report.outcomes == {"tests/test_calc.py::TestDouble::test_zero": "failed"}
    assert len(report.canaries) < len(guard.canaries)  # some canaries left out by the pattern...
    assert report.evidence == ()  # ...and none of them counts as missing


# Each "fix" leaves the bug (double(2) == 5) and tampers with the unittest run in its own way.
UT_EXPLOITS = {
    "result_class_patched": BUGGY
    + "import unittest\nunittest.TestResult.addFailure = lambda self, test, err: self.addSuccess(test)\n",
    "testcase_run_forced": BUGGY
    + (
        "import unittest\n\n\ndef _run(self, result=None):\n    result.startTest(self)\n"
        "    result.addSuccess(self)\n    result.stopTest(self)\n\n\nunittest.TestCase.run = _run\n"
    ),
    "outcome_swallowed": BUGGY
    + (
        "import contextlib\nimport unittest.case\n\n\n@contextlib.contextmanager\n"
        "def _quiet(self, test_case, subTest=False):\n    try:\n        yield\n    except BaseException:\n"
        "        pass\n\n\nunittest.case._Outcome.testPartExecutor = _quiet\n"
    ),
    "result_instance_patched": (
        "import sys\n\n\ndef double(x):\n    frame = sys._getframe(1)\n    while frame is not None:\n"
        "        result = frame.f_locals.get('result')\n"
        "        if result is not None and hasattr(result, 'addFailure'):\n"
        "            result.addFailure = lambda test, err: result.addSuccess(test)\n"
        "            result.addError = lambda test, err: result.addSuccess(test)\n            break\n"
        "        frame = frame.f_back\n    return x + x + 1\n\n\ndef half(x):\n    return x // 2\n"
    ),
    "exit_0_mid_run": "import os\n\n\ndef double(x):\n    os._exit(0)\n\n\ndef half(x):\n    return x // 2\n",
    "forged_report_line": (
        "import os\n\n\ndef double(x):\n    for fd in range(3, 64):\n        try:\n"
        '            os.write(fd, b\'0\' * 48 + b\'{"e":"end","exit":0,"stopped":false,"s":9}\\n\')\n'
        "        except OSError:\n            pass\n    return x + x + 1\n\n\ndef half(x):\n    return x // 2\n"
    ),
}


@pytest.fixture(scope="module")
def unittest_grading(tmp_path_factory, bwrap_backend, base_image):
    root = tmp_path_factory.mktemp("unittest-grading")
    base = _write(root / "base", {**UT_FIXED, "calc.py": BUGGY})
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    task = Task(
        task_id="calc-ut",
        source=Source(kind="synthetic", ref="test"),
        repo="calc",
        snapshot=snapshots.put(base),
        problem_statement="double(2) returns 5",
        gold_patch="",
        test_patch="",
        fail_to_pass=["tests/test_calc.py::TestDouble::test_two", "tests/test_calc.py::TestDouble::test_zero"],
        pass_to_pass=["tests/test_calc.py::TestHalf::test_even"],
        env=UNITTEST,
    )
    grader = Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits(), test_timeout_s=60)
    return grader, task, base, root


def _fix(grading, name: str, calc: str) -> str:
    *_, base, root = grading
    tree = root / name
    shutil.copytree(base, tree)
    (tree / "calc.py").write_text(calc)
    return diff_trees(base, tree)


@pytest.mark.sandbox
@pytest.mark.parametrize("name", sorted(UT_EXPLOITS))
def test_a_unittest_run_that_is_tampered_with_scores_zero_with_evidence(unittest_grading, name):
    grader, task, *_ = unittest_grading
    verdict = grader.grade(task, _fix(unittest_grading, name, UT_EXPLOITS[name]))
    assert verdict.reward == 0.0, f"{name}: {verdict.reason}"
    assert verdict.status == "ok" and verdict.reason.startswith("tampered:"), verdict.reason
    assert [f for f in verdict.flags if f.startswith("tampered:")], verdict.flags


@pytest.mark.sandbox
def test_an_honest_unittest_fix_scores_one_without_flags(unittest_grading):
    grader, task, *_ = unittest_grading
    verdict = grader.grade(task, _fix(unittest_grading, "honest", FIXED))
    assert (verdict.reward, verdict.status, verdict.flags) == (1.0, "ok", []), verdict.reason
    assert verdict.outcomes == dict.fromkeys(task.fail_to_pass + task.pass_to_pass, "passed")


@pytest.mark.sandbox
def test_a_grading_reports_the_cpu_its_sandbox_used_and_a_cached_verdict_costs_nothing(unittest_grading):
    grader, task, *_ = unittest_grading
    diff = _fix(unittest_grading, "measured", FIXED + "\n# graded once, measured once\n")
    first, again = grader.grade(task, diff), grader.grade(task, diff)
    assert first.reward == again.reward == 1.0
    assert first.cpu_s > 0.01  # a Python interpreter started and ran the suite inside the verifier's cgroup
    assert again.cpu_s == 0.0  # the same code diff is graded once: the second asker ran nothing


# --- unittest canaries ------------------------------------------------------------------------------------------

CANARY_FILES = {
    "tests/__init__.py": "",
    "calc.py": FIXED,
    "tests/base.py": "import unittest\n\n\nclass Base(unittest.TestCase):\n    unit = 2\n",
    # TestCase imported by name; a class not called Test* (unittest runs it all the same)
    "tests/test_named.py": (
        '"""Named import."""\nfrom unittest import TestCase\n\nfrom calc import double\n\n\n'
        "class DoubleChecks(TestCase):\n    def test_double_two(self):\n        self.assertEqual(double(2), 4)\n\n"
        "    def test_double_three(self):\n        self.assertEqual(double(3), 6)\n"
    ),
    # unittest under another name
    "tests/test_alias.py": (
        "import unittest as ut\n\nfrom calc import half\n\n\nclass TestHalf(ut.TestCase):\n"
        "    def test_half_four(self):\n        self.assertEqual(half(4), 2)\n"
    ),
    # no unittest import at all: a base class from a helper module (the canary file gets `import unittest`)
    "tests/test_based.py": (
        "from calc import double\nfrom tests.base import Base\n\n\nclass TestBased(Base):\n"
        "    def test_double_unit(self):\n        self.assertEqual(double(self.unit), 4)\n"
    ),
}
OUTCOMES = """
import json, unittest
def flat(s):
    return [x for i in s for x in flat(i)] if isinstance(s, unittest.TestSuite) else [s]
suite = unittest.TestLoader().discover("tests", top_level_dir=".")
ids = [t.id() for t in flat(suite)]
result = unittest.TestResult()
suite.run(result)
bad = {t.id() for t, _ in result.failures + result.errors}
print(json.dumps({i: "failed" if i in bad else "passed" for i in ids}))
"""


@pytest.mark.pure
@pytest.mark.parametrize("seed", range(4))
def test_planted_unittest_canaries_behave_as_declared_under_plain_unittest(tmp_path, seed):
    tree = _write(tmp_path / "tree", CANARY_FILES)
    files = ["tests/test_named.py", "tests/test_alias.py", "tests/test_based.py"]
    canaries = plant(tree, [], random.Random(seed), files=files, runner="unittest")
    assert {c.file for c in canaries} == set(files)
    assert [c.kind for c in canaries].count("mutated_copy") == 3  # one per file (a random test of each)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([sys.executable, "-c", OUTCOMES], cwd=tree, capture_output=True, text=True, env=env)
    outcomes = json.loads(run.stdout)
    by_id = {c.node_id.replace(".py::", "::").replace("/", ".").replace("::", "."): c for c in canaries}
    for unittest_id, canary in by_id.items():
        assert outcomes[unittest_id] == ("passed" if canary.must == "pass" else "failed"), (canary, run.stderr)
    real = {t: o for t, o in outcomes.items() if t not in by_id}
    assert real == dict.fromkeys(real, "passed") and len(real) == 4  # the files' own tests, untouched
    assert "import unittest\n" in (tree / "tests/test_based.py").read_text()


@pytest.mark.pure
def test_a_unittest_module_that_picks_its_own_tests_gets_no_canaries(tmp_path):
    tree = _write(
        tmp_path / "tree",
        {
            "tests/test_picky.py": (
                "import unittest\n\n\nclass TestA(unittest.TestCase):\n    def test_a(self):\n"
                "        self.assertEqual(1, 1)\n\n\ndef load_tests(loader, tests, pattern):\n    return tests\n"
            )
        },
    )
    assert plant(tree, [], random.Random(0), files=["tests/test_picky.py"], runner="unittest") == []
    assert plant(tree, [], random.Random(0), files=["tests/test_picky.py"], runner="pytest")  # pytest ignores it


# --- pytest options from the test command ------------------------------------------------------------------------

OPTIONS_TESTS = """import pytest


def test_uses_the_plugin(answer):
    assert answer == 42


def test_fails_first():
    assert 1 == 2


@pytest.mark.fast
def test_fast():
    assert True


def test_slow_path():
    assert True
"""
PLUGIN = "import pytest\n\n\n@pytest.fixture\ndef answer():\n    return 42\n"


@pytest.mark.sandbox
def test_pytest_options_from_the_test_command_reach_pytest_and_defeating_ones_are_dropped(
    tmp_path, bwrap_backend, base_image
):
    tree = _write(tmp_path / "opts", {"myplugin.py": PLUGIN, "tests/test_opts.py": OPTIONS_TESTS})
    cmd = ("python3", "-m", "pytest", "-p", "myplugin", "-k", "not slow_path", "-x", "--co", "-p", "no:python",
           "--rootdir=/work/tests")  # fmt: skip
    report, _ = _run(bwrap_backend, base_image, tree, EnvSpec(test_cmd=cmd), plant_in=["tests/test_opts.py"])
    assert report.evidence == ()
    opts = "tests/test_opts.py::"
    assert report.outcome(opts + "test_uses_the_plugin") == "passed"  # -p loaded the tree's plugin
    assert opts + "test_slow_path" not in report.outcomes  # -k deselected it
    # -x, --co, -p no:python and --rootdir were dropped: the run went on after a failure, ran tests, kept the ids
    assert report.outcome(opts + "test_fails_first") == "failed" and report.outcome(opts + "test_fast") == "passed"


@pytest.mark.sandbox
def test_a_marker_selection_that_leaves_the_canaries_out_is_no_evidence(tmp_path, bwrap_backend, base_image):
    tree = _write(tmp_path / "marks", {"myplugin.py": PLUGIN, "tests/test_opts.py": OPTIONS_TESTS})
    env = EnvSpec(test_cmd=("python3", "-m", "pytest", "-m", "fast"))
    report, guard = _run(bwrap_backend, base_image, tree, env, plant_in=["tests/test_opts.py"])
    assert report.outcomes == {"tests/test_opts.py::test_fast": "passed"}
    assert guard.canaries and report.canaries == {}  # every canary deselected (none is marked fast)
    assert report.evidence == ()  # deselected by the task's -m, not missing


@pytest.mark.pure
def test_which_pytest_options_are_dropped_and_why():
    kept = ["-v", "-p", "xdist", "-p", "no:randomly", "-W", "error", "--import-mode=importlib", "-o", "x=1"]
    refused = ["-x", "--maxfail=2", "--co", "-c", "other.ini", "--rootdir", "/tmp", "-n", "4", "--pdb", "--lf",
               "-p", "no:unittest", "--basetemp=/work", "--reruns", "3"]  # fmt: skip
    whole = pytest_args([*kept, *refused, "-k", "not slow", "tests/unit"], named_tests=False)
    assert whole.args == [*kept, "-k", "not slow", "tests/unit"]
    assert [d.option for d in whole.dropped] == [
        "-x", "--maxfail=2", "--co", "-c other.ini", "--rootdir /tmp", "-n 4", "--pdb", "--lf", "-p no:unittest",
        "--basetemp=/work", "--reruns 3",
    ]  # fmt: skip
    assert all(d.reason for d in whole.dropped)
    assert {"-x", "--co", "-n", "--rootdir", "-c"} <= set(PYTEST_REFUSED)
    combined = pytest_args(["-xvs"], named_tests=False)
    assert (combined.args, [d.option for d in combined.dropped]) == (["-vs"], ["-x"])
    # a run that names its tests keeps the task's other options but not its selection
    named = pytest_args(["-k", "not slow", "-m", "fast", "tests/unit", "-p", "xdist", "-W", "error"], named_tests=True)
    assert named.args == ["-p", "xdist", "-W", "error"]
    assert [d.option for d in named.dropped] == ["-k not slow", "-m fast", "tests/unit"]
    # coverage (a tox.ini's `pytest --cov pkg --cov-report=term tests`) traces every line: dropped, paths kept
    cov = pytest_args(["--cov", "pkg", "--cov-report=term", "tests"], named_tests=False)
    assert (cov.args, [d.option for d in cov.dropped]) == (["tests"], ["--cov pkg", "--cov-report=term"])


@pytest.mark.pure
def test_unittest_options_become_a_plan():
    plan = unittest_plan(["discover", "-s", "tests", "-p", "check_*.py", "-t", ".", "-v", "-f", "-k", "fast"],
                         named_tests=False)  # fmt: skip
    assert (plan.start, plan.pattern, plan.top, plan.patterns) == ("tests", "check_*.py", ".", ["fast"])
    assert [d.option for d in plan.dropped] == ["-f"]  # failfast: stopping is the host's
    positional = unittest_plan(["discover", "src/tests", "*_test.py"], named_tests=False)
    assert (positional.start, positional.pattern, positional.top) == ("src/tests", "*_test.py", None)
    names = unittest_plan(["tests.test_a", "tests/test_b.py"], named_tests=False)
    assert names.names == ["tests.test_a", "tests/test_b.py"]
    assert unittest_plan([], named_tests=False).for_recorder() == {
        "start": ".", "pattern": "test*.py", "top": None, "names": [], "patterns": [],
    }  # fmt: skip
    named = unittest_plan(["discover", "-s", "tests", "-k", "fast"], named_tests=True)
    assert (named.top, named.names, named.patterns) == ("tests", [], [])  # module names stay relative to tests/


# --- the environment ----------------------------------------------------------------------------------------------

SRC_TESTS = "from pkg import double\n\n\ndef test_double():\n    assert double(2) == 4\n"


@pytest.mark.sandbox
def test_a_src_layout_validates_with_its_pythonpath_and_is_rejected_saying_why_without(
    tmp_path, snapshots, bwrap_backend, base_image
):
    base = {"src/pkg/__init__.py": BUGGY}
    fixed = {"src/pkg/__init__.py": FIXED, "tests/test_pkg.py": SRC_TESTS}
    with_env = _task(tmp_path / "a", snapshots, base, fixed, env=EnvSpec(env={"PYTHONPATH": "/work/src"}))
    checked = _validate(with_env, bwrap_backend, base_image, snapshots)
    assert checked.validation.valid, checked.validation.reason
    assert checked.fail_to_pass == ["tests/test_pkg.py::test_double"]

    without = _validate(with_env.model_copy(update={"env": None}), bwrap_backend, base_image, snapshots)
    reason = without.validation.reason
    assert not without.validation.valid
    assert reason == "collection_error_after_fix: tests/test_pkg.py: ModuleNotFoundError: No module named 'pkg'"
    funnel = Funnel("validate")
    assert record_verdicts([checked, without], funnel) == [checked]
    assert funnel.dropped == {"collection_error_after_fix": 1}  # counted by the short key
    out = io.StringIO()
    print_summary({"tasks": task_metrics([funnel.as_dict()])}, Console(file=out, width=200))
    assert "No module named 'pkg'" in out.getvalue()  # the summary shows why, not only how many


@pytest.mark.sandbox
def test_a_spec_cannot_swap_the_interpreter_through_path(tmp_path, bwrap_backend, base_image):
    """A python3 of the tree's, first on a spec's PATH, would run instead of the recorder (and exit 0)."""
    checks = "import os\n\n\ndef test_mode():\n    assert os.environ['CALC_MODE'] == 'strict'\n"
    tree = _write(tmp_path / "path", {"tests/test_env.py": checks, "bin/python3": "#!/bin/sh\necho fake\nexit 0\n"})
    (tree / "bin" / "python3").chmod(0o755)
    env = EnvSpec(env={"PATH": "/work/bin:/usr/bin:/bin", "LD_PRELOAD": "/work/evil.so", "CALC_MODE": "strict"})
    guard = prepare(tree, [], files_of_tests(tree), plant_in=["tests/test_env.py"], rng=random.Random(1))
    sandbox = bwrap_backend.create(SandboxSpec(image=base_image.name, workspace=tree, limits=Limits()))
    try:
        trap = sandbox.exec(["python3", "-c", "print('real')"], env={"PATH": env.env["PATH"]}, timeout=30)
        report = run_tests(sandbox, None, timeout=60, guard=guard, env=env)
    finally:
        sandbox.close()
    assert trap.stdout.strip() == "fake"  # the trap works where PATH is honoured
    assert report.reported and report.evidence == ()  # the image's python3 ran the recorder
    assert report.outcome("tests/test_env.py::test_mode") == "passed"  # the spec's other variables arrived
    kept, dropped = run_env(env.env)
    assert kept == {"CALC_MODE": "strict"} and [d.option.split("=")[0] for d in dropped] == ["PATH", "LD_PRELOAD"]
    assert run_env({"PYTHONPATH": "/work/src", "PYTHONHOME": "/work", "PYTHONSTARTUP": "/work/x.py"})[0] == {
        "PYTHONPATH": "/work/src"
    }


@pytest.mark.pure
def test_canaries_written_for_one_runner_are_refused_by_the_other(tmp_path):
    tree = _write(tmp_path / "t", UT_FIXED)
    guard = prepare(tree, [], files_of_tests(tree), plant_in=["tests/test_calc.py"], runner="pytest")
    with pytest.raises(ValueError, match="canaries were planted for pytest"):
        run_tests(None, None, timeout=1, guard=guard, env=UNITTEST)  # type: ignore[arg-type]  # refused first


@pytest.mark.pure
def test_a_graded_run_dropping_the_tasks_selection_is_no_warning_but_a_refused_option_is(caplog):
    """Every graded run names its tests and drops -k/-m/paths by design: an info line, where -x is a warning."""
    caplog.set_level(logging.INFO, logger="trialforge.testrun.command")
    log_dropped("graded", pytest_args(["-m", "not stress", "tests"], named_tests=True).dropped)
    log_dropped("whole suite", pytest_args(["-x", "-m", "not stress"], named_tests=False).dropped)
    levels = {r.getMessage().split(":")[0]: r.levelname for r in caplog.records}
    assert levels == {"graded": "INFO", "whole suite": "WARNING"}


# --- graded runs of suites shaped like real ones ----------------------------------------------------------------

SELF_NAMING = {
    "kit.py": "def check(cls):\n    raise TypeError(f'bad {cls.__name__}')\n",
    # typeguard's shape: the message a test expects spells the test's own qualified name
    "tests/test_kit.py": (
        "import pytest\nfrom kit import check\n\n\nclass TestCheck:\n    def test_local_class(self):\n"
        "        class Foo:\n            pass\n\n        pytest.raises(TypeError, check, Foo).match(\n"
        '            rf"bad {__name__}\\.{type(self).__name__}\\.test_local_class\\.<locals>\\.Foo"\n        )\n\n'
        "    def test_builtin(self):\n        pytest.raises(TypeError, check, int).match('bad builtins.int')\n"
    ),
}
QUALIFIED = "def check(cls):\n    raise TypeError(f'bad {cls.__module__}.{cls.__qualname__}')\n"
LOCAL_CLASS = {
    "kit.py": "def describe(cls):\n    return cls.__name__\n",
    "tests/test_kit.py": (
        "from kit import describe\n\n\nclass TestDescribe:\n    def test_local_class(self):\n"
        "        class Foo:\n            pass\n\n"
        '        assert describe(Foo) == f"{__name__}.{type(self).__name__}.test_local_class.<locals>.Foo"\n'
    ),
}


def _gold_and_empty(task: Task, bwrap_backend, base_image, snapshots, wrong: str = "") -> tuple[Task, Verdict]:
    """The task validated; its gold patch must score 1, the empty diff 0 and a ``wrong`` fix 0 (returned: which
    tests failed with the empty diff)."""
    checked = _validate(task, bwrap_backend, base_image, snapshots)
    assert checked.validation.valid, checked.validation.reason
    grader = Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits(), test_timeout_s=60)
    gold, empty = grader.grade(checked, checked.gold_patch), grader.grade(checked, "")
    assert (gold.reward, empty.reward) == (1.0, 0.0), gold.reason
    if wrong:
        assert grader.grade(checked, wrong).reward == 0.0
    return checked, empty


def _code_diff(tmp_path: Path, base: dict[str, str], changed: dict[str, str]) -> str:
    """The diff that turns ``base`` into ``base`` updated with ``changed`` (a fix a policy could submit)."""
    before, after = _write(tmp_path / "diff-a", base), _write(tmp_path / "diff-b", {**base, **changed})
    return diff_trees(before, after)


@pytest.mark.sandbox
def test_a_test_that_spells_its_own_name_keeps_it_when_graded(tmp_path, snapshots, bwrap_backend, base_image):
    fixed = {**SELF_NAMING, "kit.py": QUALIFIED}
    task = _task(tmp_path, snapshots, SELF_NAMING, fixed)
    checked, _ = _gold_and_empty(task, bwrap_backend, base_image, snapshots)
    assert checked.fail_to_pass == [
        "tests/test_kit.py::TestCheck::test_builtin",
        "tests/test_kit.py::TestCheck::test_local_class",
    ]


@pytest.mark.sandbox
def test_code_under_test_called_on_a_local_class_is_never_recorded_as_the_expected_value(
    tmp_path, snapshots, bwrap_backend, base_image
):
    # the f-string reads `self`: not an expected side; `describe(Foo)` was taken for one (Foo, a class the test
    # defines, did not count as local), recorded from the gold patch's run and the f-string observed: every diff passed
    fixed = {**LOCAL_CLASS, "kit.py": "def describe(cls):\n    return f'{cls.__module__}.{cls.__qualname__}'\n"}
    _, empty = _gold_and_empty(_task(tmp_path, snapshots, LOCAL_CLASS, fixed), bwrap_backend, base_image, snapshots)
    assert empty.outcomes == {"tests/test_kit.py::TestDescribe::test_local_class": "failed"}


@pytest.mark.sandbox
def test_a_test_another_test_file_calls_keeps_its_name_when_graded(tmp_path, snapshots, bwrap_backend, base_image):
    # idna's codec tests call test_idna.IDNATests().test_decode(...): renamed in its own file, it was missing there
    base = {
        "kit.py": "def double(x):\n    return x + x + 1\n",
        "tests/__init__.py": "",
        "tests/test_base.py": "from kit import double\n\n\ndef test_double():\n    assert double(2) == 4\n",
        "tests/test_again.py": "from . import test_base\n\n\ndef test_double_again():\n    test_base.test_double()\n",
    }
    fixed = {**base, "kit.py": "def double(x):\n    return x * 2\n"}
    checked, _ = _gold_and_empty(_task(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots)
    assert checked.fail_to_pass == ["tests/test_again.py::test_double_again", "tests/test_base.py::test_double"]


@pytest.mark.sandbox
def test_an_expected_line_number_is_judged_in_process_not_recorded(tmp_path, snapshots, bwrap_backend, base_image):
    # typeguard: `warning.lineno == test_f.__code__.co_firstlineno + 2`, recorded from validation's file, then
    # compared with a line of the graded file, which blinding reprints
    test = (
        "import warnings\n\nfrom kit import check\n\n\n# a comment the reprint drops\n\n\ndef test_warns():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n        warnings.simplefilter('always')\n"
        "        check()\n    assert caught[0].lineno == test_warns.__code__.co_firstlineno + 3\n"
    )
    kit = "import warnings\n\n\ndef check():\n    warnings.warn('checked', stacklevel={})\n"
    base = {"kit.py": kit.format(1), "tests/test_kit.py": test}
    fixed = {**base, "kit.py": kit.format(2)}
    checked, _ = _gold_and_empty(_task(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots)
    assert checked.fail_to_pass == ["tests/test_kit.py::test_warns"]


# typeguard (agronholm/typeguard): the graded file was reprinted from its syntax tree, which moved lines (a blank line
# before a nested def, comments, the docstring, a constant and a test that is not graded taken out), so
# `lineno == test.__code__.co_firstlineno + 3` failed for the gold patch; and canaries planted above a test moved it
WHERE_TESTS = """\"\"\"Checks of returned values: 7 is the answer.\"\"\"

import warnings

from kit import check

ANSWER = 7  # read only by an expected side: it leaves the graded file


def test_always_broken():
    assert check(1) == 2  # fails with and without the fix: not graded, so not in the graded file


def test_answer():
    assert check(
        7
    ) == ANSWER


def test_warns_where_the_value_is_returned():
    def returns_a_string():
        return check("aa")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returns_a_string()
    lines = [w.lineno for w in caught if "is not an int" in str(w.message)]
    assert lines == [test_warns_where_the_value_is_returned.__code__.co_firstlineno + 2]
    assert returns_a_string.__code__.co_firstlineno == 21
"""
WHERE_KIT = (
    "import warnings\n\n\ndef check(value):\n    if not isinstance(value, int):\n"
    "        warnings.warn(f'{value!r} is not an int', stacklevel={})\n    return value\n"
)


@pytest.mark.sandbox
def test_a_graded_file_keeps_every_line_where_the_test_has_it(tmp_path, snapshots, bwrap_backend, base_image):
    base = {"kit.py": WHERE_KIT.replace("{}", "1"), "tests/test_kit.py": WHERE_TESTS}
    fixed = {**base, "kit.py": WHERE_KIT.replace("{}", "2")}
    wrong = _code_diff(tmp_path, base, {"kit.py": WHERE_KIT.replace("{}", "3")})  # warns at the caller's line
    task = _task(tmp_path, snapshots, base, fixed)
    checked, _ = _gold_and_empty(task, bwrap_backend, base_image, snapshots, wrong=wrong)
    assert checked.fail_to_pass == ["tests/test_kit.py::test_warns_where_the_value_is_returned"]
    assert checked.validation.host_judged is not None
    assert checked.validation.host_judged.in_process == []  # the line number 21 is judged on the host


# marshmallow: TestFieldInheritance compares `_declared_fields` with a local dict of fields (equal by identity);
# validation recorded that dict as an expected value by instance state, which holds a process-wide creation counter,
# so a graded run that ran fewer tests before it made other numbers and the gold patch scored 0
COUNTED_KIT = """import copy
import itertools

_created = itertools.count()


class Field:
    def __init__(self):
        self.index = next(_created)


def declared(cls):
    return {BODY}
"""
COUNTED_TESTS = """from kit import Field, declared


def test_fields_made_before():
    Field()
    assert declared(int) == {"x": 1}


def test_inherited():
    expected = {"a": Field(), "b": Field()}

    class A:
        a = expected["a"]

    class B(A):
        b = expected["b"]

    assert declared(B) == expected
"""


@pytest.mark.sandbox
def test_an_expected_value_a_graded_run_cannot_reproduce_is_judged_in_process(
    tmp_path, snapshots, bwrap_backend, base_image
):
    own = "{k: v for k, v in vars(cls).items() if isinstance(v, Field)}"
    every = "{k: v for c in cls.__mro__[::-1] for k, v in vars(c).items() if isinstance(v, Field)}"
    copies = "{k: copy.copy(v) for c in cls.__mro__[::-1] for k, v in vars(c).items() if isinstance(v, Field)}"
    base = {"kit.py": COUNTED_KIT.replace("{BODY}", own), "tests/test_kit.py": COUNTED_TESTS}
    fixed = {**base, "kit.py": COUNTED_KIT.replace("{BODY}", every)}
    wrong = _code_diff(tmp_path, base, {"kit.py": COUNTED_KIT.replace("{BODY}", copies)})  # equal state, not the same
    task = _task(tmp_path, snapshots, base, fixed)
    checked, _ = _gold_and_empty(task, bwrap_backend, base_image, snapshots, wrong=wrong)
    assert checked.fail_to_pass == ["tests/test_kit.py::test_inherited"]
    judged = checked.validation.host_judged
    assert judged is not None
    assert (judged.in_process, judged.recorded) == (["tests/test_kit.py::test_inherited#0"], {})


@pytest.mark.sandbox
def test_a_file_of_more_tests_than_two_of_its_words_can_name_is_graded(tmp_path, snapshots, bwrap_backend, base_image):
    # idna's test_idna_uts46.py: 6,333 tests named test_uts46_N, one word of the file's own and ten borrowed
    many = "".join(f"\n\ndef test_uts46_{n}():\n    assert ok({n})\n" for n in range(150))
    base = {"kit.py": "def ok(n):\n    return n != 7\n", "tests/test_uts.py": "from kit import ok\n" + many}
    fixed = {**base, "kit.py": "def ok(n):\n    return True\n"}
    checked, _ = _gold_and_empty(_task(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots)
    assert checked.fail_to_pass == ["tests/test_uts.py::test_uts46_7"]
    assert len(checked.pass_to_pass) == 149
