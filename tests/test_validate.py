"""Validation by execution: a flaky test is caught, a broken patch and a non-reproducing test are rejected."""

from __future__ import annotations

from pathlib import Path

import pytest

from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.patches import diff_trees, filter_patch, is_test_path
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task

BUGGY = "def double(x):\n    return x + x + 1\n"
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


def _task(tmp_path: Path, snapshots: SnapshotStore, tests: dict[str, str], gold: str | None = None) -> Task:
    base = tmp_path / "base"
    (base / "tests").mkdir(parents=True)
    (base / "calc.py").write_text(BUGGY)
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


def test_a_test_that_fails_one_run_in_three_is_caught_as_flaky(tmp_path, snapshots, bwrap_backend, base_image):
    task = _task(tmp_path, snapshots, {"test_double.py": STEADY, "test_flaky.py": FLAKY})
    checked = _validate(task, bwrap_backend, base_image, snapshots)
    assert checked.validation.valid, checked.validation.reason
    assert checked.validation.flaky_tests == ["tests/test_flaky.py::test_sometimes"]
    assert checked.fail_to_pass == ["tests/test_double.py::test_double"]
    assert "tests/test_flaky.py::test_sometimes" not in checked.pass_to_pass  # quarantined
    assert checked.validation.runs == 6


def test_a_task_that_depends_only_on_a_flaky_test_is_rejected(tmp_path, snapshots, bwrap_backend, base_image):
    task = _task(tmp_path, snapshots, {"test_flaky.py": FLAKY})
    checked = _validate(task, bwrap_backend, base_image, snapshots)
    assert not checked.validation.valid
    assert checked.validation.reason.startswith("no_fail_to_pass")


def test_a_fix_that_does_not_apply_is_rejected(tmp_path, snapshots, bwrap_backend, base_image):
    bad = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-nothing like this\n+x\n"
    task = _task(tmp_path, snapshots, {"test_double.py": STEADY}, gold=bad)
    checked = _validate(task, bwrap_backend, base_image, snapshots, runs=1)
    assert not checked.validation.valid
    assert checked.validation.reason.startswith("patch_does_not_apply")
