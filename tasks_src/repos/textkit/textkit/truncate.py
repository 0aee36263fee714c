"""Shortening text with an ellipsis."""

from __future__ import annotations

ELLIPSIS = "…"


def truncate(text: str, length: int, ellipsis: str = ELLIPSIS) -> str:
    """Shorten ``text`` to at most ``length`` characters, ``ellipsis`` included."""
    if length < 0:
        raise ValueError("length must not be negative")
    if len(text) <= length:
        return text
    if length <= len(ellipsis):
        return ellipsis[:length]
    return text[: length - len(ellipsis)].rstrip() + ellipsis


def truncate_words(text: str, count: int, ellipsis: str = ELLIPSIS) -> str:
    """Keep the first ``count`` words of ``text``, adding ``ellipsis`` if any were dropped."""
    if count < 0:
        raise ValueError("count must not be negative")
    parts = text.split()
    if len(parts) <= count:
        return text
    return " ".join(parts[:count]) + ellipsis


def truncate_middle(text: str, length: int, ellipsis: str = ELLIPSIS) -> str:
    """Shorten ``text`` by cutting out its middle: ``"/usr/…/file.txt"``."""
    if len(text) <= length:
        return text
    if length <= len(ellipsis):
        return ellipsis[:length]
    keep = length - len(ellipsis)
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + ellipsis + (text[-tail:] if tail else "")
