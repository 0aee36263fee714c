"""How far a long step is, for whoever waits: the steps report it here, a door draws it.

A step wraps its work in ``track`` (or maps it with ``tracked_map``) wherever it runs; the command that
waits (``trialforge run``, ``trialforge stage``, ``trialforge validate``) installs ``progress_bars`` around it,
which draws every tracked step of this process as a rich progress bar. Without a sink, tracking costs nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

ProgressSink = Callable[[str, int, int | None], None]  # (label, done, total); total None: running, uncounted
_sinks: list[ProgressSink] = []
T = TypeVar("T")
R = TypeVar("R")


@contextlib.contextmanager
def progress_sink(sink: ProgressSink) -> Iterator[None]:
    """Send the progress of long steps run in this process to ``sink`` while the block runs."""
    _sinks.append(sink)
    try:
        yield
    finally:
        _sinks.remove(sink)


@contextlib.contextmanager
def track(label: str, total: int | None = None) -> Iterator[Callable[[], None]]:
    """Report a long step: yields ``advance()`` for each item done (from any thread); the step shows complete
    when the block ends."""
    done = 0
    lock = threading.Lock()

    def advance() -> None:
        nonlocal done
        with lock:
            done += 1
            report(label, done, total)

    report(label, 0, total)
    yield advance
    report(label, total if total is not None else 1, total if total is not None else 1)


def report(label: str, done: int, total: int | None) -> None:
    """Report where step ``label`` stands, for a step that counts its own items (``track`` counts for the rest)."""
    for sink in list(_sinks):
        sink(label, done, total)


def tracked_map(label: str, fn: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    """``fn`` over ``items``, ``workers`` at a time, in order; each item done advances the step ``label``."""
    items = list(items)
    with track(label, len(items)) as advance, ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:

        def one(item: T) -> R:
            out = fn(item)
            advance()
            return out

        return list(pool.map(one, items))


@contextlib.contextmanager
def progress_bars() -> Iterator[None]:
    """Draw the long steps run in this process while the block runs (validation, the quality gate, rollout
    shards) as rich progress bars; log lines print above them."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    progress = Progress(*columns, TimeElapsedColumn())
    bars: dict[str, Any] = {}
    lock = threading.Lock()

    def draw(label: str, done: int, total: int | None) -> None:
        with lock:
            if not bars:
                progress.start()  # on the first step tracked: a command with none draws nothing
            if label not in bars:
                bars[label] = progress.add_task(label, total=total)
            progress.update(bars[label], completed=done, total=total)

    try:
        with progress_sink(draw):
            yield
    finally:
        if bars:
            progress.stop()
