import pytest

from textkit import truncate, truncate_middle, truncate_words


def test_truncate() -> None:
    assert truncate("hello world", 20) == "hello world"
    assert truncate("hello world", 6) == "hello…"
    assert truncate("hello world", 7) == "hello…"
    assert len(truncate("abcdefghij", 5)) == 5


def test_truncate_tiny_lengths() -> None:
    assert truncate("hello", 1) == "…"
    assert truncate("hello", 0) == ""
    with pytest.raises(ValueError):
        truncate("hello", -1)


def test_truncate_words() -> None:
    assert truncate_words("one two three four", 2) == "one two…"
    assert truncate_words("one two", 2) == "one two"
    assert truncate_words("one two three", 1, ellipsis=" [more]") == "one [more]"


def test_truncate_middle() -> None:
    assert truncate_middle("/usr/local/share/file.txt", 12) == "/usr/l…e.txt"
    assert truncate_middle("short", 10) == "short"
    assert len(truncate_middle("abcdefghij", 4)) == 4
