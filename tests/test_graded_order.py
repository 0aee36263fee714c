"""A graded run keeps the order of a TestCase's tests, under the names the host drew for them.

pytest and unittest run a TestCase's methods by name. Grading renames graded tests to drawn names, so by name they ran
shuffled, and a suite whose tests share state in that order failed its gold patch (pyparsing's example tests leave
parser settings behind: gold 0 in ``benchmarks/realrepos.py``, whichever tests the draw happened to put first). The
recorder puts the host's named tests of each TestCase back in the order the host named them (the suite's order).
"""

from __future__ import annotations

import pytest
from support.fixtasks import fix_task, validated_and_graded

from trialforge.envspec import EnvSpec
from trialforge.store.objstore import open_store
from trialforge.tasks.snapshots import SnapshotStore

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

STEPS = 6  # six tests that pass only in their suite's order: a shuffle keeps it once in 720 draws
CODE = "LOG = []\n\n\ndef step(n):\n    LOG.append(n)\n    return len(LOG) * {factor}\n"
TESTS = "import unittest\n\nfrom calc import step\n\n\nclass TestSteps(unittest.TestCase):\n" + "".join(
    f"    def test_step_{n}(self):\n        self.assertEqual(step({n}), {(n + 1) * 7})\n\n" for n in range(STEPS)
)


@pytest.mark.parametrize("runner", ["pytest", "unittest"])
def test_a_testcase_whose_tests_share_state_grades_its_gold_patch_one(runner, tmp_path, bwrap_backend) -> None:
    snapshots = SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")
    env = EnvSpec(test_cmd=("python3", "-m", "unittest")) if runner == "unittest" else None
    base = {
        "calc.py": CODE.format(factor=5),
        "tests/__init__.py": "",
        "tests/test_smoke.py": "def test_ok():\n    pass\n",
    }
    if runner == "unittest":
        base["tests/test_smoke.py"] = (
            "import unittest\n\n\nclass TestOk(unittest.TestCase):\n    def test_ok(self):\n        pass\n"
        )
    fixed = {**base, "calc.py": CODE.format(factor=7), "tests/test_steps.py": TESTS}
    task = fix_task(tmp_path, snapshots, base, fixed, statement="step(n) counts in fives, not sevens", env=env)
    checked, (gold, empty) = validated_and_graded(task, bwrap_backend, snapshots)
    assert len(checked.fail_to_pass) == STEPS
    assert (gold.reward, empty.reward) == (1.0, 0.0), gold.reason
