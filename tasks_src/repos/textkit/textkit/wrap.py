"""Greedy word wrapping."""

from __future__ import annotations


def wrap(text: str, width: int = 70, *, break_long_words: bool = True) -> list[str]:
    """Wrap ``text`` into lines of at most ``width`` characters.

    Runs of whitespace collapse to one space; newlines in ``text`` start a new
    paragraph, and a blank line is kept as an empty string. Words longer than
    ``width`` are split unless ``break_long_words`` is false, in which case
    they get a line of their own.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    for paragraph in text.splitlines():
        words = paragraph.split()
        if not words:
            lines.append("")
            continue
        lines.extend(_wrap_words(words, width, break_long_words))
    return lines


def _wrap_words(words: list[str], width: int, break_long_words: bool) -> list[str]:
    lines: list[str] = []
    current = ""
    for word in words:
        if break_long_words:
            while len(word) > width:
                if current:
                    lines.append(current)
                    current = ""
                lines.append(word[:width])
                word = word[width:]
            if not word:
                continue

        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current = f"{current} {word}"
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def fill(text: str, width: int = 70, *, break_long_words: bool = True) -> str:
    """Like :func:`wrap` but returns a single string with newlines."""
    return "\n".join(wrap(text, width, break_long_words=break_long_words))


def indent(text: str, prefix: str, *, skip_blank: bool = True) -> str:
    """Prefix every line of ``text``; blank lines stay blank unless ``skip_blank`` is false."""
    return "\n".join(line if skip_blank and not line.strip() else prefix + line for line in text.split("\n"))
