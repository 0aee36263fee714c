"""A very small template language: ``Hello {{ user.name | title }}!``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from textkit.case import snake_case
from textkit.slug import slugify

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*(?:\|\s*(\w+)\s*)?\}\}")

FILTERS: dict[str, Callable[[str], str]] = {
    "upper": str.upper,
    "lower": str.lower,
    "title": str.title,
    "strip": str.strip,
    "slug": slugify,
    "snake": snake_case,
}


class TemplateError(Exception):
    """Undefined variable or unknown filter."""


def _lookup(context: Mapping[str, Any], dotted: str) -> Any:
    value: Any = context
    for part in dotted.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif not isinstance(value, Mapping) and hasattr(value, part):
            value = getattr(value, part)
        else:
            raise LookupError(dotted)
    return value


def placeholders(template: str) -> list[str]:
    """Variable names used by ``template``, in order of first use."""
    return list(dict.fromkeys(match.group(1) for match in _PLACEHOLDER.finditer(template)))


def render(template: str, context: Mapping[str, Any], *, strict: bool = True, default: str = "") -> str:
    """Replace ``{{ name }}`` and ``{{ name | filter }}`` placeholders with values from ``context``.

    Dotted names look into nested mappings and attributes. An undefined name
    raises :class:`TemplateError` when ``strict``, otherwise renders as ``default``.
    """

    def substitute(match: re.Match[str]) -> str:
        name, filter_name = match.group(1), match.group(2)
        try:
            text = str(_lookup(context, name))
        except LookupError:
            if strict:
                raise TemplateError(f"undefined variable: {name}") from None
            text = default
        if filter_name is not None:
            try:
                text = FILTERS[filter_name](text)
            except KeyError:
                raise TemplateError(f"unknown filter: {filter_name}") from None
        return text

    return _PLACEHOLDER.sub(substitute, template)
