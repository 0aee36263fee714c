import datetime as dt

from schedwise import Frequency, Recurrence, add_months


def test_monthly_from_the_31st_clamps_to_the_end_of_short_months() -> None:
    rule = Recurrence(dt.datetime(2024, 1, 31, 8, 0), Frequency.MONTHLY, count=4)
    assert [moment.date() for moment in rule.occurrences()] == [
        dt.date(2024, 1, 31),
        dt.date(2024, 2, 29),
        dt.date(2024, 3, 31),
        dt.date(2024, 4, 30),
    ]


def test_add_months_from_a_leap_day() -> None:
    assert add_months(dt.datetime(2024, 2, 29, 12, 0), 12) == dt.datetime(2025, 2, 28, 12, 0)
