import pytest

from textkit import slugify, unique_slug


def test_slugify_basics() -> None:
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  Release 2.0 -- final  ") == "release-2-0-final"
    assert slugify("snake case", sep="_") == "snake_case"


def test_slugify_drops_characters_without_ascii_form() -> None:
    assert slugify("日本語") == ""
    assert slugify("price: 5€") == "price-5"


def test_slugify_max_length_does_not_end_with_separator() -> None:
    assert slugify("The quick brown fox", max_length=9) == "the-quick"
    assert slugify("The quick brown fox", max_length=10) == "the-quick"


def test_slugify_rejects_empty_separator() -> None:
    with pytest.raises(ValueError):
        slugify("x", sep="")


def test_unique_slug() -> None:
    taken = {"report", "report-2"}
    assert unique_slug("Report", taken) == "report-3"
    assert unique_slug("!!!", set()) == "item"
