import pytest

from textkit import closest, levenshtein, similarity


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [("kitten", "sitting", 3), ("", "abc", 3), ("flaw", "lawn", 2), ("same", "same", 0)],
)
def test_levenshtein(a: str, b: str, expected: int) -> None:
    assert levenshtein(a, b) == expected
    assert levenshtein(b, a) == expected


def test_similarity() -> None:
    assert similarity("abc", "abc") == 1.0
    assert similarity("abcd", "abce") == 0.75
    assert similarity("abc", "") == 0.0


def test_closest() -> None:
    assert closest("pyton", ["java", "python", "perl"]) == "python"
    assert closest("aple", ["maple", "apple"]) == "maple"
    assert closest("zzz", ["java", "python"], max_distance=1) is None
    assert closest("anything", []) is None
