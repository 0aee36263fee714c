"""Grading rewrites of a task's base tree with the real verifier, counting the verifier runs: ``Probe``.

The audits try a wrong fix, a partial revert, a trivial strategy... each as whole-file rewrites of the base
tree, graded exactly as an agent's work is.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from trialforge.tasks.patches import diff_trees
from trialforge.tasks.quality_record import Attempt

if TYPE_CHECKING:
    from trialforge.tasks.schema import Task
    from trialforge.verify.grader import Grader


class Probe:
    """Grades whole-file rewrites of one task's base tree with the real verifier, counting the runs.

    A rewrite maps paths to new texts (None deletes the file); it goes onto a fresh copy of the base
    tree and the verifier grades ``diff_trees(base, copy)``, exactly as it grades an agent's work.
    Not thread-safe: one probe per task.
    """

    def __init__(self, task: Task, grader: Grader, base: Path, workdir: Path) -> None:
        self.task = task
        self.grader = grader
        self.base = base
        self.workdir = workdir
        self.runs = 0

    def limit_tests(self, timeout_s: float) -> float:
        """Grade from now on with at most ``timeout_s`` for the test run; returns the timeout in force.

        A wrong fix that loops forever fails its tests either way; waiting the verifier's full timeout
        for it only burns time. The caller derives the limit from how long the gold patch took.
        """
        limit = min(self.grader.timeout_for(self.task), timeout_s)
        self.grader = dataclasses.replace(self.grader, test_timeout_s=limit)
        return limit

    def diff(self, texts: Mapping[str, str | None]) -> str:
        tree = self.workdir / f"candidate-{self.runs}"
        shutil.copytree(self.base, tree, symlinks=True)
        try:
            for rel, text in texts.items():
                path = tree / rel
                if text is None:
                    path.unlink(missing_ok=True)
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text, encoding="utf-8")
            return diff_trees(self.base, tree)
        finally:
            shutil.rmtree(tree, ignore_errors=True)

    def grade(self, kind: str, note: str, texts: Mapping[str, str | None]) -> Attempt:
        diff = self.diff(texts)
        verdict = self.grader.grade(self.task, diff)
        self.runs += 1
        return Attempt(kind=kind, note=note, diff=diff, reward=verdict.reward, status=verdict.status,
                       reason=verdict.reason, duration_s=verdict.duration_s)  # fmt: skip
