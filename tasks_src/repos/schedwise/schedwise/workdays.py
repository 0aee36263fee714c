"""Working-day arithmetic with weekends and holidays."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

WEEKEND = frozenset({5, 6})  # Saturday, Sunday


class WorkCalendar:
    """Knows which days are working days: not a weekend day and not a holiday."""

    def __init__(self, holidays: Iterable[dt.date] = (), weekend: Iterable[int] = WEEKEND) -> None:
        self.holidays: set[dt.date] = set(holidays)
        self.weekend = frozenset(weekend)
        if len(self.weekend) >= 7:
            raise ValueError("a week needs at least one working day")

    def add_holiday(self, day: dt.date) -> None:
        self.holidays.add(day)

    def is_workday(self, day: dt.date) -> bool:
        return day.weekday() not in self.weekend and day not in self.holidays

    def add_workdays(self, day: dt.date, count: int) -> dt.date:
        """The working day ``count`` working days after ``day`` (before it if ``count`` is negative).

        ``day`` itself need not be a working day; with ``count == 0`` the next
        working day on or after ``day`` is returned.
        """
        step = dt.timedelta(days=1 if count >= 0 else -1)
        current = day
        while not self.is_workday(current):
            current += step
        remaining = abs(count)
        while remaining:
            current += step
            if self.is_workday(current):
                remaining -= 1
        return current

    def workdays_between(self, start: dt.date, end: dt.date) -> int:
        """Number of working days in ``[start, end)``; negative if ``end`` is before ``start``."""
        if end < start:
            return -self.workdays_between(end, start)
        days = (end - start).days
        full_weeks, extra = divmod(days, 7)
        count = full_weeks * (7 - len(self.weekend))
        tail_start = start + dt.timedelta(weeks=full_weeks)
        count += sum(
            1 for offset in range(extra) if (tail_start + dt.timedelta(days=offset)).weekday() not in self.weekend
        )
        count -= sum(1 for day in self.holidays if start <= day < end and day.weekday() not in self.weekend)
        return count

    def workdays(self, start: dt.date, end: dt.date) -> list[dt.date]:
        """The working days in ``[start, end)``, in order."""
        days = (start + dt.timedelta(days=offset) for offset in range((end - start).days))
        return [day for day in days if self.is_workday(day)]
