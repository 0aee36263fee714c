"""A repository whose own untouched code introspects the interpreter still gives tasks: its evidence is its baseline.

Five small repositories, each with a library module that does what real libraries do and the in-process detectors
cannot tell from tampering: (a) walks the collector, (b) reads every thread's frames, (c) sets a function's
defaults at run time, (d) installs trace and profile functions around a call (as a coverage tool does), (e) wraps
pytest's assertion explainer at import. Each task validates with that evidence recorded as its baseline; the gold
patch scores 1 with ``baseline:`` flags, the empty diff 0, and a diff that adds evidence of a kind the baseline does
not hold scores 0 as tampered. What cannot be a baseline (forced outcomes, an unreadable report, per-test evidence,
canaries) rejects the task with its own reason. docs/verification.md, "By detection".
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, _judge, validate_task
from trialforge.testrun.baseline import rejection
from trialforge.testrun.report import TestReport as Report  # not "Test*": pytest would collect it
from trialforge.verify.grader import Grader
from trialforge.verify.grader import _judge as grade_report

BUGGY = "from intro import probe\n\n\ndef double(x):\n    return x + x + 1\n"
FIXED = "from intro import probe\n\n\ndef double(x):\n    return x + x\n"
# The fix, and a walk of the collector's referrers from the changed module: a kind no fixture's baseline holds.
TAMPERING = "import gc\n\nfrom intro import probe\n\n\ndef double(x):\n    gc.get_referrers(double)\n    return x + x\n"
SLOW = pytest.mark.slow
HIDDEN = "from intro.core import double\n\n\ndef test_double():\n    assert double(21) == 42\n"

# Per repository: its library module (intro/probe.py), the test of it already in the repository, and the evidence
# its untouched code gives.
PROBES = {
    "gc_walk": (
        "import gc\n\n\nclass Widget:\n    pass\n\n\n"
        "def live_widgets():\n    return sum(isinstance(o, Widget) for o in gc.get_objects())\n",
        "from intro.probe import Widget, live_widgets\n\n\n"
        "def test_live_widgets():\n    kept = Widget()\n    assert live_widgets() >= 1\n    assert kept\n",
        ["gc.get_objects"],
    ),
    "thread_frames": (
        "import sys\n\n\ndef stacks():\n"
        "    return {tid: frame.f_code.co_name for tid, frame in sys._current_frames().items()}\n",
        "from intro.probe import stacks\n\n\ndef test_stacks():\n    assert len(stacks()) >= 1\n",
        ["sys._current_frames"],
    ),
    "defaults_at_run_time": (
        "def bind(function, *values):\n    function.__defaults__ = values\n    return function\n",
        "from intro.probe import bind\n\nSCALE = bind(lambda x=None: x, 3)\n\n\n"
        "def test_bind():\n    assert SCALE() == 3\n",
        ["patched_live:<lambda>.__defaults__"],
    ),
    # boltons: its own tests bind a local lambda's defaults, so the evidence names the test function, which grading
    # renames (its gold patches scored 0 as tampered until the host read the evidence under the original names)
    "defaults_in_a_test": (
        "def bind(function, *values):\n    function.__defaults__ = values\n    return function\n",
        "from intro.probe import bind\n\n\ndef test_bind_local():\n    f = bind(lambda x=None: x, 3)\n"
        "    assert f() == 3\n",
        ["patched_live:test_bind_local.<locals>.<lambda>.__defaults__"],
    ),
    "trace_and_profile": (
        "import sys\n\n\ndef calls_and_lines(function, *args):\n    seen = []\n\n"
        "    def tracer(frame, event, arg):\n        seen.append(event)\n        return tracer\n\n"
        "    trace, profile = sys.gettrace(), sys.getprofile()\n"
        "    sys.settrace(tracer)\n    sys.setprofile(tracer)\n"
        "    try:\n        function(*args)\n"
        "    finally:\n        sys.settrace(trace)\n        sys.setprofile(profile)\n"
        "    return seen\n",
        "from intro.probe import calls_and_lines\n\n\ndef twice(n):\n    return n * 2\n\n\n"
        "def test_calls_and_lines():\n    assert 'line' in calls_and_lines(twice, 3)\n",
        ["sys.setprofile", "sys.settrace"],
    ),
    "pytest_patched_at_import": (
        "import sys\n\n_util = sys.modules.get('_pytest.assertion.util')\n"
        "if _util is not None:  # nicer failure diffs for our objects, when pytest runs us\n"
        "    _explain = _util.assertrepr_compare\n\n"
        "    def assertrepr_compare(*args, **kwargs):\n        return _explain(*args, **kwargs)\n\n"
        "    _util.assertrepr_compare = assertrepr_compare\n",
        "import intro.probe\n\n\ndef test_loaded():\n    assert intro.probe.__name__ == 'intro.probe'\n",
        ["framework_patched:_pytest.assertion.util.assertrepr_compare"],
    ),
}
# The explainer repository's fix, wrapping another of pytest's functions too: exactly the baseline's location counts.
PATCHES_MORE = FIXED + (
    "\nimport _pytest.assertion.util as _util\n\n_format = _util.format_explanation\n"
    "_util.format_explanation = lambda *args, **kwargs: _format(*args, **kwargs)\n"
)


def _write(tree: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)


def _diff(base: Path, root: Path, name: str, core: str) -> str:
    tree = root / name
    shutil.copytree(base, tree)
    (tree / "intro/core.py").write_text(core)
    return diff_trees(base, tree)


# Every repository on bwrap; on docker, the one real repositories showed (tomli's and jinja's suites set defaults).
CASES = [*((kind, "bwrap") for kind in sorted(PROBES)), pytest.param(("defaults_at_run_time", "docker"), marks=SLOW)]


@pytest.fixture(scope="module", params=CASES, ids="-".join)
def introspecting(request, base_image, tmp_path_factory):
    """A repository whose library introspects, its task validated for real on the backend, and its grader."""
    kind, backend_name = request.param
    backend = request.getfixturevalue(f"{backend_name}_backend")
    probe, test, _ = PROBES[kind]
    root = tmp_path_factory.mktemp(kind)
    base, hidden = root / "base", root / "hidden"
    files = {"intro/__init__.py": "", "intro/probe.py": probe, "intro/core.py": BUGGY, "tests/test_probe.py": test}
    _write(base, files)
    shutil.copytree(base, hidden)
    (hidden / "tests/test_core.py").write_text(HIDDEN)
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    task = Task(
        task_id=f"intro-{kind}", source=Source(kind="synthetic", ref="test"), repo="intro",
        snapshot=snapshots.put(base), problem_statement="double(21) is 43",
        gold_patch=_diff(base, root, "fixed", FIXED), test_patch=diff_trees(base, hidden),
    )  # fmt: skip
    validated = validate_task(task, backend, base_image.name, snapshots, Limits(), ValidateConfig(runs=1))
    grader = Grader(backend, base_image.name, base_image.digest, snapshots, Limits(), test_timeout_s=60)
    return kind, validated, grader, base, root


@pytest.mark.sandbox
def test_a_repository_whose_own_code_introspects_validates_with_its_evidence_as_baseline(introspecting) -> None:
    kind, task, *_ = introspecting
    assert task.validation.valid, task.validation.reason
    assert task.validation.baseline_evidence == PROBES[kind][2]
    assert task.fail_to_pass == ["tests/test_core.py::test_double"]
    assert [t.split("::")[0] for t in task.pass_to_pass] == ["tests/test_probe.py"]  # the library's own test


@pytest.mark.sandbox
def test_its_gold_patch_scores_one_with_the_baseline_as_audit_flags(introspecting) -> None:
    kind, task, grader, *_ = introspecting
    gold = grader.grade(task, task.gold_patch)
    assert (gold.reward, gold.status, gold.reason) == (1.0, "ok", "all_tests_passed"), gold.reason
    assert gold.flags == [f"baseline:{e}" for e in PROBES[kind][2]]
    empty = grader.grade(task, "")
    assert empty.reward == 0.0 and not [f for f in empty.flags if f.startswith("tampered:")], empty.reason


@pytest.mark.sandbox
def test_a_diff_that_adds_evidence_beyond_the_baseline_scores_zero_as_tampered(introspecting) -> None:
    _, task, grader, base, root = introspecting
    verdict = grader.grade(task, _diff(base, root, "tampering", TAMPERING))
    assert verdict.reward == 0.0 and verdict.reason.startswith("tampered: "), verdict.reason
    assert "tampered:gc.get_referrers" in verdict.flags


@pytest.mark.sandbox
@pytest.mark.parametrize("introspecting", [("pytest_patched_at_import", "bwrap")], indirect=True, ids="-".join)
def test_the_baseline_is_exact_not_a_kind(introspecting) -> None:
    """pytest's explainer wrapped by the library is baseline; another of pytest's functions wrapped is not."""
    _, task, grader, base, root = introspecting
    verdict = grader.grade(task, _diff(base, root, "patches-more", PATCHES_MORE))
    assert verdict.reward == 0.0, verdict.reason
    assert "tampered:framework_patched:_pytest.assertion.util.format_explanation" in verdict.flags


# --- what cannot be a baseline: judged on hand-built reports ------------------------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize(
    ("evidence", "reason"),
    [
        (["gc.get_objects", "canary_passed:mutated_copy"], "tampered"),  # forced outcomes: the task's data tampers
        (["trace_hook", "report_stream_broken"], "env_report_unreadable"),
        (["exit_code_contradicts_outcomes:0"], "env_report_unreadable"),
        (["test_item_patched:tests/t.py::test_a"], "env_tests_unreadable"),  # graded ids are renamed: never matched
        (["canary_missing:self_pass"], "env_canaries_unreliable"),  # the untouched repository hides canaries
        (["canary_skipped:self_fail", "sys.settrace"], "env_canaries_unreliable"),
        (["sys.settrace", "framework_patched:_pytest.runner.call_and_report", "hooks_changed"], ""),
    ],
)
def test_what_cannot_be_a_baseline_rejects_the_task_with_its_own_reason(evidence, reason) -> None:
    assert rejection(evidence).split(":", 1)[0] == reason


def _report(evidence: tuple[str, ...], outcomes: dict[str, str]) -> Report:
    return Report(exit_code=int("failed" in outcomes.values()), outcomes=outcomes, evidence=evidence)


@pytest.mark.pure
def test_validation_records_the_evidence_of_both_trees_as_the_baseline() -> None:
    task = Task(task_id="t", source=Source(kind="synthetic", ref="x"), repo="r", problem_statement="p",
                gold_patch="", test_patch="")  # fmt: skip
    before = _report(("gc.get_objects",), {"t.py::test_a": "failed"})
    after = _report(("sys._current_frames", "gc.get_objects"), {"t.py::test_a": "passed"})
    judged = _judge(task, [before], [after], 0.0)
    assert judged.validation.valid, judged.validation.reason
    assert judged.validation.baseline_evidence == ["gc.get_objects", "sys._current_frames"]
    forced = _judge(task, [before], [_report(("canary_passed:self_fail",), {})], 0.0)
    assert forced.validation.reason.startswith("tampered: ")


@pytest.mark.pure
def test_grading_zeroes_only_evidence_beyond_the_baseline() -> None:
    passed, tests, baseline = {"t.py::test_a": "passed"}, ["t.py::test_a"], ["gc.get_objects"]
    known = _report(("gc.get_objects",), passed)
    assert grade_report(known, tests, baseline).reward == 1.0
    assert grade_report(known, tests).reward == 0.0  # no baseline: evidence is tampering
    more = grade_report(_report(("gc.get_objects", "gc.get_referrers"), passed), tests, baseline)
    assert (more.reward, more.flags) == (0.0, ["tampered:gc.get_referrers", "baseline:gc.get_objects"])
    failing = grade_report(_report(("gc.get_objects",), {"t.py::test_a": "failed"}), tests, baseline)
    assert failing.reward == 0.0 and failing.flags == ["baseline:gc.get_objects"]
