import datetime as dt

from schedwise import WorkCalendar

CHRISTMAS = dt.date(2025, 12, 25)


def test_holidays_are_not_shared_between_calendars() -> None:
    office = WorkCalendar()
    office.add_holiday(CHRISTMAS)
    assert not office.is_workday(CHRISTMAS)
    assert WorkCalendar().is_workday(CHRISTMAS)


def test_add_holiday_leaves_the_callers_list_alone() -> None:
    holidays = [dt.date(2025, 1, 1)]
    calendar = WorkCalendar(holidays)
    calendar.add_holiday(dt.date(2025, 5, 1))
    assert holidays == [dt.date(2025, 1, 1)]
