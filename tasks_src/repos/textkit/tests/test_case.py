import pytest

from textkit import camel_case, constant_case, kebab_case, pascal_case, snake_case, split_words, title_case


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("parseHTTPResponse2", ["parse", "HTTP", "Response", "2"]),
        ("snake_case_name", ["snake", "case", "name"]),
        ("Already Spaced words", ["Already", "Spaced", "words"]),
        ("XMLHttpRequest", ["XML", "Http", "Request"]),
        ("", []),
    ],
)
def test_split_words(text: str, expected: list[str]) -> None:
    assert split_words(text) == expected


def test_conversions() -> None:
    assert snake_case("HTTPServerError") == "http_server_error"
    assert kebab_case("userId") == "user-id"
    assert constant_case("max retries") == "MAX_RETRIES"
    assert pascal_case("user_profile_url") == "UserProfileUrl"
    assert camel_case("User profile URL") == "userProfileUrl"
    assert camel_case("") == ""


def test_title_case_keeps_small_words_lowercase() -> None:
    assert title_case("the lord OF the rings") == "The Lord of the Rings"
    assert title_case("") == ""
