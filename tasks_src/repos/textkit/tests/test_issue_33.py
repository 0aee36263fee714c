from textkit import truncate


def test_truncate_with_multi_character_ellipsis() -> None:
    assert truncate("hello world", 8, ellipsis="...") == "hello..."
    assert truncate("The quick brown fox", 10, ellipsis=" [..]") == "The q [..]"


def test_truncate_never_exceeds_the_requested_length() -> None:
    for length in range(12):
        assert len(truncate("abcdefghijklmnop", length, ellipsis="...")) <= length
