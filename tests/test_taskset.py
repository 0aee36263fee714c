"""A task set's version names its tasks, not how long one machine took to validate them."""

from __future__ import annotations

import pytest

from trialforge.tasks.schema import Source, Task, Validation, task_set_version

pytestmark = pytest.mark.pure


def _task(task_id: str, statement: str = "add is wrong", duration: float = 1.0) -> Task:
    validation = Validation(runs=2, valid=True, duration_s=duration, slowest_run_s=duration / 2)
    return Task(task_id=task_id, source=Source(kind="synthetic", ref="r"), repo="calc", snapshot="s",
                problem_statement=statement, gold_patch="", test_patch="", validation=validation)  # fmt: skip


def test_a_task_set_validated_again_keeps_its_version_and_a_changed_task_does_not():
    first = [_task("a", duration=1.0), _task("b", duration=2.0)]
    again = [_task("b", duration=7.5), _task("a", duration=0.3)]  # other timings, other order
    assert task_set_version(first) == task_set_version(again)
    assert task_set_version(first) != task_set_version([_task("a", "add is wrong for negatives"), _task("b")])
    assert first[0].content_hash() != again[1].content_hash()  # grading still tells them apart (its time limits)
