"""Test ids that change between runs (a clock, a uuid, a directory's listing order in the parameters) are left out of
the task's test lists with a count, never read as broken or fixed tests; the grader asks only for stable ids
(issue #45)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trialforge.funnel import Funnel
from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, _judge, record_verdicts, validate_task
from trialforge.testrun.report import TestReport as Report  # not "Test*": pytest would collect it
from trialforge.verify.grader import Grader

BUGGY = "def double(x):\n    return x + x + 1\n"
FIXED = "def double(x):\n    return x + x\n"
STEADY = "from calc import double\n\n\ndef test_double():\n    assert double(2) == 4\n"
# A module whose ids change every run: a clock's value, a uuid, and a directory created in a random order (a
# sandbox's every writable place is a tmpfs, which lists in creation order) numbered as it lists. The tests that
# call double() fail before the fix and pass after it: fail-to-pass, were their ids stable.
UNSTABLE = (
    "import os\nimport random\nimport tempfile\nimport time\nimport uuid\n\nimport pytest\n\n"
    "from calc import double\n\n"
    "LISTED = tempfile.mkdtemp()\n"
    "for name in random.sample([f'case{n:02}' for n in range(12)], 12):\n"
    "    open(os.path.join(LISTED, name), 'w').close()\n\n\n"
    "@pytest.mark.parametrize('stamp', [time.time_ns()])\n"
    "def test_stamped(stamp):\n    assert double(stamp) == 2 * stamp\n\n\n"
    "@pytest.mark.parametrize('token', [uuid.uuid4()], ids=str)\n"
    "def test_tokened(token):\n    assert token.version == 4\n\n\n"
    "@pytest.mark.parametrize('case', [f'{i}-{name}' for i, name in enumerate(os.listdir(LISTED))])\n"
    "def test_listed(case):\n    n = int(case.split('-')[0])\n    assert double(n) == 2 * n\n\n\n"
    "def test_plain():\n    assert os.path.isdir(LISTED)\n"
)
PLAIN = "tests/test_ids.py::test_plain"


def _task(root: Path, snapshots: SnapshotStore, base: dict[str, str], fixed: dict[str, str]) -> Task:
    """A task from two trees: the fixed tree's test files are its test patch, the rest its gold patch."""
    trees = {}
    for name, files in (("base", base), ("fixed", fixed), ("tested", {**base, **_tests(fixed)})):
        trees[name] = root / name
        for rel, text in files.items():
            (trees[name] / rel).parent.mkdir(parents=True, exist_ok=True)
            (trees[name] / rel).write_text(text)
    return Task(
        task_id="ids-1", source=Source(kind="synthetic", ref="test"), repo="calc",
        snapshot=snapshots.put(trees["base"]), problem_statement="double(2) returns 5",
        gold_patch=diff_trees(trees["tested"], trees["fixed"]), test_patch=diff_trees(trees["base"], trees["tested"]),
    )  # fmt: skip


def _tests(files: dict[str, str]) -> dict[str, str]:
    return {rel: text for rel, text in files.items() if rel.startswith("tests/")}


