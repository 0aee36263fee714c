"""Validation by execution: a flaky test is caught, a broken patch and a non-reproducing test are rejected;
a batch runs a shared fixed tree's suite once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trialforge.errors import SandboxError
from trialforge.sandbox.base import TRUNCATION_MARK, ExecResult, Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.patches import diff_trees, filter_patch, is_test_path
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore, tree_digest
from trialforge.tasks.validate import SuiteRuns, ValidateConfig, _judge, validate_task
from trialforge.testrun.report import OVERFLOWED, read_report
from trialforge.testrun.report import TestReport as Report  # not "Test*": pytest would collect it
from trialforge.testrun.run import REPORT_CAP_BYTES
from trialforge.verify.grader import Grader

BUGGY = "def double(x):\n    return x + x + 1\n"
BUGGY_TOO = "def double(x):\n    return x * 3\n"
FIXED = "def double(x):\n    return x + x\n"
# Fails on the 1st, 4th, 7th... run in a sandbox: a counter kept in the workspace survives between runs.
FLAKY = (
    "from pathlib import Path\n\n\ndef test_sometimes():\n"
    "    counter = Path('.flaky-count')\n"
    "    n = int(counter.read_text()) if counter.exists() else 0\n"
    "    counter.write_text(str(n + 1))\n"
    "    assert n % 3 != 0\n"
)
STEADY = "from calc import double\n\n\ndef test_double():\n    assert double(2) == 4\n"


def _task(
    tmp_path: Path, snapshots: SnapshotStore, tests: dict[str, str], gold: str | None = None, buggy: str = BUGGY
) -> Task:
    base = tmp_path / "base"
    (base / "tests").mkdir(parents=True)
    (base / "calc.py").write_text(buggy)
    fixed = tmp_path / "fixed"
    (fixed / "tests").mkdir(parents=True)
    (fixed / "calc.py").write_text(FIXED)
    for name, text in tests.items():
        (fixed / "tests" / name).write_text(text)
    diff = diff_trees(base, fixed)
    return Task(
        task_id="calc-1",
        source=Source(kind="synthetic", ref="test"),
        repo="calc",
        snapshot=snapshots.put(base),
        problem_statement="double(2) returns 5",
        gold_patch=gold if gold is not None else filter_patch(diff, lambda p: not is_test_path(p))[0],
        test_patch=filter_patch(diff, is_test_path)[0],
    )


@pytest.fixture
def snapshots(tmp_path):
    return SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")


def _validate(task, backend, image, snapshots, runs=3):
    return validate_task(task, backend, image.name, snapshots, Limits(), ValidateConfig(runs=runs))


@pytest.mark.sandbox
def test_a_test_that_fails_one_run_in_three_is_caught_as_flaky(tmp_path, snapshots, bwrap_backend, base_image):
    task = _task(tmp_path, snapshots, {"test_double.py": STEADY, "test_flaky.py": FLAKY})
    checked = _validate(task, bwrap_backend, base_image, snapshots)
    assert checked.validation.valid, checked.validation.reason
    assert checked.validation.flaky_tests == ["tests/test_flaky.py::test_sometimes"]
    assert checked.fail_to_pass == ["tests/test_double.py::test_double"]
    assert "tests/test_flaky.py::test_sometimes" not in checked.pass_to_pass  # quarantined
    assert checked.validation.runs == 6
    # what grading time limits scale from: measured, and within the validation it is part of (no speed assumed)
    assert 0 < checked.validation.slowest_run_s <= checked.validation.duration_s


@pytest.mark.sandbox
def test_a_task_that_depends_only_on_a_flaky_test_is_rejected(tmp_path, snapshots, bwrap_backend, base_image):
    task = _task(tmp_path, snapshots, {"test_flaky.py": FLAKY})
    checked = _validate(task, bwrap_backend, base_image, snapshots)
    assert not checked.validation.valid
    assert checked.validation.reason.startswith("no_fail_to_pass")


@pytest.mark.sandbox
def test_a_fix_that_does_not_apply_is_rejected(tmp_path, snapshots, bwrap_backend, base_image):
    bad = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-nothing like this\n+x\n"
    task = _task(tmp_path, snapshots, {"test_double.py": STEADY}, gold=bad)
    checked = _validate(task, bwrap_backend, base_image, snapshots, runs=1)
    assert not checked.validation.valid
    assert checked.validation.reason.startswith("patch_does_not_apply")


class CountingBackend:
    """The real backend, counting the sandboxes it starts."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.created = 0

    def create(self, spec):
        self.created += 1
        return self.inner.create(spec)


