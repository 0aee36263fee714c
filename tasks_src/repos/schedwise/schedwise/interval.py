"""Half-open time intervals ``[start, end)`` and operations on lists of them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    start: dt.datetime
    end: dt.datetime

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval ends before it starts: {self.start} > {self.end}")

    @property
    def duration(self) -> dt.timedelta:
        return self.end - self.start

    @property
    def is_empty(self) -> bool:
        return self.start == self.end

    def contains(self, moment: dt.datetime) -> bool:
        return self.start <= moment < self.end

    def overlaps(self, other: Interval) -> bool:
        """True if the intervals share some time; back-to-back intervals do not overlap."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other: Interval) -> Interval | None:
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def shift(self, delta: dt.timedelta) -> Interval:
        return Interval(self.start + delta, self.end + delta)

    def split(self, step: dt.timedelta) -> list[Interval]:
        """Consecutive pieces of length ``step`` (the last one may be shorter)."""
        if step <= dt.timedelta(0):
            raise ValueError("step must be positive")
        pieces: list[Interval] = []
        cursor = self.start
        while cursor < self.end:
            pieces.append(Interval(cursor, min(cursor + step, self.end)))
            cursor += step
        return pieces


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted union of ``intervals``; overlapping and touching intervals are joined."""
    merged: list[Interval] = []
    for interval in sorted(intervals):
        if merged and interval.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, interval.end))
        else:
            merged.append(interval)
    return merged


def total_duration(intervals: Iterable[Interval]) -> dt.timedelta:
    """Time covered by ``intervals``, counting overlaps once."""
    return sum((interval.duration for interval in merge(intervals)), dt.timedelta(0))


def gaps(intervals: Iterable[Interval], within: Interval) -> list[Interval]:
    """The parts of ``within`` not covered by any of ``intervals``."""
    free: list[Interval] = []
    cursor = within.start
    for busy in merge(intervals):
        if busy.end <= within.start or busy.start >= within.end:
            continue
        if busy.start > cursor:
            free.append(Interval(cursor, busy.start))
        cursor = max(cursor, busy.end)
    if cursor < within.end:
        free.append(Interval(cursor, within.end))
    return free
