import datetime as dt

from schedwise import WorkCalendar


def test_holiday_on_a_saturday_does_not_remove_a_workday() -> None:
    calendar = WorkCalendar(holidays=[dt.date(2024, 12, 28)])
    assert calendar.workdays_between(dt.date(2024, 12, 23), dt.date(2024, 12, 30)) == 5


def test_workdays_between_agrees_with_workdays() -> None:
    calendar = WorkCalendar(holidays=[dt.date(2024, 7, 4), dt.date(2024, 7, 6)])
    start, end = dt.date(2024, 7, 1), dt.date(2024, 7, 15)
    assert calendar.workdays_between(start, end) == len(calendar.workdays(start, end)) == 9
