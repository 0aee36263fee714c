"""The report's HTML: Jinja2 templates (``observe/templates``, package data), every one autoescaped.

A value a template prints is escaped unless it is ``markupsafe.Markup``, and Markup is made in two places only:
``fragment`` (the output of one of these templates, to place in another) and ``charts`` (Plotly's own output,
reviewed there). The ``safe`` filter is removed, so a template cannot wave text through either. Untrusted text
(diffs, statements, tool output, task ids, policy names) therefore reaches the page escaped, whatever it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup


@dataclass(frozen=True)
class Table:
    """A table: a header row, then rows of cells. A cell is a value shown as text (a number right-aligned),
    a ``Span`` or a ``Code``."""

    header: Sequence[str]
    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True)
class Span:
    """A table cell's text in a CSS class (good, bad, warn, flag); then ``note`` after a colon, and ``lines``
    below it, when given."""

    css: str
    text: str
    note: str | None = None
    lines: Sequence[str] = ()


@dataclass(frozen=True)
class Code:
    """A table cell of code lines (a rejection's first lines of output), one per line."""

    lines: Sequence[str]


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("trialforge.observe", "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    del env.filters["safe"]
    env.filters |= {"fmt": fmt, "pct": pct}
    env.tests |= {
        "numeric": lambda value: isinstance(value, int | float),  # right-aligned in a table
        "span": lambda value: isinstance(value, Span),
        "code": lambda value: isinstance(value, Code),
    }
    return env


_ENV = _environment()


def render(template: str, **context: Any) -> str:
    return _ENV.get_template(template).render(**context)


def fragment(template: str, **context: Any) -> Markup:
    """A piece of a page rendered by one of these (autoescaping) templates: markup to place in another as is."""
    return Markup(render(template, **context))
