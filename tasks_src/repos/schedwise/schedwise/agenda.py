"""An agenda of events: conflicts and free time."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from schedwise.interval import Interval, gaps
from schedwise.recurrence import Recurrence


@dataclass(frozen=True)
class Event:
    title: str
    when: Interval


class Agenda:
    def __init__(self) -> None:
        self._events: list[Event] = []

    def add(self, title: str, start: dt.datetime, end: dt.datetime) -> Event:
        event = Event(title, Interval(start, end))
        self._events.append(event)
        self._events.sort(key=lambda item: (item.when, item.title))
        return event

    def add_recurring(self, title: str, rule: Recurrence, length: dt.timedelta, until: dt.datetime) -> list[Event]:
        """Add one event per occurrence of ``rule`` that starts before ``until``."""
        return [self.add(title, moment, moment + length) for moment in rule.between(rule.start, until)]

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)

    def on(self, day: dt.date) -> list[Event]:
        """Events that take up some of ``day``."""
        start = dt.datetime.combine(day, dt.time())
        whole_day = Interval(start, start + dt.timedelta(days=1))
        return [event for event in self._events if event.when.overlaps(whole_day)]

    def conflicts(self) -> list[tuple[Event, Event]]:
        """Pairs of events whose times overlap, in agenda order."""
        pairs: list[tuple[Event, Event]] = []
        for index, first in enumerate(self._events):
            for second in self._events[index + 1 :]:
                if first.when.overlaps(second.when):
                    pairs.append((first, second))
        return pairs

    def free_slots(self, window: Interval, minimum: dt.timedelta = dt.timedelta(0)) -> list[Interval]:
        """Gaps between events inside ``window`` lasting at least ``minimum``."""
        return [slot for slot in gaps((event.when for event in self._events), window) if slot.duration >= minimum]
