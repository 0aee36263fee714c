from textkit import placeholders, render


def test_filter_on_a_dotted_name() -> None:
    context = {"user": {"name": "ada lovelace"}}
    assert render("Dear {{ user.name | title }},", context) == "Dear Ada Lovelace,"


def test_placeholders_with_filters() -> None:
    assert placeholders("{{ a | upper }}-{{ b }}") == ["a", "b"]
