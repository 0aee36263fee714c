"""Tokenizing: words, sentences, n-grams and frequencies."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

# Letters and digits (any script), with inner apostrophes kept: "don't", "l'été".
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
# Whitespace after a terminator, or after a terminator and one closing quote or bracket.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


def words(text: str) -> list[str]:
    """Words in ``text``, in order, punctuation removed."""
    return _WORD.findall(text)


def sentences(text: str) -> list[str]:
    """Split ``text`` after ``.``, ``!`` or ``?`` followed by whitespace."""
    return [part.strip() for part in _SENTENCE_END.split(text) if part.strip()]


def ngrams(tokens: Sequence[T], n: int) -> list[tuple[T, ...]]:
    """Every run of ``n`` consecutive tokens: ``ngrams("abc", 2)`` -> ``[("a", "b"), ("b", "c")]``."""
    if n < 1:
        raise ValueError("n must be at least 1")
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def word_frequencies(
    text: str, *, top: int | None = None, stopwords: frozenset[str] = frozenset()
) -> list[tuple[str, int]]:
    """Case-insensitive word counts, most common first (ties in order of first appearance)."""
    counts = Counter(word.casefold() for word in words(text) if word.casefold() not in stopwords)
    return counts.most_common(top)