@pytest.fixture(scope="module", params=["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
def unstable_beside_real(request, tmp_path_factory):
    """The repository's own module of unstable ids, and a test patch with one real fail-to-pass test: validated on
    the backend, with its grader."""
    backend = request.getfixturevalue(f"{request.param}_backend")
    image = request.getfixturevalue("base_image")
    root = tmp_path_factory.mktemp(f"ids-{request.param}")
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    base = {"calc.py": BUGGY, "tests/test_ids.py": UNSTABLE}
    task = _task(root, snapshots, base, {**base, "calc.py": FIXED, "tests/test_double.py": STEADY})
    validated = validate_task(task, backend, image.name, snapshots, Limits(), ValidateConfig(runs=3))
    return validated, Grader(backend, image.name, image.digest, snapshots, Limits(), test_timeout_s=60)


@pytest.mark.sandbox
def test_unstable_ids_are_left_out_with_a_count_and_the_task_grades_right(unstable_beside_real):
    """Both backends validate the same stable lists (they agree); gold scores 1, an empty diff 0."""
    validated, grader = unstable_beside_real
    validation = validated.validation
    assert validation.valid, validation.reason
    assert validated.fail_to_pass == ["tests/test_double.py::test_double"]
    assert validated.pass_to_pass == [PLAIN]  # the module's stable test stays
    # 6 runs, each with its own clock value and uuid; a listing of 12 in a random order gives new numbers too
    assert validation.unstable_ids >= 12, validation.unstable_examples
    assert validation.flaky_tests == []
    functions = {t.split("[", 1)[0] for t in validation.unstable_examples}
    assert functions == {"tests/test_ids.py::test_listed"}, validation.unstable_examples  # sorted: those come first
    assert set(validation.fail_to_pass_rates) == {"tests/test_double.py::test_double"}
    gold, empty = grader.grade(validated, validated.gold_patch), grader.grade(validated, "")
    assert (gold.reward, empty.reward) == (1.0, 0.0), (gold.reason, empty.reason)
    assert set(gold.outcomes) == {"tests/test_double.py::test_double", PLAIN}  # asked only for stable ids
    funnel = Funnel("validate")
    record_verdicts([validated], funnel)
    assert funnel.as_dict()["noted"] == {"unstable_ids": validation.unstable_ids}


@pytest.mark.sandbox
def test_a_task_whose_only_fail_to_pass_ids_are_unstable_is_rejected_for_it(tmp_path, bwrap_backend, base_image):
    snapshots = SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")
    base = {"calc.py": BUGGY, "tests/test_other.py": "def test_one():\n    pass\n"}
    task = _task(tmp_path, snapshots, base, {**base, "calc.py": FIXED, "tests/test_ids.py": UNSTABLE})
    checked = validate_task(task, bwrap_backend, base_image.name, snapshots, Limits(), ValidateConfig(runs=2))
    reason = checked.validation.reason
    assert not checked.validation.valid
    assert reason.startswith("unstable_test_ids: the tests the fix changes have ids that differ between runs"), reason
    assert "tests/test_ids.py::test_" in reason
    assert checked.fail_to_pass == [] and checked.validation.unstable_ids > 0


def _report(outcomes: dict[str, str]) -> Report:
    return Report(exit_code=1 if "failed" in outcomes.values() else 0, outcomes=outcomes)


@pytest.mark.pure
def test_ids_that_follow_each_trees_listing_order_are_neither_broken_nor_fixed():
    """Each tree's copy lists its directory in its own order: every run of one tree agrees, the trees do not. The
    before tree's ids are missing after the fix: unstable, not `fix_breaks_tests`; the after tree's are not fixed."""
    task = Task(
        task_id="t", source=Source(kind="synthetic", ref="x"), repo="r", snapshot="s", problem_statement="p",
        gold_patch="", test_patch="",
    )  # fmt: skip
    real = "t.py::test_double"
    before = {"t.py::test_case[0-b]": "passed", "t.py::test_case[1-a]": "failed", real: "failed"}
    after = {"t.py::test_case[0-a]": "passed", "t.py::test_case[1-b]": "passed", real: "passed"}
    judged = _judge(task, [_report(before)] * 2, [_report(after)] * 2, 0.0)
    assert judged.validation.valid, judged.validation.reason
    assert (judged.fail_to_pass, judged.pass_to_pass) == ([real], [])
    assert judged.validation.unstable_ids == 4
    only = {t: o for t, o in before.items() if t != real}, {t: o for t, o in after.items() if t != real}
    rejected = _judge(task, [_report(only[0])], [_report(only[1])], 0.0)
    assert rejected.validation.reason == (
        "unstable_test_ids: the tests the fix changes have ids that differ between runs: "
        "['t.py::test_case[0-a]', 't.py::test_case[1-b]']"
    )
