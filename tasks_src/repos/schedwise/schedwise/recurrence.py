"""Recurring events: every N days, weeks or months from a start time."""

from __future__ import annotations

import calendar
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum


class Frequency(Enum):
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"


def add_months(moment: dt.datetime, months: int) -> dt.datetime:
    """``moment`` moved by whole months, clamped to the end of shorter months (Jan 31 + 1 -> Feb 29)."""
    index = moment.month - 1 + months
    year, month = moment.year + index // 12, index % 12 + 1
    day = min(moment.day, calendar.monthrange(year, month)[1])
    return moment.replace(year=year, month=month, day=day)


@dataclass(frozen=True)
class Recurrence:
    start: dt.datetime
    frequency: Frequency
    interval: int = 1
    count: int | None = None
    until: dt.datetime | None = None  # inclusive

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError("interval must be at least 1")
        if self.count is not None and self.count < 0:
            raise ValueError("count must not be negative")

    def nth(self, n: int) -> dt.datetime:
        """The ``n``-th occurrence (0 is ``start``), ignoring ``count`` and ``until``."""
        steps = n * self.interval
        if self.frequency is Frequency.DAILY:
            return self.start + dt.timedelta(days=steps)
        if self.frequency is Frequency.WEEKLY:
            return self.start + dt.timedelta(weeks=steps)
        return add_months(self.start, steps)

    def occurrences(self) -> Iterator[dt.datetime]:
        """All occurrences in order; infinite when neither ``count`` nor ``until`` is set."""
        n = 0
        while self.count is None or n < self.count:
            moment = self.nth(n)
            if self.until is not None and moment > self.until:
                return
            yield moment
            n += 1

    def between(self, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
        """Occurrences with ``start <= moment < end``."""
        found: list[dt.datetime] = []
        for moment in self.occurrences():
            if moment >= end:
                break
            if moment >= start:
                found.append(moment)
        return found

    def next_after(self, moment: dt.datetime) -> dt.datetime | None:
        for occurrence in self.occurrences():
            if occurrence > moment:
                return occurrence
        return None
