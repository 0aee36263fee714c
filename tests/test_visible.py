"""What a workspace shows: a value spelled there distinctively anchors no verdict (``tasks/visible.py``)."""

from __future__ import annotations

import decimal

import pytest
from test_validate import _task_from

from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.tasks.visible import WorkspaceText


@pytest.mark.pure
def test_distinctive_values_are_found_as_files_spell_them_and_common_ones_are_not(tmp_path) -> None:
    (tmp_path / "tests" / "data").mkdir(parents=True)
    (tmp_path / "tests" / "data" / "scale.json").write_text("[[3071, 4071], [12, 9.5e2]]\n")
    (tmp_path / "README.md").write_text("Balances are shown as 957.90; the slug is hello-world.\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "objects").write_text("31337 secret-in-history")
    shown = WorkspaceText.of(tmp_path)
    assert shown.shows(4071) and shown.shows(950) and shown.shows(950.0)  # a number in any spelling of its value
    assert shown.shows(decimal.Decimal("957.9")) and shown.shows("hello-world") and shown.shows([3071, 4071])
    assert not shown.shows(407) and not shown.shows(40710)  # digits inside another number are not it
    assert not shown.shows(12) and not shown.shows("ok") and not shown.shows(True)  # too common to be read off
    assert not shown.shows(31337) and not shown.shows([4071, 5555])  # .git is not the workspace; one element hidden


@pytest.mark.sandbox
@pytest.mark.parametrize("data", [{}, {"tests/data/cases.json": "[[3071, 4071]]\n"}], ids=["none", "in-test-patch"])
def test_an_expected_value_a_test_patch_file_holds_anchors_nothing(tmp_path, bwrap_backend, base_image, data) -> None:
    """A mined task whose test patch brings a data file: it is in the graded sandbox, where the package can read
    4071 off it, so ``assert scale(3071) == 4071`` (judged on the host) anchors nothing and the gate would drop the
    task; without the file the same assertion anchors it."""
    snapshots = SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")
    tests = "from calc import scale\n\n\ndef test_scale():\n    assert scale(3071) == 4071\n"
    fixed = {"calc.py": "def scale(n):\n    return n + 1000\n", "tests/test_scale.py": tests, **data}
    task = _task_from(tmp_path / "t", snapshots, {"calc.py": "def scale(n):\n    return n + 999\n"}, fixed)
    task = validate_task(task, bwrap_backend, base_image.name, snapshots, Limits(), ValidateConfig(runs=1))
    assert task.validation.valid, task.validation.reason
    assert task.validation.host_judged.fail_to_pass_anchored == (0 if data else 1)