@pytest.mark.sandbox
def test_tasks_sharing_a_fixed_tree_run_its_suite_once(tmp_path, snapshots, bwrap_backend, base_image):
    """Two bugs in one file, one fixed tree: 2 'before' sandboxes, 1 'after' sandbox, both tasks valid."""
    tests = {"test_double.py": STEADY}
    tasks = [_task(tmp_path / "a", snapshots, tests), _task(tmp_path / "b", snapshots, tests, buggy=BUGGY_TOO)]
    backend, shared = CountingBackend(bwrap_backend), SuiteRuns()

    def one(task: Task) -> Task:
        return validate_task(task, backend, base_image.name, snapshots, Limits(), ValidateConfig(runs=2), shared)

    with ThreadPoolExecutor(max_workers=2) as pool:  # concurrent: the second waits for the first's run
        checked = list(pool.map(one, tasks))
    assert backend.created == 3 and shared.hits == 1
    assert [t.validation.valid for t in checked] == [True, True]
    assert [t.fail_to_pass for t in checked] == [["tests/test_double.py::test_double"]] * 2
    assert [t.validation.runs for t in checked] == [4, 4]


@pytest.mark.pure
def test_tree_digest_sees_contents_and_executable_bits(tmp_path):
    tree = tmp_path / "t"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "a.py").write_text("x = 1\n")
    first = tree_digest(tree)
    (tree / "pkg" / "__pycache__").mkdir()
    (tree / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"junk")
    assert tree_digest(tree) == first  # bytecode is not the code
    (tree / "pkg" / "a.py").chmod(0o755)
    assert tree_digest(tree) != first
    (tree / "pkg" / "a.py").chmod(0o644)
    (tree / "pkg" / "a.py").write_text("x = 2\n")
    assert tree_digest(tree) != first


@pytest.mark.pure
def test_runs_that_did_not_report_are_not_kept():
    shared, calls = SuiteRuns(), []

    def run(reported: bool):
        calls.append(reported)
        return [Report(exit_code=-1 if not reported else 0, reported=reported)]

    assert not shared.get("k", lambda: run(False))[0].reported  # e.g. a timeout: the next task tries again
    assert shared.get("k", lambda: run(True))[0].reported
    assert shared.get("k", lambda: run(True))[0].reported
    assert calls == [False, True] and shared.hits == 1

    def crash():
        raise SandboxError("the engine went away", cause="engine")

    with pytest.raises(SandboxError):
        shared.get("other", crash)
    assert shared.get("other", lambda: run(True))[0].reported  # a crash is not remembered either


# A "fix" that leaves the bug and forces every report to pass, reaching pytest without naming it.
TAMPERING_GOLD = (
    "import sys\n\n\ndef double(x):\n    return x + x + 1\n\n\n"
    "for _module in list(sys.modules.values()):\n"
    "    _cls = getattr(_module, 'Test' + 'Report', None)\n"
    "    if isinstance(_cls, type) and 'from_item_and_call' in vars(_cls):\n"
    "        _made = _cls.from_item_and_call\n"
    "        def _forced(item, call, _made=_made):\n"
    "            report = _made(item, call)\n"
    "            report.outcome, report.longrepr = 'passed', None\n"
    "            return report\n"
    "        _cls.from_item_and_call = staticmethod(_forced)\n"
)
# A test patch whose conftest forces every outcome: malicious (or broken) task data.
FORCING_CONFTEST = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)


@pytest.mark.sandbox
def test_a_gold_patch_that_tampers_with_the_run_does_not_validate(tmp_path, snapshots, bwrap_backend, base_image):
    base = tmp_path / "fixed_by_tamper"
    base.mkdir()
    (base / "calc.py").write_text(BUGGY)
    tampered = base.parent / "tampered"
    tampered.mkdir()
    (tampered / "calc.py").write_text(TAMPERING_GOLD)
    gold = diff_trees(base, tampered)
    task = _task(tmp_path, snapshots, {"test_double.py": STEADY}, gold=gold)
    checked = _validate(task, bwrap_backend, base_image, snapshots, runs=1)
    assert not checked.validation.valid
    assert checked.validation.reason.startswith("tampered: ") and "canary_passed" in checked.validation.reason


