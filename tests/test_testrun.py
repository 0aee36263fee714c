"""The test-run guard's host side: canaries planted into real test files, and the report's evidence rules.

The recorder itself runs in sandboxes in tests/test_verifier_exploits.py (every tamper class on both
backends) and tests/test_gold_patches.py (no honest run is called tampered).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from trialforge.envspec import EnvSpec
from trialforge.sandbox.base import TRUNCATION_MARK, ExecResult, Limits, SandboxSpec
from trialforge.testrun.canaries import Canary, plant
from trialforge.testrun.prepare import prepare
from trialforge.testrun.report import read_report
from trialforge.testrun.run import run_tests

TESTS = """import unittest

from calc import add, scale


def test_add():
    assert add(2, 3) == 5


def test_scale_label():
    assert scale("ab", 2) == "abab"


class TestMore(unittest.TestCase):
    def test_add_negative(self):
        self.assertEqual(add(-2, -3), -5)
"""
CALC = "def add(a, b):\n    return a + b\n\n\ndef scale(s, n):\n    return s * n\n"
IDS = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_scale_label", "tests/test_calc.py::TestMore"]


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "calc").mkdir()
    (tmp_path / "calc" / "__init__.py").write_text(CALC)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_calc.py").write_text(TESTS)
    return tmp_path


def _pytest(tree: Path) -> dict[str, str]:
    """Outcome per test id from a plain pytest run of the planted tree (its junit XML; no recorder)."""
    report = tree / "report.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "tests"]
    subprocess.run(argv, cwd=tree, capture_output=True, text=True, timeout=120)
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        cls = "TestMore::" if case.get("classname", "").endswith("TestMore") else ""
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcomes[f"tests/test_calc.py::{cls}{case.get('name')}"] = (
            "failed" if failed else "skipped" if skipped else "passed"
        )
    return outcomes


@pytest.mark.pure
@pytest.mark.parametrize("seed", range(6))
def test_planted_canaries_behave_as_declared_under_plain_pytest(tmp_path, seed):
    tree = _tree(tmp_path)
    canaries = plant(tree, IDS, random.Random(seed))
    source = (tree / "tests" / "test_calc.py").read_text()
    ast.parse(source)  # still a valid module
    assert TESTS.splitlines()[0] in source and all(line in source for line in TESTS.splitlines())  # nothing lost
    assert {c.must for c in canaries} == {"pass", "fail"} and len(canaries) == 3
    assert [c.kind for c in canaries].count("mutated_copy") == 1
    outcomes = _pytest(tree)
    for canary in canaries:
        assert outcomes[canary.node_id] == ("passed" if canary.must == "pass" else "failed"), canary
    assert all(
        outcomes[t] == "passed" for t in ("tests/test_calc.py::test_add", "tests/test_calc.py::test_scale_label")
    )
    assert len(outcomes) == 3 + 3  # the file's three tests and the three canaries, no name clashes


def _constants(function: ast.FunctionDef) -> list[object]:
    """The function's constants in order, a negative number one constant (``-3`` parses as minus applied to 3)."""
    signed = [n for n in ast.walk(function) if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub)]
    negated = {id(n.operand) for n in signed if isinstance(n.operand, ast.Constant)}
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.UnaryOp) and id(node.operand) in negated:
            found.append(-node.operand.value)
        elif isinstance(node, ast.Constant) and id(node) not in negated:
            found.append(node.value)
    return found


