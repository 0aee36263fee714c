"""A priority task queue: lower numbers run first, equal priorities run in insertion order."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any


class EmptyQueueError(LookupError):
    """pop() or peek() on a queue with no tasks."""


@dataclass(order=True)
class _Entry:
    priority: int
    sequence: int
    name: str = field(compare=False)
    payload: Any = field(compare=False, default=None)
    removed: bool = field(compare=False, default=False)


@dataclass(frozen=True)
class Task:
    name: str
    priority: int
    payload: Any = None


class PriorityTaskQueue:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._entries: dict[str, _Entry] = {}
        self._sequence = itertools.count()

    def push(self, name: str, priority: int = 0, payload: Any = None) -> None:
        """Add a task; pushing a name that is already queued replaces it."""
        if name in self._entries:
            self.remove(name)
        entry = _Entry(priority, next(self._sequence), name, payload)
        self._entries[name] = entry
        heapq.heappush(self._heap, entry)

    def remove(self, name: str) -> Task:
        """Take a task out of the queue wherever it is."""
        try:
            entry = self._entries.pop(name)
        except KeyError:
            raise KeyError(f"no queued task named {name!r}") from None
        entry.removed = True
        return Task(entry.name, entry.priority, entry.payload)

    def reprioritize(self, name: str, priority: int) -> None:
        task = self.remove(name)
        self.push(name, priority, task.payload)

    def _discard_removed(self) -> None:
        while self._heap and self._heap[0].removed:
            heapq.heappop(self._heap)

    def peek(self) -> Task:
        self._discard_removed()
        if not self._heap:
            raise EmptyQueueError("peek from an empty queue")
        entry = self._heap[0]
        return Task(entry.name, entry.priority, entry.payload)

    def pop(self) -> Task:
        self._discard_removed()
        if not self._heap:
            raise EmptyQueueError("pop from an empty queue")
        entry = heapq.heappop(self._heap)
        del self._entries[entry.name]
        return Task(entry.name, entry.priority, entry.payload)

    def drain(self) -> list[Task]:
        """Pop every task, in order."""
        tasks: list[Task] = []
        while self:
            tasks.append(self.pop())
        return tasks

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