@pytest.mark.sandbox
def test_a_test_patch_whose_conftest_forces_outcomes_does_not_validate(tmp_path, snapshots, bwrap_backend, base_image):
    task = _task(tmp_path, snapshots, {"test_double.py": STEADY, "conftest.py": FORCING_CONFTEST})
    checked = _validate(task, bwrap_backend, base_image, snapshots, runs=1)
    assert not checked.validation.valid
    assert checked.validation.reason.startswith("tampered: ") and "canary_passed" in checked.validation.reason


# --- why a suite that cannot start is rejected, and when it is fine ------------------------------------------


def _task_from(tmp_path: Path, snapshots: SnapshotStore, base: dict[str, str], fixed: dict[str, str]) -> Task:
    trees = {}
    for name, files in (("base", base), ("fixed", fixed)):
        trees[name] = tmp_path / name
        for rel, text in files.items():
            (trees[name] / rel).parent.mkdir(parents=True, exist_ok=True)
            (trees[name] / rel).write_text(text)
    diff = diff_trees(trees["base"], trees["fixed"])
    return Task(
        task_id="calc-2",
        source=Source(kind="synthetic", ref="test"),
        repo="calc",
        snapshot=snapshots.put(trees["base"]),
        problem_statement="triple is missing",
        gold_patch=filter_patch(diff, lambda p: not is_test_path(p))[0],
        test_patch=filter_patch(diff, is_test_path)[0],
    )


TRIPLE_TESTS = "from calc import triple\n\n\ndef test_triple():\n    assert triple(2) == 6\n"


@pytest.mark.sandbox
def test_a_test_module_that_imports_what_the_fix_adds_validates(tmp_path, snapshots, bwrap_backend, base_image):
    """Before the fix only the test patch's new module fails to import: a good task, not a broken suite."""
    base = {"calc.py": FIXED, "tests/test_double.py": STEADY}
    fixed = {**base, "calc.py": FIXED + "\n\ndef triple(x):\n    return 3 * x\n", "tests/test_triple.py": TRIPLE_TESTS}
    checked = _validate(_task_from(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots, runs=1)
    assert checked.validation.valid, checked.validation.reason
    assert checked.fail_to_pass == ["tests/test_triple.py::test_triple"]
    # the other modules ran before the fix too: their tests are pass-to-pass, not claimed as fixed
    assert checked.pass_to_pass == ["tests/test_double.py::test_double"]


# tqdm's shape (issue #45): its suite errors on warnings, and what the bug leaves behind fails the run at its very end,
# once every test has reported (pytest 8.4+ turns an exception a __del__ raised after the last test into a warning at
# unconfigure, an error under -W error; here the suite's own end-of-run check, which every pytest raises the same way).
CLOSING = {
    "pyproject.toml": '[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n',
    "bar.py": (
        "INSTANCES = []\n\n\nclass Bar:\n    def __init__(self, total):\n        INSTANCES.append(self)\n"
        "        if total < 0:\n            raise ValueError(total)\n        self.total = total\n\n"
        "    def close(self):\n        return self.total\n"
    ),
    "tests/conftest.py": (
        "import bar\n\n\ndef pytest_unconfigure(config):\n    for one in bar.INSTANCES:\n        one.close()\n"
    ),
    "tests/test_bar.py": "from bar import Bar\n\n\ndef test_total():\n    assert Bar(2).total == 2\n",
}
CLOSING_TEST = (
    "import pytest\n\nimport bar\n\n\ndef test_a_bar_whose_init_failed_closes():\n"
    "    with pytest.raises(ValueError):\n        bar.Bar(-1)\n    assert bar.INSTANCES[-1].close() is None\n"
)


@pytest.mark.sandbox
def test_a_suite_that_fails_at_its_end_after_reporting_every_test_validates(
    tmp_path, snapshots, bwrap_backend, base_image
):
    """Before the fix pytest raises after the session ended: the recorder still reports every outcome."""
    fixed_bar = CLOSING["bar.py"].replace("        INSTANCES", "        self.total = None\n        INSTANCES")
    fixed = {**CLOSING, "bar.py": fixed_bar, "tests/test_close.py": CLOSING_TEST}
    checked = _validate(_task_from(tmp_path, snapshots, CLOSING, fixed), bwrap_backend, base_image, snapshots, runs=1)
    assert checked.validation.valid, checked.validation.reason
    assert checked.fail_to_pass == ["tests/test_close.py::test_a_bar_whose_init_failed_closes"]
    assert checked.pass_to_pass == ["tests/test_bar.py::test_total"]


# An order-dependent suite (tqdm's tests_synchronisation hangs once tests_tqdm has run): pytest runs test_a.py
# before the fix's test_b.py, whose autouse fixture changes what test_a.py checks.
IN_ORDER = {
    "calc.py": BUGGY,
    "tests/test_a.py": "import calc\n\n\ndef test_untouched():\n    assert not getattr(calc, 'USED', False)\n",
}
LATER = (
    "import pytest\n\nimport calc\n\n\n@pytest.fixture(autouse=True)\ndef _used():\n    calc.USED = True\n\n\n"
    "def test_double():\n    assert calc.double(2) == 4\n"
)


@pytest.mark.sandbox
def test_a_graded_run_keeps_the_suites_module_order(tmp_path, snapshots, bwrap_backend, base_image):
    fixed = {**IN_ORDER, "calc.py": FIXED, "tests/test_b.py": LATER}
    checked = _validate(_task_from(tmp_path, snapshots, IN_ORDER, fixed), bwrap_backend, base_image, snapshots, runs=1)
    assert checked.validation.valid, checked.validation.reason
    assert (checked.fail_to_pass, checked.pass_to_pass) == (
        ["tests/test_b.py::test_double"],
        ["tests/test_a.py::test_untouched"],
    )
    grader = Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits())
    verdict = grader.grade(checked, checked.gold_patch)
    assert verdict.reward == 1.0, verdict.reason


