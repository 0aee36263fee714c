from schedwise import PriorityTaskQueue


def test_len_after_remove_and_replace() -> None:
    queue = PriorityTaskQueue()
    queue.push("a", 1)
    queue.push("b", 2)
    queue.remove("b")
    queue.push("a", 3)
    assert len(queue) == 1


def test_drain_after_removing_the_least_urgent_task() -> None:
    queue = PriorityTaskQueue()
    queue.push("build", 1)
    queue.push("cleanup", 9)
    queue.remove("cleanup")
    assert [task.name for task in queue.drain()] == ["build"]
    assert not queue