@pytest.mark.pure
def test_a_mutated_copy_is_its_source_with_one_constant_changed(tmp_path):
    tree = _tree(tmp_path)
    copies = []
    for seed in range(20):
        (tree / "tests" / "test_calc.py").write_text(TESTS)
        copy = next(c for c in plant(tree, IDS, random.Random(seed)) if c.kind == "mutated_copy")
        module = ast.parse((tree / "tests" / "test_calc.py").read_text())
        holders = [("", module.body)] + [(f"{c.name}::", c.body) for c in module.body if isinstance(c, ast.ClassDef)]
        functions = {f"{h}{n.name}": n for h, body in holders for n in body if isinstance(n, ast.FunctionDef)}
        mine, theirs = functions[copy.node_id.split("::", 1)[1]], functions[copy.source.split("::", 1)[1]]
        mine_consts, their_consts = _constants(mine), _constants(theirs)
        assert sum(a != b for a, b in zip(mine_consts, their_consts, strict=True)) == 1
        assert ast.dump(mine.args) == ast.dump(theirs.args)
        copies.append(copy.source)
    assert len(set(copies)) >= 2, "the copied test should vary between runs"


@pytest.mark.pure
def test_a_file_without_constant_expectations_gets_self_contained_canaries_only(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_truthy():\n    assert bool([1])\n")
    canaries = plant(tmp_path, ["tests/test_x.py::test_truthy"], random.Random(0))
    assert sorted((c.must, c.kind) for c in canaries) == [("fail", "self_contained"), ("pass", "self_contained")]


@pytest.mark.pure
def test_prepare_hashes_every_file_the_diff_left_alone_as_planted(tmp_path):
    tree = _tree(tmp_path)
    guard = prepare(tree, IDS, ["tests/test_calc.py"], changed=["calc/__init__.py"], rng=random.Random(3))
    digest = hashlib.sha256((tree / "tests/test_calc.py").read_bytes()).hexdigest()  # with its canaries
    assert guard.pristine == {"tests/test_calc.py": digest}  # calc/__init__.py is the diff's: not vouched for
    assert guard.test_files == ("tests/test_calc.py",)
    assert guard.must_fail == 2 and len(guard.extra_ids) == 3
    (tmp_path / "again").mkdir()
    untouched = prepare(_tree(tmp_path / "again"), IDS, ["tests/test_calc.py"], rng=random.Random(3))
    assert set(untouched.pristine) == {"calc/__init__.py", "tests/test_calc.py"}


# --- the report's rules, on streams built by hand -----------------------------------------------

MARKER = "f" * 48
FAIL = Canary("tests/t.py::test_c1", "fail", "self_contained")
PASS = Canary("tests/t.py::test_c2", "pass", "self_contained")
COPY = Canary("tests/t.py::test_c3", "fail", "mutated_copy", source="tests/t.py::test_real")


def _stream(*events: dict | list[dict], end: dict | None = None) -> str:
    flat = [e for item in events for e in (item if isinstance(item, list) else [item])]
    lines = [{"e": "start"}, *flat] + (
        [{"e": "end", "exit": 1, "stopped": False, **(end or {})}] if end is not None else []
    )
    return "".join(MARKER + json.dumps({**e, "s": i}) + "\n" for i, e in enumerate(lines))


def _t(test_id: str, outcome: str, **extra) -> list[dict]:
    """The recorder's events for one test: each phase as it ran, as reported, then its finish."""
    ended = {"passed": "ok", "failed": "raised", "skipped": "skip", "error": "raised"}[outcome]
    if outcome in ("skipped", "error"):  # ended in setup
        phases = [("setup", ended, "skipped" if outcome == "skipped" else "failed")]
    else:
        phases = [("setup", "ok", "passed"), ("call", ended, outcome)]
    events = []
    for when, ran, reported in [*phases, ("teardown", "ok", "passed")]:
        events += [
            {"e": "ran", "id": test_id, "w": when, "x": ran},
            {"e": "phase", "id": test_id, "w": when, "o": reported, **extra},
        ]
    return [*events, {"e": "test", "id": test_id}]


HONEST = (
    _t("tests/t.py::test_real", "passed"),
    _t(FAIL.node_id, "failed"),
    _t(PASS.node_id, "passed"),
    _t(COPY.node_id, "failed"),
)


def _read(stdout: str, exit_code: int = 1, selected=("tests/t.py::test_real",)):
    return read_report(ExecResult(exit_code, stdout, "", 0.1), MARKER, [FAIL, PASS, COPY], selected)


@pytest.mark.pure
def test_an_honest_stream_is_clean_and_canaries_are_not_outcomes():
    report = _read(_stream(*HONEST, end={}))
    assert report.evidence == () and report.reported
    assert report.outcomes == {"tests/t.py::test_real": "passed"}
    assert report.all_passed(["tests/t.py::test_real"])


REAL, C_FAIL, C_PASS, C_COPY = HONEST
CASES = {  # name: (stdout, exit status, the evidence expected)
    "foreign": (_stream(*HONEST, end={}) + "===== 1 passed =====\n", 1, "foreign_bytes_on_report_channel"),
    "twice": (_stream(*HONEST, REAL, end={}), 1, "test_reported_twice:tests/t.py::test_real"),
    "exit0": (_stream(*HONEST), 0, "exited_0_without_report"),
    "mismatch": (_stream(*HONEST, end={}), 0, "exit_status_mismatch:0!=1"),
    "contradicts": (_stream(*HONEST, end={"exit": 0}), 0, "exit_code_contradicts_outcomes:0"),
    "canary_pass": (
        _stream(REAL, _t(FAIL.node_id, "passed"), C_PASS, C_COPY, end={}),
        1,
        "canary_passed:self_contained",
    ),
    "copy_pass": (_stream(REAL, C_FAIL, C_PASS, _t(COPY.node_id, "passed"), end={}), 1, "canary_passed:mutated_copy"),
    "missing": (_stream(REAL, C_FAIL, C_COPY, end={}), 1, "canary_missing:self_contained"),
    "skipped": (_stream(REAL, C_FAIL, _t(PASS.node_id, "skipped"), C_COPY, end={}), 1, "canary_skipped:self_contained"),
    "failed": (_stream(REAL, C_FAIL, _t(PASS.node_id, "failed"), C_COPY, end={}), 1, "canary_failed:self_contained"),
    "skip_origin": (
        _stream(_t("tests/t.py::test_real", "skipped", k="calc/core.py"), C_FAIL, C_PASS, C_COPY, end={}),
        1,
        "skip_from_code_under_test:calc/core.py",
    ),
    "recorder": (_stream(*HONEST, {"e": "tamper", "what": "hooks_changed"}, end={}), 1, "hooks_changed"),
}


@pytest.mark.pure
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_kind_of_evidence_is_found(case):
    stdout, exit_code, expected = CASES[case]
    report = _read(stdout, exit_code)
    assert expected in report.evidence and report.tampered
    assert not report.all_passed(["tests/t.py::test_real"])


@pytest.mark.pure
def test_renumbered_or_forged_lines_break_the_stream():
    honest = _stream(*HONEST, end={})
    forged = honest.replace('"s": 2', '"s": 7')
    assert "report_stream_broken" in _read(forged).evidence


@pytest.mark.pure
def test_what_honest_runs_do_is_no_evidence():
    # a crash (no end, non-zero status) or a timeout: failed, not tampered
    assert _read(_stream(*HONEST[:2]), exit_code=-9).evidence == ()
    # a run stopped by --maxfail leaves canaries missing
    stopped = _stream(HONEST[0], HONEST[1], end={"stopped": True})
    assert _read(stopped).evidence == ()
    # a canary copy skipped together with its source (an optional dependency), and a must-pass canary erroring
    # in setup (the diff broke a fixture) are honest too
    skipped = _stream(
        _t("tests/t.py::test_real", "skipped"),
        HONEST[1],
        _t(PASS.node_id, "error"),
        _t(COPY.node_id, "skipped"),
        end={},
    )
    assert _read(skipped).evidence == ()
    # a whole module that failed to collect (an import error in the diff) has no canaries to report, nor has a
    # module that reported no test while another failed to collect
    broken = _stream({"e": "collect_error", "id": "tests/t.py"}, end={"exit": 2})
    assert _read(broken, exit_code=2).evidence == ()
    elsewhere = _stream({"e": "collect_error", "id": "tests/other.py"}, end={"exit": 2})
    assert _read(elsewhere, exit_code=2).evidence == ()
    # a module skipped at collection (importorskip, or a package helper's module-level skip in a whole-suite run)
    skipped_module = _stream({"e": "collect_skip", "id": "tests/t.py", "k": "calc/testing.py"}, end={"exit": 5})
    assert read_report(ExecResult(5, skipped_module, "", 0.1), MARKER, [FAIL, PASS, COPY], ()).evidence == ()
    # a report bigger than the sandbox's output cap: no report (a failure), not tampering
    full = _stream(*HONEST, end={})
    cut = full[:100] + TRUNCATION_MARK.format(dropped=123) + full[-100:]
    flooded = read_report(ExecResult(1, cut, "", 0.1, truncated=True), MARKER, [FAIL, PASS, COPY], ())
    assert (flooded.reported, flooded.evidence) == (False, ())
    # a skip raised by the code under test for a test nobody asked for (a whole-suite run) is not evidence
    other = _stream(*HONEST, _t("tests/t.py::test_other", "skipped", k="calc/x.py"), end={})
    assert _read(other).evidence == ()
    # a wrong answer that happens to be the copy's changed constant passes the copy and fails its source (validation's
    # run before the fix does this too): the copy passing is evidence only next to its source passing (CASES)
    collided = _stream(_t("tests/t.py::test_real", "failed"), C_FAIL, C_PASS, _t(COPY.node_id, "passed"), end={})
    assert _read(collided).evidence == ()


# --- the recorder in a sandbox ---------------------------------------------------------------------

SHADOW = "import os\nos.write(2, b'SHADOW LOADED\\n')\nos._exit(0)\n"


@pytest.mark.sandbox
def test_modules_of_the_workspace_cannot_stand_in_for_what_the_recorder_imports(tmp_path, bwrap_backend, base_image):
    """A pytest.py or json.py at the repository root (or on a PYTHONPATH inside it) would own the run."""
    tree = _tree(tmp_path)
    (tree / "calc" / "__init__.py").write_text(CALC.replace("a + b", "a - b"))  # the bug is back
    for name in ("pytest.py", "json.py", "hashlib.py", "importlib.py", "pluggy.py"):
        (tree / name).write_text(SHADOW)
    guard = prepare(tree, IDS, ["tests/test_calc.py"])
    sandbox = bwrap_backend.create(SandboxSpec(image=base_image.name, workspace=tree, limits=Limits()))
    try:
        report = run_tests(sandbox, IDS, timeout=60, guard=guard)
    finally:
        sandbox.close()
    assert "SHADOW LOADED" not in report.log_tail
    assert report.reported and report.evidence == ()
    assert report.outcome("tests/test_calc.py::test_add") == "failed"
    assert report.outcome("tests/test_calc.py::test_scale_label") == "passed"  # the code under test still imports


PLUGIN = "def pytest_collection_modifyitems(items):\n    items.sort(key=lambda item: item.name)\n"


@pytest.mark.sandbox
@pytest.mark.parametrize("diff_changed_it", [False, True])
def test_a_plugin_from_package_code_counts_only_when_the_diff_left_it_alone(
    tmp_path, bwrap_backend, base_image, diff_changed_it
):
    """A pristine conftest may load a plugin from the package (a common layout): fine while the diff did not
    touch that module; a module the diff changed that hooks into the report path is foreign."""
    tree = _tree(tmp_path)
    (tree / "calc" / "plugin.py").write_text(PLUGIN)
    (tree / "tests" / "conftest.py").write_text('pytest_plugins = ["calc.plugin"]\n')
    changed = ["calc/plugin.py"] if diff_changed_it else []
    guard = prepare(tree, IDS, ["tests/test_calc.py", "tests/conftest.py"], changed=changed)
    sandbox = bwrap_backend.create(SandboxSpec(image=base_image.name, workspace=tree, limits=Limits()))
    try:
        report = run_tests(sandbox, IDS, timeout=60, guard=guard)
    finally:
        sandbox.close()
    assert report.reported and report.outcome("tests/test_calc.py::test_add") == "passed"
    foreign = [e for e in report.evidence if e.startswith("foreign_hookimpl:pytest_collection_modifyitems")]
    assert bool(foreign) == diff_changed_it, report.evidence


# --- deselection, files without reports, repeated observations, collection errors -------------------------------


@pytest.mark.pure
def test_a_canary_the_task_options_deselected_is_not_missing_but_a_deselected_test_that_ran_is_evidence():
    deselected = {"e": "deselected", "ids": [PASS.node_id]}  # e.g. -k "not slow" and the canary's name has "slow"
    assert _read(_stream(REAL, C_FAIL, C_COPY, deselected, end={}), selected=()).evidence == ()
    assert _read(_stream(REAL, C_FAIL, C_COPY, end={})).evidence == ("canary_missing:self_contained",)
    ran_anyway = _read(_stream(*HONEST, deselected, end={}), selected=())
    assert ran_anyway.evidence == (f"deselected_test_ran:{PASS.node_id}",)


@pytest.mark.pure
def test_a_canary_deselected_in_a_run_whose_tests_the_host_named_is_evidence():
    """Grading names its tests and drops the task's selection options: only code deselects a canary there."""
    deselected = {"e": "deselected", "ids": [PASS.node_id]}
    assert _read(_stream(REAL, C_FAIL, C_COPY, deselected, end={})).evidence == ("canary_deselected:self_contained",)


@pytest.mark.pure
def test_canaries_of_a_file_that_reported_no_test_are_not_missing():
    """A file the task's options leave out (--ignore, a directory unittest does not discover) runs nothing at all;
    with its graded tests missing too, a tamper that drops a whole file earns nothing."""
    other = _stream(_t("tests/other.py::test_x", "passed"), end={"exit": 0})
    assert read_report(ExecResult(0, other, "", 0.1), MARKER, [FAIL, PASS, COPY], ()).evidence == ()


@pytest.mark.pure
def test_the_first_observation_of_a_phase_counts():
    """A test method called again after it raised (a unittest method can be called by anyone) rewrites nothing."""
    real = "tests/t.py::test_real"
    events = [
        {"e": "ran", "id": real, "w": "call", "x": "raised"},
        {"e": "ran", "id": real, "w": "call", "x": "ok"},
        {"e": "phase", "id": real, "w": "call", "o": "passed"},
        {"e": "test", "id": real},
    ]
    report = _read(_stream(events, C_FAIL, C_PASS, C_COPY, end={}))
    assert f"report_contradicts_run:{real}:call:raised" in report.evidence


@pytest.mark.pure
def test_a_collection_error_carries_its_first_error_line():
    message = "ModuleNotFoundError: No module named 'pkg'"
    report = _read(_stream({"e": "collect_error", "id": "tests/t.py", "m": message}, end={"exit": 2}), exit_code=2)
    assert report.evidence == () and report.outcomes == {"<collection>:tests/t.py": "error"}
    assert report.collection_errors == {"tests/t.py": message}


# --- plugins changed by pristine tests; modules that do not import ------------------------------------------------

# What flask's tests/test_logging.py does around every test: pytest's logging plugin out, then back in.
UNREGISTERS_LOGGING = """import pytest


@pytest.fixture(autouse=True)
def without_pytest_logging(pytestconfig):
    plugin = pytestconfig.pluginmanager.unregister(name="logging-plugin")
    yield
    if plugin:
        pytestconfig.pluginmanager.register(plugin, "logging-plugin")
"""
# The same change made from the code under test, which finds the plugin manager in its caller's frames.
PACKAGE_UNREGISTERS = """

import sys as _sys


def _plugin_manager():
    frame = _sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            found = getattr(getattr(value, "config", None), "pluginmanager", None)
            if found is not None:
                return found
        frame = frame.f_back


def add(a, b, _pm=_plugin_manager):
    pm = _pm()
    {action}
    return a + b
"""
ACTIONS = {
    "unregisters_a_plugin": 'pm.unregister(name="skipping")',  # xfail and skip marks: report-path hooks
    # renamed so that the pristine fixture's unregister(name="logging-plugin") takes the recorder out
    "renames_the_recorder": (
        'recorder = next(p for p in pm.get_plugins() if type(p).__name__ == "Recorder")\n'
        '    pm._name2plugin["logging-plugin"] = recorder'
    ),
    # pytest's own runtest_call implementation made to skip the test body, by an object equal to anything
    "swaps_a_hook_for_a_lookalike": (
        "class Same:\n"
        "        def __eq__(self, other):\n"
        "            return True\n"
        "        __hash__ = object.__hash__\n"
        "        def __call__(self, *args, **kwargs):\n"
        "            return None\n"
        "    for impl in pm.hook.pytest_runtest_call.get_hookimpls():\n"
        "        if impl.plugin_name == 'runner' and type(impl.function) is not Same:\n"
        "            impl.function = Same()"
    ),
}


def _run(tree: Path, backend, image, guard, ids=IDS):
    sandbox = backend.create(SandboxSpec(image=image.name, workspace=tree, limits=Limits()))
    try:
        return run_tests(sandbox, ids, timeout=60, guard=guard)
    finally:
        sandbox.close()


@pytest.mark.sandbox
def test_a_pristine_test_may_take_a_plugin_out_and_put_it_back(tmp_path, bwrap_backend, base_image):
    tree = _tree(tmp_path)
    (tree / "tests" / "conftest.py").write_text(UNREGISTERS_LOGGING)
    guard = prepare(tree, IDS, ["tests/test_calc.py", "tests/conftest.py"])
    report = _run(tree, bwrap_backend, base_image, guard)
    assert report.reported and report.evidence == (), report.evidence
    assert report.outcome("tests/test_calc.py::test_add") == "passed"


@pytest.mark.sandbox
@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_the_code_under_test_changing_plugins_is_evidence_even_beside_a_pristine_test_that_does(
    tmp_path, bwrap_backend, base_image, action
):
    tree = _tree(tmp_path)
    (tree / "tests" / "conftest.py").write_text(UNREGISTERS_LOGGING)
    (tree / "calc" / "__init__.py").write_text(
        CALC.replace("def add(a, b)", "def _add(a, b)") + PACKAGE_UNREGISTERS.format(action=ACTIONS[action])
    )
    guard = prepare(tree, IDS, ["tests/test_calc.py", "tests/conftest.py"], changed=["calc/__init__.py"])
    report = _run(tree, bwrap_backend, base_image, guard)
    assert "hooks_changed" in report.evidence, report.evidence


BROKEN_MODULE = "from calc import not_there\n\n\ndef test_never():\n    pass\n"


@pytest.mark.sandbox
@pytest.mark.parametrize("runner", ["pytest", "unittest"])
def test_a_module_that_does_not_import_leaves_the_other_modules_running(tmp_path, bwrap_backend, base_image, runner):
    """As ``pytest --continue-on-collection-errors`` (and unittest itself) run: one broken module is one
    collection error, every other module's tests still run, canaries included."""
    tree = _tree(tmp_path)
    (tree / "tests" / "test_broken.py").write_text(BROKEN_MODULE)
    if runner == "unittest":
        (tree / "tests" / "test_calc.py").write_text(TESTS.split("\n\n\ndef test_add")[0] + UNITTEST_ONLY)
    env = EnvSpec(test_cmd=("python3", "-m", "pytest") if runner == "pytest" else UNITTEST_CMD)
    guard = prepare(tree, [], ["tests/test_calc.py", "tests/test_broken.py"], plant_in=["tests/test_calc.py"],
                    runner=runner)  # fmt: skip
    sandbox = bwrap_backend.create(SandboxSpec(image=base_image.name, workspace=tree, limits=Limits()))
    try:
        report = run_tests(sandbox, None, timeout=60, guard=guard, env=env)
    finally:
        sandbox.close()
    assert report.reported and report.evidence == (), report.evidence
    assert set(report.collection_errors) == {"tests/test_broken.py"}
    assert "ImportError" in report.collection_errors["tests/test_broken.py"]
    assert report.outcome("tests/test_calc.py::TestMore::test_add_negative") == "passed"
    assert report.exit_code == 1 and all(report.canaries.get(c.node_id) for c in guard.canaries), report.canaries


UNITTEST_ONLY = """


class TestMore(unittest.TestCase):
    def test_add_negative(self):
        self.assertEqual(add(-2, -3), -5)
"""
UNITTEST_CMD = ("python3", "-m", "unittest", "discover", "-s", "tests")


# --- the CPU budget ---------------------------------------------------------------------------------------------

LOOP = "def add(a, b):\n    while a + b:\n        pass\n\n\ndef scale(s, n):\n    return s * n\n"
# The code under test ignores SIGXCPU: the hard limit a second later still ends it (SIGKILL).
DEAF_LOOP = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n\n" + LOOP


@pytest.mark.sandbox
@pytest.mark.parametrize("runner", ["pytest", "unittest"])
@pytest.mark.parametrize("calc", [LOOP, DEAF_LOOP], ids=["loop", "loop_ignoring_sigxcpu"])
def test_an_endless_loop_is_stopped_by_the_cpu_budget_long_before_the_wall_timeout(
    tmp_path, bwrap_backend, base_image, runner, calc
):
    """CPU time does not stretch on a loaded machine as wall time does: the budget ends the run (no report,
    ``cpu_exhausted`` when it is the budget's signal), and the wall timeout, far longer, never fires."""
    tree = _tree(tmp_path)
    if runner == "unittest":
        (tree / "tests" / "test_calc.py").write_text(TESTS.split("\n\n\ndef test_add")[0] + UNITTEST_ONLY)
    (tree / "calc" / "__init__.py").write_text(calc)
    env = EnvSpec(test_cmd=("python3", "-m", "pytest") if runner == "pytest" else UNITTEST_CMD)
    guard = prepare(tree, [], ["tests/test_calc.py"], runner=runner)
    sandbox = bwrap_backend.create(SandboxSpec(image=base_image.name, workspace=tree, limits=Limits()))
    try:
        report = run_tests(sandbox, None, timeout=60, guard=guard, env=env, cpu_s=1)
    finally:
        sandbox.close()
    assert not report.reported and not report.timed_out and report.evidence == ()
    assert report.cpu_exhausted == (calc is LOOP)  # SIGXCPU; the deaf loop dies of the SIGKILL after it


@pytest.mark.sandbox
def test_an_honest_run_within_its_cpu_budget_reports_as_without_one(tmp_path, bwrap_backend, base_image):
    tree = _tree(tmp_path)
    guard = prepare(tree, IDS, ["tests/test_calc.py"])
    sandbox = bwrap_backend.create(SandboxSpec(image=base_image.name, workspace=tree, limits=Limits()))
    try:
        report = run_tests(sandbox, IDS, timeout=60, guard=guard, cpu_s=30)
    finally:
        sandbox.close()
    assert report.reported and report.evidence == () and not report.cpu_exhausted
    assert len(report.outcomes) == 3 and set(report.outcomes.values()) == {"passed"}, report.outcomes
