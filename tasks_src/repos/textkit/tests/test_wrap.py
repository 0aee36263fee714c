import pytest

from textkit import fill, indent, wrap


def test_wrap_greedy() -> None:
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_collapses_whitespace_and_keeps_paragraphs() -> None:
    assert wrap("a   b\n\nc", 10) == ["a b", "", "c"]
    assert wrap("", 10) == []


def test_wrap_breaks_long_words() -> None:
    assert wrap("abcdefghij xy", 4) == ["abcd", "efgh", "ij", "xy"]
    assert wrap("abcdefgh", 4) == ["abcd", "efgh"]


def test_wrap_can_keep_long_words_whole() -> None:
    assert wrap("abcdefghij xy", 4, break_long_words=False) == ["abcdefghij", "xy"]


def test_wrap_rejects_bad_width() -> None:
    with pytest.raises(ValueError):
        wrap("text", 0)


def test_fill_and_indent() -> None:
    text = fill("one two three four", 9)
    assert text == "one two\nthree\nfour"
    assert indent("a\n\nb", "> ") == "> a\n\n> b"
    assert indent("a\n\nb", "> ", skip_blank=False) == "> a\n> \n> b"


def test_wrap_fills_lines_up_to_exactly_width() -> None:
    assert wrap("aaaa bbbbb", 10) == ["aaaa bbbbb"]
    assert wrap("one two three four", 7) == ["one two", "three", "four"]
    assert fill("ab cd ef", 5) == "ab cd\nef"
