import datetime as dt

import pytest

from schedwise import WorkCalendar

MON = dt.date(2024, 6, 3)


def test_is_workday() -> None:
    calendar = WorkCalendar(holidays=[dt.date(2024, 6, 5)])
    assert calendar.is_workday(MON)
    assert not calendar.is_workday(dt.date(2024, 6, 5))
    assert not calendar.is_workday(dt.date(2024, 6, 8))
    assert not calendar.is_workday(dt.date(2024, 6, 9))


def test_add_workdays_skips_weekends_and_holidays() -> None:
    calendar = WorkCalendar(holidays=[dt.date(2024, 6, 10)])
    assert calendar.add_workdays(MON, 3) == dt.date(2024, 6, 6)
    assert calendar.add_workdays(dt.date(2024, 6, 7), 1) == dt.date(2024, 6, 11)
    assert calendar.add_workdays(dt.date(2024, 6, 11), -2) == dt.date(2024, 6, 6)


def test_add_zero_workdays_rolls_forward_to_a_workday() -> None:
    assert WorkCalendar().add_workdays(dt.date(2024, 6, 8), 0) == dt.date(2024, 6, 10)


def test_workdays_between() -> None:
    calendar = WorkCalendar(holidays=[dt.date(2024, 6, 4)])
    assert calendar.workdays_between(MON, MON + dt.timedelta(days=14)) == 9
    assert calendar.workdays_between(MON + dt.timedelta(days=14), MON) == -9
    assert calendar.workdays_between(MON, MON) == 0
    later = MON + dt.timedelta(days=17)
    assert calendar.workdays_between(MON, later) == len(calendar.workdays(MON, later))


def test_custom_weekend() -> None:
    calendar = WorkCalendar(weekend={4, 5})
    assert calendar.is_workday(dt.date(2024, 6, 9))
    assert not calendar.is_workday(dt.date(2024, 6, 7))
    with pytest.raises(ValueError):
        WorkCalendar(weekend=range(7))
