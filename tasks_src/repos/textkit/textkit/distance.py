"""Edit distance and fuzzy matching."""

from __future__ import annotations

from collections.abc import Iterable


def _fold(value: str, case_sensitive: bool) -> str:
    if not case_sensitive:
        return value.casefold()
    return value


def levenshtein(a: str, b: str) -> int:
    """Minimum number of single-character insertions, deletions and substitutions turning ``a`` into ``b``."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            cost = 0 if char_a == char_b else 1
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost))
        previous = current
    return previous[-1]


def similarity(a: str, b: str) -> float:
    """1.0 for identical strings down to 0.0 for completely different ones."""
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    return 1.0 - levenshtein(a, b) / longest


def closest(
    word: str, candidates: Iterable[str], *, max_distance: int | None = None, case_sensitive: bool = False
) -> str | None:
    """The candidate nearest to ``word`` (first one wins ties), or None if none is within ``max_distance``."""
    target = _fold(word, case_sensitive)
    best: str | None = None
    best_distance = 0
    for candidate in candidates:
        distance = levenshtein(target, _fold(candidate, case_sensitive))
        if max_distance is not None and distance > max_distance:
            continue
        if best is None or distance < best_distance:
            best, best_distance = candidate, distance
    return best
