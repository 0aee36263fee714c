"""Which commits of a history are fixes with tests, judged as the runner and a person would judge them.

Small repositories are built in a temporary directory, one commit per shape: test modules the runner collects
outside pytest's default names (a root-level ``test.py``, the suite's own ``python_files``).
"""

from __future__ import annotations

import pytest
from support.history import History

from trialforge.store.objstore import open_store
from trialforge.tasks.ingest.extras import split_extras
from trialforge.tasks.ingest.gitlog import ingest_git_history
from trialforge.tasks.snapshots import SnapshotStore

pytestmark = pytest.mark.pure

LIB = "def total(values):\n    return sum(values)\n"
FLAT_TEST = "import unittest\n\nimport lib\n\n\nclass Total(unittest.TestCase):\n    def test_total(self):\n" \
            "        self.assertEqual(lib.total([1, 2]), 3)\n"  # fmt: skip
WHY = "\n\ntotal() of an empty list raised TypeError in the accumulator instead of returning zero like sum()."


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory) -> SnapshotStore:
    root = tmp_path_factory.mktemp("snapshots")
    return SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")


def _mine(history: History, snapshots: SnapshotStore, **knobs) -> tuple[list[str], dict[str, str]]:
    """(names of the kept commits, commit name -> reason of each dropped one)."""
    tasks, funnel = ingest_git_history(history.repo, snapshots, repo_name="lib", **knobs)
    names = {sha: name for name, sha in history.sha.items()}
    kept = [names[split_extras(t.source.ref)[0]] for t in tasks]
    return kept, {names[d["ref"].split("@")[1]]: d["reason"] for d in funnel.details}


def test_test_modules_are_what_the_runner_collects_not_only_pytests_default_names(tmp_path, snapshots):
    h = History(tmp_path)
    h.commit("root", "Initial import", {"lib.py": LIB, "test.py": FLAT_TEST, "setup.cfg": "[metadata]\nname = lib\n"})
    fixed = LIB.replace("sum(values)", "sum(values, 0)")
    h.commit("root_test_py", "Empty totals are zero" + WHY, {"lib.py": fixed, "test.py": FLAT_TEST + "\n# empty\n"})
    h.commit(
        "own_python_files",
        "Collect the checks directory\n\nThe suite names its modules check_*.py; pytest must be told.",
        {"setup.cfg": "[metadata]\nname = lib\n\n[tool:pytest]\npython_files = check_*.py\n",
         "checks/check_lib.py": "import lib\n\n\ndef check_total():\n    assert lib.total([]) == 0\n"},
    )  # fmt: skip
    h.commit(
        "fix_checked_by_own_module",
        "Negative totals are clamped" + WHY,
        {"lib.py": fixed + "\n\ndef clamp(x):\n    return max(x, 0)\n",
         "checks/check_lib.py": "import lib\n\n\ndef check_clamp():\n    assert lib.clamp(-1) == 0\n"},
    )  # fmt: skip
    kept, dropped = _mine(h, snapshots)
    assert kept == ["root_test_py", "fix_checked_by_own_module"]
    assert dropped == {"root": "root_commit", "own_python_files": "no_code_changes"}
