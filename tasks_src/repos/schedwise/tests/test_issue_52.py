import datetime as dt

from schedwise import Agenda, Interval


def at(hour: int) -> dt.datetime:
    return dt.datetime(2024, 9, 2, hour)


def test_touching_intervals_do_not_overlap() -> None:
    morning, noon = Interval(at(9), at(10)), Interval(at(10), at(11))
    assert not morning.overlaps(noon)
    assert not noon.overlaps(morning)
    assert morning.intersection(noon) is None


def test_back_to_back_meetings_are_not_conflicts() -> None:
    agenda = Agenda()
    agenda.add("Planning", at(9), at(10))
    agenda.add("Design review", at(10), at(11))
    assert agenda.conflicts() == []


def test_event_ending_at_midnight_is_not_on_the_next_day() -> None:
    agenda = Agenda()
    agenda.add("Release", at(22), dt.datetime(2024, 9, 3))
    assert agenda.on(dt.date(2024, 9, 3)) == []
