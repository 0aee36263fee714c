"""Identifier case conversion: snake_case, camelCase, PascalCase, kebab-case."""

from __future__ import annotations

import re

# An acronym before a capitalized word ("HTTPServer" -> "HTTP", "Server"), a word, an acronym, a number.
_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def split_words(text: str) -> list[str]:
    """Split an identifier or phrase into words: ``"parseHTTPResponse2"`` -> ``parse HTTP Response 2``."""
    return _PART.findall(text)


def snake_case(text: str) -> str:
    return "_".join(part.lower() for part in split_words(text))


def kebab_case(text: str) -> str:
    return "-".join(part.lower() for part in split_words(text))


def constant_case(text: str) -> str:
    return "_".join(part.upper() for part in split_words(text))


def pascal_case(text: str) -> str:
    return "".join(part.capitalize() for part in split_words(text))


def camel_case(text: str) -> str:
    parts = split_words(text)
    if not parts:
        return ""
    return parts[0].lower() + "".join(part.capitalize() for part in parts[1:])


def title_case(text: str, *, small_words: frozenset[str] = frozenset({"a", "an", "and", "of", "the", "to"})) -> str:
    """Capitalize words, keeping short function words lowercase except at the start."""
    result = []
    for index, word in enumerate(text.split()):
        lowered = word.lower()
        result.append(lowered if index and lowered in small_words else lowered[:1].upper() + lowered[1:])
    return " ".join(result)
