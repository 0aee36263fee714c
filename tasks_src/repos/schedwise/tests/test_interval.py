import datetime as dt

import pytest

from schedwise import Interval, gaps, merge, total_duration


def at(hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2024, 5, 6, hour, minute)


def test_interval_basics() -> None:
    meeting = Interval(at(9), at(10, 30))
    assert meeting.duration == dt.timedelta(minutes=90)
    assert meeting.contains(at(9))
    assert not meeting.contains(at(10, 30))
    assert Interval(at(9), at(9)).is_empty


def test_interval_rejects_reversed_bounds() -> None:
    with pytest.raises(ValueError):
        Interval(at(10), at(9))


def test_overlaps_and_intersection() -> None:
    a = Interval(at(9), at(11))
    b = Interval(at(10), at(12))
    c = Interval(at(13), at(14))
    assert a.overlaps(b) and b.overlaps(a)
    assert not a.overlaps(c)
    assert a.intersection(b) == Interval(at(10), at(11))
    assert a.intersection(c) is None


def test_shift_and_split() -> None:
    block = Interval(at(9), at(10, 10))
    assert block.shift(dt.timedelta(hours=1)) == Interval(at(10), at(11, 10))
    pieces = block.split(dt.timedelta(minutes=30))
    assert [piece.duration.seconds // 60 for piece in pieces] == [30, 30, 10]
    with pytest.raises(ValueError):
        block.split(dt.timedelta(0))


def test_merge_joins_overlapping_and_touching() -> None:
    pieces = [Interval(at(13), at(14)), Interval(at(9), at(10)), Interval(at(9, 30), at(11)), Interval(at(11), at(12))]
    merged = merge(pieces)
    assert merged == [Interval(at(9), at(12)), Interval(at(13), at(14))]
    assert merge([]) == []


def test_total_duration_counts_overlap_once() -> None:
    assert total_duration([Interval(at(9), at(11)), Interval(at(10), at(12))]) == dt.timedelta(hours=3)


def test_gaps() -> None:
    day = Interval(at(8), at(18))
    busy = [Interval(at(7), at(9)), Interval(at(12), at(13)), Interval(at(17), at(19))]
    assert gaps(busy, day) == [Interval(at(9), at(12)), Interval(at(13), at(17))]
    assert gaps([], day) == [day]
