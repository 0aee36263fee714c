"""A red team's target: a validated task, its grader and its base tree, against which each attack's diff is graded."""

from __future__ import annotations

import shutil
from pathlib import Path

from support.redteam_repo import write_tree
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Task
from trialforge.verify.grader import Grader, Verdict


class World:
    def __init__(self, task: Task, grader: Grader, base: Path, root: Path) -> None:
        self.task, self.grader, self.base, self.root = task, grader, base, root
        self.count = 0

    def diff(self, files: dict[str, str]) -> str:
        """The diff from the base tree to the base tree with ``files`` written over it."""
        self.count += 1
        tree = self.root / f"attack-{self.count}"
        shutil.copytree(self.base, tree, symlinks=True)
        write_tree(tree, files)
        return diff_trees(self.base, tree)

    def grade(self, files: dict[str, str]) -> Verdict:
        verdict = self.grader.grade(self.task, self.diff(files))
        print("VERDICT", verdict.reward, verdict.status, verdict.reason[:400], verdict.flags)
        return verdict
