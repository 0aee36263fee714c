import datetime as dt

import pytest

from schedwise import Frequency, Recurrence, add_months

START = dt.datetime(2024, 1, 15, 9, 30)


def test_daily_with_count() -> None:
    rule = Recurrence(START, Frequency.DAILY, interval=2, count=3)
    assert [moment.day for moment in rule.occurrences()] == [15, 17, 19]


def test_weekly_until_is_inclusive() -> None:
    rule = Recurrence(START, Frequency.WEEKLY, until=dt.datetime(2024, 2, 5, 9, 30))
    assert [moment.date() for moment in rule.occurrences()] == [
        dt.date(2024, 1, 15),
        dt.date(2024, 1, 22),
        dt.date(2024, 1, 29),
        dt.date(2024, 2, 5),
    ]


def test_monthly() -> None:
    rule = Recurrence(START, Frequency.MONTHLY, interval=5, count=3)
    assert [(moment.year, moment.month, moment.day) for moment in rule.occurrences()] == [
        (2024, 1, 15),
        (2024, 6, 15),
        (2024, 11, 15),
    ]


def test_add_months_across_years() -> None:
    assert add_months(dt.datetime(2024, 11, 3), 3) == dt.datetime(2025, 2, 3)
    assert add_months(dt.datetime(2024, 3, 10), -4) == dt.datetime(2023, 11, 10)


def test_between_and_next_after_on_an_endless_rule() -> None:
    rule = Recurrence(START, Frequency.DAILY)
    found = rule.between(dt.datetime(2024, 2, 1), dt.datetime(2024, 2, 4))
    assert [moment.day for moment in found] == [1, 2, 3]
    assert rule.next_after(dt.datetime(2024, 1, 15, 9, 30)) == dt.datetime(2024, 1, 16, 9, 30)


def test_next_after_the_last_occurrence() -> None:
    assert Recurrence(START, Frequency.DAILY, count=1).next_after(START) is None


@pytest.mark.parametrize(("interval", "count"), [(0, None), (1, -1)])
def test_invalid_rules(interval: int, count: int | None) -> None:
    with pytest.raises(ValueError):
        Recurrence(START, Frequency.DAILY, interval=interval, count=count)
