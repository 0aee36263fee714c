import pytest

from schedwise import EmptyQueueError, PriorityTaskQueue, Task


def test_lower_priority_number_runs_first() -> None:
    queue = PriorityTaskQueue()
    queue.push("deploy", 2)
    queue.push("hotfix", 0)
    queue.push("docs", 5)
    assert [task.name for task in queue.drain()] == ["hotfix", "deploy", "docs"]


def test_equal_priorities_are_fifo() -> None:
    queue = PriorityTaskQueue()
    for name in ["zeta", "alpha", "mid"]:
        queue.push(name, 1)
    assert [queue.pop().name for _ in range(3)] == ["zeta", "alpha", "mid"]


def test_peek_does_not_remove() -> None:
    queue = PriorityTaskQueue()
    queue.push("a", 1, payload={"retries": 3})
    assert queue.peek() == Task("a", 1, {"retries": 3})
    assert len(queue) == 1
    assert "a" in queue


def test_empty_queue_errors() -> None:
    queue = PriorityTaskQueue()
    with pytest.raises(EmptyQueueError):
        queue.pop()
    with pytest.raises(EmptyQueueError):
        queue.peek()
    assert not queue


def test_remove_and_reprioritize() -> None:
    queue = PriorityTaskQueue()
    queue.push("a", 1)
    queue.push("b", 2)
    queue.push("c", 3)
    assert queue.remove("b") == Task("b", 2)
    assert "b" not in queue
    queue.reprioritize("c", 0)
    assert queue.pop().name == "c"
    assert queue.pop().name == "a"
    with pytest.raises(KeyError):
        queue.remove("zzz")
