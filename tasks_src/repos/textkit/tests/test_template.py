from types import SimpleNamespace

import pytest

from textkit import TemplateError, placeholders, render


def test_render_simple_and_dotted_names() -> None:
    user = SimpleNamespace(name="Ada", team={"name": "Engines"})
    assert render("Hello {{ name }}!", {"name": "Ada"}) == "Hello Ada!"
    assert render("{{ user.name }} of {{ user.team.name }}", {"user": user}) == "Ada of Engines"
    assert render("{{ n }} items", {"n": 3}) == "3 items"


def test_filters() -> None:
    assert render("{{ title | upper }}", {"title": "news"}) == "NEWS"
    assert render("/posts/{{ title | slug }}", {"title": "Big News, Today"}) == "/posts/big-news-today"
    with pytest.raises(TemplateError, match="unknown filter: shout"):
        render("{{ title | shout }}", {"title": "x"})


def test_undefined_variables() -> None:
    with pytest.raises(TemplateError, match="undefined variable: missing"):
        render("{{ missing }}", {})
    assert render("[{{ missing }}]", {}, strict=False) == "[]"
    assert render("[{{ a.b }}]", {"a": {}}, strict=False, default="?") == "[?]"


def test_text_without_placeholders_is_unchanged() -> None:
    assert render("{ not } a {{placeholder", {}) == "{ not } a {{placeholder"


def test_placeholders() -> None:
    assert placeholders("{{ a }} {{ b.c | upper }} {{ a }}") == ["a", "b.c"]
