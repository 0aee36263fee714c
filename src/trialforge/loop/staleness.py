"""Bounded-staleness training: rollouts for the next iterations run in a background thread while the trainer updates.

Batch k is trained on by policy version ``v0 + k`` (``v0`` the version at the start); the producer starts it only
once version ``v0 + k - max_staleness`` is published, and rolls out with the newest published snapshot, so a batch is
never more than ``max_staleness`` versions behind (0: the synchronous loop). Each batch carries the version that
produced it, which the trainer passes on (``LMTrainer.update(..., behaviour_version=...)``) for truncated importance
sampling; both sides' waits are measured. Why and how: docs/orchestration.md, "Bounded staleness".
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from trialforge.errors import ConfigError

P = TypeVar("P")  # a policy snapshot (weights, a version string: whatever the rollout function needs)
B = TypeVar("B")  # a rollout batch (a list of EpisodeRecords in the real loop)


@dataclass(frozen=True)
class TaggedBatch(Generic[B]):
    index: int  # 0, 1, ... in production order
    version: int  # the policy version that produced it
    batch: B


@dataclass(frozen=True)
class StalenessStats:
    batches: int
    max_staleness: int  # the bound
    staleness: list[int]  # per consumed batch: trainer version - producing version (never above the bound)
    trainer_wait_s: float
    rollout_wait_s: float
    trainer_idle_fraction: float  # trainer_wait_s / the trainer's wall time
    rollout_idle_fraction: float  # rollout_wait_s / the producer's wall time


class Coordinator(Generic[P, B]):
    """A versioned policy snapshot, a queue of finished batches, and the staleness gate between them."""

    def __init__(self, snapshot: P, version: int, max_staleness: int) -> None:
        if max_staleness < 0:
            raise ConfigError(f"max_staleness={max_staleness} must be >= 0")
        self.max_staleness = max_staleness
        self._start_version = version
        self._snapshot = snapshot
        self._version = version
        self._changed = threading.Condition()
        self._ready: queue.Queue[TaggedBatch[B] | BaseException] = queue.Queue()
        self.rollout_wait_s = 0.0
        self.trainer_wait_s = 0.0

    def publish(self, snapshot: P, version: int) -> None:
        """The trainer's new weights after an update."""
        with self._changed:
            self._snapshot, self._version = snapshot, version
            self._changed.notify_all()

    def acquire(self, index: int, stop: threading.Event) -> tuple[P, int] | None:
        """The producer's snapshot for batch ``index``, once the bound allows it; None when stopped."""
        needed = self._start_version + index - self.max_staleness
        start = time.perf_counter()
        with self._changed:
            while self._version < needed and not stop.is_set():
                self._changed.wait(timeout=0.05)
            self.rollout_wait_s += time.perf_counter() - start
            return None if stop.is_set() else (self._snapshot, self._version)

    def put(self, item: TaggedBatch[B] | BaseException) -> None:
        self._ready.put(item)

    def take(self) -> TaggedBatch[B]:
        """The next batch, in order; blocks (counted as trainer idle) until it is ready."""
        start = time.perf_counter()
        item = self._ready.get()
        self.trainer_wait_s += time.perf_counter() - start
        if isinstance(item, BaseException):
            raise item
        return item


def train_bounded(
    rollout: Callable[[P, int], B],
    update: Callable[[TaggedBatch[B]], tuple[P, int]],
    snapshot: P,
    version: int,
    batches: int,
    max_staleness: int,
) -> StalenessStats:
    """Run ``batches`` rollout batches in a background thread and one update per batch here.

    ``rollout(snapshot, batch_index)`` produces a batch with a snapshot; ``update(tagged)`` trains on it and
    returns the new ``(snapshot, version)``. A rollout exception stops the producer and is raised here.
    """
    coord: Coordinator[P, B] = Coordinator(snapshot, version, max_staleness)
    stop = threading.Event()
    producer_time = [0.0]

    def produce() -> None:
        start = time.perf_counter()
        try:
            for index in range(batches):
                got = coord.acquire(index, stop)
                if got is None:
                    return
                snap, snap_version = got
                coord.put(TaggedBatch(index, snap_version, rollout(snap, index)))
        except BaseException as exc:  # handed to the trainer thread, which raises it
            coord.put(exc)
        finally:
            producer_time[0] = time.perf_counter() - start

    thread = threading.Thread(target=produce, name="rollout-producer", daemon=True)
    start = time.perf_counter()
    thread.start()
    staleness = []
    current = version
    try:
        for _ in range(batches):
            tagged = coord.take()
            staleness.append(current - tagged.version)
            snapshot, current = update(tagged)
            coord.publish(snapshot, current)
    finally:
        stop.set()
        thread.join()
    trainer_time = time.perf_counter() - start
    return StalenessStats(
        batches=batches,
        max_staleness=max_staleness,
        staleness=staleness,
        trainer_wait_s=coord.trainer_wait_s,
        rollout_wait_s=coord.rollout_wait_s,
        trainer_idle_fraction=coord.trainer_wait_s / trainer_time if trainer_time > 0 else 0.0,
        rollout_idle_fraction=coord.rollout_wait_s / producer_time[0] if producer_time[0] > 0 else 0.0,
    )