# A module of the repository's own that never imports from a tree that is not installed (click's tests read
# the package's distribution metadata at import).
READS_METADATA = (
    "import importlib.metadata\n\nVERSION = importlib.metadata.version('calc')\n\n\n"
    "def test_version():\n    assert VERSION\n"
)


@pytest.mark.sandbox
def test_a_module_that_never_imports_is_left_out_of_the_lists(tmp_path, snapshots, bwrap_backend, base_image):
    base = {"calc.py": BUGGY, "tests/test_meta.py": READS_METADATA}
    fixed = {**base, "calc.py": FIXED, "tests/test_double.py": STEADY}
    checked = _validate(_task_from(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots, runs=1)
    assert checked.validation.valid, checked.validation.reason
    assert checked.fail_to_pass == ["tests/test_double.py::test_double"] and checked.pass_to_pass == []
    assert checked.validation.not_importing == ["tests/test_meta.py"]


@pytest.mark.sandbox
def test_a_task_whose_only_changes_are_in_a_module_that_never_imports_says_so(
    tmp_path, snapshots, bwrap_backend, base_image
):
    """The environment lacks what a test module imports (a test requirement not detected): no fail-to-pass
    test is seen, and the reason names the module and its error rather than blaming the fix."""
    needs = "import not_installed_here\n\nfrom calc import double\n\n\ndef test_double():\n    assert double(2) == 4\n"
    base = {"calc.py": BUGGY, "tests/test_double.py": needs, "tests/test_steady.py": "def test_one():\n    pass\n"}
    fixed = {**base, "calc.py": FIXED, "tests/cases.txt": "2 4\n"}  # the test patch: data, no module (tomli's)
    checked = _validate(_task_from(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots, runs=1)
    reason = checked.validation.reason
    assert reason.startswith("no_fail_to_pass: no test fails before the fix; modules that import neither"), reason
    assert "tests/test_double.py: ModuleNotFoundError: No module named 'not_installed_here'" in reason


@pytest.mark.sandbox
def test_a_module_the_fix_leaves_unable_to_import_rejects_the_task(tmp_path, snapshots, bwrap_backend, base_image):
    uses_half = "from calc import half\n\n\ndef test_half():\n    assert half(4) == 2\n"
    base = {"calc.py": BUGGY + "\n\ndef half(x):\n    return x / 2\n", "tests/test_half.py": uses_half}
    fixed = {**base, "calc.py": FIXED, "tests/test_double.py": STEADY}  # the fix drops half()
    checked = _validate(_task_from(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots, runs=1)
    reason = checked.validation.reason
    assert not checked.validation.valid
    assert reason.startswith("collection_error_after_fix: tests/test_half.py: ImportError"), reason


@pytest.mark.sandbox
def test_a_suite_that_cannot_import_before_the_fix_is_rejected_with_its_error(
    tmp_path, snapshots, bwrap_backend, base_image
):
    """The code before the fix breaks every test module, not only the test patch's: nothing is tested before."""
    broken = BUGGY + "\n\nnot_defined_yet\n"
    other = "from calc import double\n\n\ndef test_zero():\n    assert double(0) == 0\n"
    base = {"calc.py": broken, "tests/test_other.py": other}
    fixed = {"calc.py": FIXED, "tests/test_other.py": other, "tests/test_double.py": STEADY}
    checked = _validate(_task_from(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots, runs=1)
    reason = checked.validation.reason
    assert not checked.validation.valid
    assert reason.startswith("collection_error_before_fix: ")
    assert "tests/test_other.py: NameError: name 'not_defined_yet' is not defined" in reason
    assert len(reason) <= len("collection_error_before_fix: ") + 500


@pytest.mark.pure
def test_a_suite_whose_report_overflows_says_so_rather_than_quoting_its_log():
    """pypa/packaging's 40,000-odd tests once filled the report cap: the reason is the cap, not a test's log line."""
    marker = "0" * 48
    stream = "".join(f'{marker}{{"e":"ran","id":"t.py::test_{i}","w":"call","x":"ok","s":{i}}}\n' for i in range(50))
    cut = stream[:200] + TRUNCATION_MARK.format(dropped=10**9) + stream[-200:]
    log = "E   email.errors.HeaderWriteError: folded header contains newline\n"
    silent = read_report(ExecResult(1, cut, log, 1.0, truncated=True), marker, [], ())
    assert not silent.reported
    task = Task(
        task_id="t", source=Source(kind="synthetic", ref="x"), repo="r", snapshot="s", problem_statement="p",
        gold_patch="", test_patch="",
    )  # fmt: skip
    judged = _judge(task, [silent], [silent], 0.0)
    assert judged.validation.reason == f"tests_did_not_run: {OVERFLOWED} ({REPORT_CAP_BYTES >> 20} MiB)"


@pytest.mark.sandbox
def test_a_base_tree_that_does_not_compile_on_the_python_is_an_environment_problem(
    tmp_path, snapshots, bwrap_backend, base_image
):
    """A module of another era (Python 2's print statement) that the fix leaves alone breaks the test patch's
    module before and after the fix: the environment's Python is at fault, not the fix (issue #45)."""
    base = {"calc.py": BUGGY + "\n\nfrom legacy import shout\n", "legacy.py": 'def shout():\n    print "hi"\n'}
    fixed = {**base, "calc.py": FIXED + "\n\nfrom legacy import shout\n", "tests/test_double.py": STEADY}
    checked = _validate(_task_from(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots, runs=1)
    reason = checked.validation.reason
    assert not checked.validation.valid
    assert reason.startswith("env_incompatible_python: the base tree does not compile on Python 3.11"), reason
    assert "tests/test_double.py: SyntaxError: Missing parentheses in call to 'print'" in reason, reason


@pytest.mark.sandbox
def test_a_fix_that_does_not_compile_is_still_the_fixs_fault(tmp_path, snapshots, bwrap_backend, base_image):
    base = {"calc.py": BUGGY, "tests/test_other.py": "def test_one():\n    pass\n"}
    fixed = {**base, "calc.py": FIXED + "\n\ndef broken(:\n    pass\n", "tests/test_double.py": STEADY}
    checked = _validate(_task_from(tmp_path, snapshots, base, fixed), bwrap_backend, base_image, snapshots, runs=1)
    assert checked.validation.reason.startswith("collection_error_after_fix: tests/test_double.py: "), (
        checked.validation.reason
    )
