"""URL slugs."""

from __future__ import annotations

import re
import unicodedata

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def slugify(text: str, sep: str = "-", max_length: int | None = None) -> str:
    """Turn ``text`` into a lowercase ASCII slug: ``"Crème Brûlée!"`` -> ``"creme-brulee"``.

    Accented letters lose their accents; characters with no ASCII equivalent
    are dropped. ``max_length`` cuts the slug without leaving a dangling
    separator.
    """
    if not sep:
        raise ValueError("sep must not be empty")
    decomposed = unicodedata.normalize("NFKD", text)
    ascii_text = decomposed.encode("ascii", "ignore").decode("ascii").lower()
    slug = _NON_ALNUM.sub(sep, ascii_text).strip(sep)
    if max_length is not None and len(slug) > max_length:
        slug = slug[:max_length].rstrip(sep)
    return slug


def unique_slug(text: str, taken: set[str], sep: str = "-") -> str:
    """A slug for ``text`` not already in ``taken``, adding ``-2``, ``-3``, ... as needed."""
    base = slugify(text, sep) or "item"
    candidate, counter = base, 2
    while candidate in taken:
        candidate = f"{base}{sep}{counter}"
        counter += 1
    return candidate
