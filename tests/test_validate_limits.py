"""Time limits sized to the suite (issue #45, pyparsing): the fixed tree's first run measures the suite with
``validate.max_duration_s`` to run in, every later run of the task (validation's, graded) gets a limit sized to it, and
a suite past that ceiling is rejected as too slow, not as tests that did not run.

The fixture suites sleep, the one workload whose length is the point: a second against a quarter-second
``test_timeout_s``, an hour against a three-second ceiling (killed there), margins load only widens. Nothing here
asserts how long anything took beyond lower bounds the sleep itself guarantees."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from test_validate import _task as calc_task

from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Source, Task, Validation
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader

SLEEPING = (
    "import time\n\nfrom calc import double\n\n\ndef test_double():\n    time.sleep({})\n    assert double(2) == 4\n"
)
# the floor is far below the suite, the ceiling far above it: only a limit sized to the suite lets it run
SIZED = ValidateConfig(runs=2, test_timeout_s=0.25, max_duration_s=600, suite_timeout_factor=3)


def _sleeping_task(tmp_path: Path, snapshots: SnapshotStore, sleep_s: float) -> Task:
    """calc's double() fixed, its test sleeping ``sleep_s`` first (base tree: ``tmp_path / "base"``)."""
    return calc_task(tmp_path, snapshots, {"test_double.py": SLEEPING.format(sleep_s)})


@pytest.fixture
def snapshots(tmp_path):
    return SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")


@pytest.mark.sandbox
def test_a_suite_slower_than_the_floor_validates_and_grades_within_its_own_limit(
    tmp_path, snapshots, bwrap_backend, base_image
):
    task = _sleeping_task(tmp_path, snapshots, sleep_s=1)
    checked = validate_task(task, bwrap_backend, base_image.name, snapshots, Limits(), SIZED)
    assert checked.validation.valid, checked.validation.reason
    assert checked.fail_to_pass == ["tests/test_double.py::test_double"]
    assert checked.validation.slowest_run_s > SIZED.test_timeout_s  # what the old fixed limit would have cut off
    grader = Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits(), suite=SIZED)
    assert grader.timeout_for(checked) > SIZED.test_timeout_s
    gold, empty = grader.grade(checked, checked.gold_patch), grader.grade(checked, "")
    assert (gold.reward, empty.reward) == (1.0, 0.0), (gold.reason, empty.reason)
    # a diff cannot buy itself time: its limit is the task's, from validation's runs, and a hang meets it
    (tmp_path / "hang" / "calc.py").parent.mkdir()
    (tmp_path / "hang" / "calc.py").write_text(
        "import time\n\n\ndef double(x):\n    time.sleep(100000)\n    return x + x\n"
    )
    hung = grader.grade(checked, diff_trees(tmp_path / "base", tmp_path / "hang"))
    assert (hung.reward, hung.reason) == (0.0, "timed_out")


@pytest.mark.sandbox
def test_a_suite_past_the_ceiling_is_rejected_as_too_slow(tmp_path, snapshots, bwrap_backend, base_image):
    task = _sleeping_task(tmp_path, snapshots, sleep_s=3600)
    cfg = ValidateConfig(runs=3, test_timeout_s=1, max_duration_s=3)
    checked = validate_task(task, bwrap_backend, base_image.name, snapshots, Limits(), cfg)
    assert not checked.validation.valid
    assert checked.validation.reason.startswith("suite_too_slow: "), checked.validation.reason
    assert "validate.max_duration_s (3s)" in checked.validation.reason
    assert checked.validation.runs == 1  # the measuring run alone: no other run waits out the ceiling again


def _timed(slowest_s: float) -> Task:
    return Task(task_id="t", source=Source(kind="synthetic", ref="x"), repo="r", problem_statement="p",
                gold_patch="", test_patch="", validation=Validation(slowest_run_s=slowest_s))  # fmt: skip


@pytest.mark.pure
def test_a_tasks_own_limit_follows_its_measured_suite_between_floor_and_ceiling():
    cfg = ValidateConfig(test_timeout_s=120, max_duration_s=900, suite_timeout_factor=3)
    assert [cfg.limit_for(s) for s in (1, 100, 500)] == [120, 300, 900]
    grader = Grader(None, "image", "", None, Limits(), suite=cfg)  # no backend, no store: it only sizes limits
    # timeout_factor (10) x the run, within the task's own limit; a task never timed gets the floor
    assert [grader.timeout_for(_timed(s)) for s in (1, 100, 500, 0)] == [20, 300, 900, 120]
    capped = Grader(None, "image", "", None, Limits(), suite=cfg, test_timeout_s=60)
    assert capped.timeout_for(_timed(100)) == 60  # the quality gate's cap on its candidates


@pytest.mark.pure
def test_a_floor_above_the_ceiling_is_a_clear_error():
    with pytest.raises(ValidationError, match=r"test_timeout_s \(600.0\) is above validate\.max_duration_s"):
        ValidateConfig(test_timeout_s=600, max_duration_s=300)
