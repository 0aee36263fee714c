import datetime as dt

from schedwise import Agenda, Frequency, Interval, Recurrence


def at(day: int, hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2024, 5, day, hour, minute)


def test_events_are_kept_in_time_order() -> None:
    agenda = Agenda()
    agenda.add("Lunch", at(6, 12), at(6, 13))
    agenda.add("Standup", at(6, 9), at(6, 9, 15))
    assert [event.title for event in agenda.events] == ["Standup", "Lunch"]


def test_conflicts() -> None:
    agenda = Agenda()
    review = agenda.add("Review", at(6, 10), at(6, 11))
    call = agenda.add("Call", at(6, 10, 30), at(6, 11, 30))
    agenda.add("Gym", at(6, 18), at(6, 19))
    assert agenda.conflicts() == [(review, call)]


def test_free_slots_with_minimum_length() -> None:
    agenda = Agenda()
    agenda.add("A", at(6, 9), at(6, 10))
    agenda.add("B", at(6, 10, 20), at(6, 12))
    window = Interval(at(6, 9), at(6, 17))
    assert agenda.free_slots(window) == [Interval(at(6, 10), at(6, 10, 20)), Interval(at(6, 12), at(6, 17))]
    assert agenda.free_slots(window, dt.timedelta(minutes=30)) == [Interval(at(6, 12), at(6, 17))]


def test_recurring_events_and_day_view() -> None:
    agenda = Agenda()
    rule = Recurrence(at(6, 9), Frequency.DAILY)
    events = agenda.add_recurring("Standup", rule, dt.timedelta(minutes=15), until=at(9, 0))
    assert len(events) == 3
    assert [event.title for event in agenda.on(dt.date(2024, 5, 7))] == ["Standup"]
    assert agenda.on(dt.date(2024, 5, 10)) == []
