"""From raw text to hashed n-grams: normalisation, token hashes and the exact n-gram index.

Two normalisations: ``text`` (lowercase word tokens) and ``code`` (a Python-shaped lexer, one regular expression,
that drops comments, docstrings and layout and yields *lexical* tokens for exact n-grams and *canonical* ones,
identifiers as back-references, for MinHash shingles). A unified diff is first reduced to the lines it adds. Every
token keeps the character offset where it starts, so a match can point at the copied passage. Why each choice:
docs/pipeline.md, "Decontamination".
"""

from __future__ import annotations

import builtins
import hashlib
import keyword
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Kind = Literal["text", "code"]

IDENTIFIER = "ID"  # placeholder for a renamable identifier
_U64 = np.uint64
_EMPTY_U64 = np.empty(0, dtype=_U64)
_KEEP_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins))
_WORD = re.compile(r"\w+")
_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_DIFF_HEADER = re.compile(r"^(?:diff --git |--- |\+\+\+ |index |new file mode |deleted file mode )")

# One alternative per token class, tried in this order at each position.
_CODE_TOKEN = re.compile(
    r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>[rRbBuUfF]{0,2}(?:'''[\s\S]*?(?:'''|\Z)|\"\"\"[\s\S]*?(?:\"\"\"|\Z)
                              |'(?:\\.|[^'\\\n])*'?|"(?:\\.|[^"\\\n])*"?))
  | (?P<number>0[xXoObB][0-9a-fA-F_]+|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d[\d_]*)?[jJ]?)
  | (?P<name>[^\W\d]\w*)
  | (?P<continuation>\\\r?\n)
  | (?P<newline>\n)
  | (?P<op>\*\*=|//=|>>=|<<=|\.\.\.|->|:=|[-+*/%&|^@<>=!]=|\*\*|//|<<|>>|[^\s\w])
    """,
    re.VERBOSE,
)
_OPEN, _CLOSE = frozenset("([{"), frozenset(")]}")
_DELIMITERS = frozenset("()[]{},:;.")


@dataclass(frozen=True)
class Tokens:
    """The normalised tokens of one field and the character offset where each starts.

    ``text`` is what exact n-grams hash and matches quote. For code, ``canon`` (identifiers
    as ``ID``) and ``back`` (their back-references) are what MinHash shingles hash; text
    has no second view, so :meth:`shingle_view` falls back to ``text``.
    """

    text: list[str]
    offsets: np.ndarray  # int64, offsets into the original (un-normalised) string
    canon: list[str] | None = None
    back: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.text)

    def shingle_view(self) -> list[str]:
        return self.text if self.canon is None else self.canon


def normalize(text: str, kind: Kind) -> Tokens:
    """Normalise ``text`` the way its kind needs (see the module docstring)."""
    return normalize_code(text) if kind == "code" else normalize_text(text)


def normalize_text(text: str) -> Tokens:
    """Lowercase word tokens: punctuation and whitespace runs carry no evidence of copying."""
    words = list(_WORD.finditer(text))
    offsets = np.fromiter((m.start() for m in words), dtype=np.int64, count=len(words))
    return Tokens([m.group().lower() for m in words], offsets)


def normalize_code(text: str) -> Tokens:
    """Canonical code tokens, diff-aware, with offsets into ``text``."""
    if is_unified_diff(text):
        code, line_starts, origins = added_lines(text)
    else:
        code, line_starts, origins = text, np.zeros(1, np.int64), np.zeros(1, np.int64)
    lexical, canonical, positions, back = code_tokens(code)
    line = np.searchsorted(line_starts, positions, side="right") - 1
    return Tokens(lexical, origins[line] + (positions - line_starts[line]), canonical, back)


def is_unified_diff(text: str) -> bool:
    """A hunk header plus a file header: enough to tell a patch from code that mentions ``@@``."""
    return re.search(r"^@@ -\d", text, re.M) is not None and re.search(r"^(?:\+\+\+|---) ", text, re.M) is not None


def added_lines(diff: str) -> tuple[str, np.ndarray, np.ndarray]:
    """The lines a unified diff adds, without their ``+``.

    Returns the joined code, the offset where each of its lines starts in that code, and
    the offset of the same line in ``diff``. Hunk line counts decide what is content, so an
    added line that itself starts with ``++`` is kept; outside a counted hunk (hand-edited
    diffs with wrong counts) a ``+`` line that is not a ``+++`` header is still taken.
    """
    parts: list[str] = []
    line_starts: list[int] = []
    origins: list[int] = []
    old_left = new_left = 0
    code_len = pos = 0
    for line in diff.splitlines(keepends=True):
        start, pos = pos, pos + len(line)
        tag = line[:1]
        in_hunk = old_left > 0 or new_left > 0
        if in_hunk:
            old_left -= tag != "+" and tag != "\\"
            new_left -= tag != "-" and tag != "\\"
        elif (hunk := _HUNK.match(line)) is not None:
            old_left, new_left = int(hunk.group(1) or 1), int(hunk.group(2) or 1)
            continue
        if tag != "+" or (not in_hunk and _DIFF_HEADER.match(line)):
            continue
        content = line[1:] if line.endswith("\n") else line[1:] + "\n"
        parts.append(content)
        line_starts.append(code_len)
        origins.append(start + 1)
        code_len += len(content)
    if not parts:
        return "", np.zeros(1, np.int64), np.zeros(1, np.int64)
    return "".join(parts), np.asarray(line_starts, np.int64), np.asarray(origins, np.int64)


def lex_code(code: str) -> list[tuple[str, str, int]]:
    """Raw ``(class, text, offset)`` tokens; ``eol`` marks the end of a logical line.

    Comments and line continuations are dropped; newlines inside brackets are not line
    ends, exactly as for Python's own tokenizer.
    """
    raw: list[tuple[str, str, int]] = []
    depth = 0
    for m in _CODE_TOKEN.finditer(code):
        cls = m.lastgroup or "op"
        if cls in ("comment", "continuation"):
            continue
        tok = m.group()
        if cls == "newline":
            if depth == 0 and raw and raw[-1][0] != "eol":
                raw.append(("eol", "", m.start()))
            continue
        if cls == "op":
            depth += tok in _OPEN
            depth = max(0, depth - (tok in _CLOSE))
        raw.append((cls, tok, m.start()))
    return raw


def code_tokens(code: str) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """Lexical tokens, canonical tokens, offsets in ``code``, and back-references.

    Lexical tokens keep identifiers (lowercased); canonical ones replace them by ``ID``.
    Both drop delimiters (brackets, commas, colons, dots) like punctuation in text: they
    add tokens without adding evidence. ``back[i]`` is, for an ``ID``, the distance to
    the previous occurrence of the same identifier (0 if none): consistent renaming keeps
    it, so hashing it inside each window (see :func:`ngram_hashes`) tells ``x = y + y``
    from ``x = y + z``.
    """
    raw = lex_code(code)
    lexical: list[str] = []
    canonical: list[str] = []
    offsets: list[int] = []
    back: list[int] = []
    last_seen: dict[str, int] = {}
    prev = ""  # text of the previous significant raw token; "" at the start of a logical line
    for i, (cls, tok, offset) in enumerate(raw):
        if cls == "eol":
            prev = ""
            continue
        if cls == "string" and not prev and (i + 1 == len(raw) or raw[i + 1][0] == "eol"):
            continue  # a docstring: prose, compared through the text fields instead
        canon = _canonical(cls, tok, prev)
        prev = tok
        if canon in _DELIMITERS:
            continue
        here = len(canonical)
        back.append(here - last_seen.get(tok, here) if canon == IDENTIFIER else 0)
        if canon == IDENTIFIER:
            last_seen[tok] = here
        lexical.append(tok.lower() if cls == "name" else canon)
        canonical.append(canon)
        offsets.append(offset)
    return lexical, canonical, np.asarray(offsets, dtype=np.int64), np.asarray(back, dtype=np.int64)


def _canonical(cls: str, tok: str, prev: str) -> str:
    if cls == "name":
        return tok if tok in _KEEP_NAMES or prev == "." else IDENTIFIER
    if cls == "string":  # prefixes, quote style, case and whitespace runs vanish; content stays
        return '"' + " ".join(_string_body(tok).lower().split())
    if cls == "number":
        return tok.lower()
    return tok


def _string_body(literal: str) -> str:
    body = literal.lstrip("rRbBuUfF")
    quote = body[:3] if body[:3] in ('"""', "'''") else body[:1]
    body = body[len(quote) :]
    return body[: -len(quote)] if body.endswith(quote) else body


# --- hashing ----------------------------------------------------------------------

_POLY = _U64(0x9E3779B97F4A7C15)  # odd multiplier of the polynomial n-gram hash
_BACK = _U64(0xC2B2AE3D27D4EB4F)  # weight of an identifier's back-reference in its token hash


class TokenHasher:
    """Stable 64-bit token hashes (blake2b: equal across processes and machines), cached.

    Each distinct token is hashed once and given a small id; a batch is then one C-level
    ``map`` over a dict plus a numpy gather, about ten times faster than hashing tokens
    one by one. The cache is dropped past ``max_tokens`` distinct tokens. Not thread-safe:
    give each thread its own.
    """

    def __init__(self, max_tokens: int = 1 << 21) -> None:
        self.max_tokens = max_tokens
        self._ids: dict[str, int] = {}
        self._hashes = np.empty(1024, dtype=_U64)

    def __call__(self, tokens: Sequence[str]) -> np.ndarray:
        if not tokens:
            return _EMPTY_U64
        try:
            ids = np.fromiter(map(self._ids.__getitem__, tokens), dtype=np.int64, count=len(tokens))
        except KeyError:
            self._learn(tokens)
            ids = np.fromiter(map(self._ids.__getitem__, tokens), dtype=np.int64, count=len(tokens))
        return self._hashes[ids]

    def _learn(self, tokens: Sequence[str]) -> None:
        new = set(tokens).difference(self._ids)
        if len(self._ids) + len(new) > self.max_tokens:
            self._ids.clear()
            new = set(tokens)
        start = len(self._ids)
        if start + len(new) > len(self._hashes):
            grown = np.empty(max(2 * len(self._hashes), start + len(new)), dtype=_U64)
            grown[:start] = self._hashes[:start]
            self._hashes = grown
        for i, tok in enumerate(sorted(new), start):
            self._ids[tok] = i
            self._hashes[i] = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads every input bit over the output (in place)."""
    x ^= x >> _U64(30)
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


def ngram_hashes(
    hashes: np.ndarray,
    lengths: np.ndarray,
    n: int,
    *,
    back: np.ndarray | None = None,
    short: Literal["drop", "whole"] = "drop",
) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every n-gram of many documents at once.

    ``hashes`` holds the token hashes of all documents back to back, ``lengths`` how many
    belong to each; ``back`` their back-references (code), counted only when they point
    inside the n-gram, so an n-gram hashes the same wherever it is copied to. Returns the
    n-gram hashes back to back and how many each document has. A document shorter than
    ``n`` has no n-gram (``short="drop"``) or one made of all its tokens (``short="whole"``,
    for MinHash shingles: a short field is still a set). Working on the concatenation
    keeps per-document Python overhead out of the loop.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    m = max(len(hashes) - n + 1, 0)
    acc = hashes[:m].copy()
    for j in range(1, n):
        acc *= _POLY
        acc += _window_token(hashes, back, j, m)
    starts = np.cumsum(lengths) - lengths
    counts = np.maximum(lengths - n + 1, 0)
    keep = expand_ranges(starts[counts > 0], counts[counts > 0])
    grams = mix64(acc[keep]) if len(keep) else _EMPTY_U64
    if short == "whole" and ((lengths > 0) & (lengths < n)).any():
        grams, counts = _add_whole_docs(grams, counts, hashes, back, starts, lengths, n)
    return grams, counts


def _window_token(hashes: np.ndarray, back: np.ndarray | None, j: int, m: int) -> np.ndarray:
    """The hash of the ``j``-th token of each of ``m`` windows, its in-window back-reference added.

    The first token of a window never points inside it, so ``j = 0`` needs no reference.
    """
    if back is None:
        return hashes[j : j + m]
    ref = back[j : j + m]
    return hashes[j : j + m] + np.where(ref <= j, ref, 0).astype(_U64) * _BACK


def _add_whole_docs(
    grams: np.ndarray,
    counts: np.ndarray,
    hashes: np.ndarray,
    back: np.ndarray | None,
    starts: np.ndarray,
    lengths: np.ndarray,
    n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Give each non-empty document shorter than ``n`` a single n-gram of all its tokens."""
    pieces = np.split(grams, np.cumsum(counts)[:-1]) if len(counts) else []
    counts = counts.copy()
    for d in np.flatnonzero((lengths > 0) & (lengths < n)):
        doc = slice(starts[d], starts[d] + lengths[d])
        pieces[d], _ = ngram_hashes(
            hashes[doc], lengths[d : d + 1], int(lengths[d]), back=None if back is None else back[doc]
        )
        counts[d] = 1
    return (np.concatenate(pieces) if pieces else _EMPTY_U64), counts


def expand_ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``, vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    firsts = np.cumsum(counts) - counts
    return np.repeat(starts - firsts, counts) + np.arange(total, dtype=np.int64)


class NgramIndex:
    """A sorted array of 64-bit n-gram hashes with the reference document of each.

    Sorted arrays instead of a Python set: 12 bytes per n-gram instead of ~70, and a
    whole batch of queries is answered by two ``searchsorted`` calls.
    """

    def __init__(self, grams: np.ndarray, counts: np.ndarray) -> None:
        docs = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        order = np.lexsort((docs, grams))
        grams, docs = grams[order], docs[order]
        first = np.ones(len(grams), dtype=bool)  # one entry per (n-gram, document)
        first[1:] = (grams[1:] != grams[:-1]) | (docs[1:] != docs[:-1])
        self.hashes: np.ndarray = grams[first]
        self.docs: np.ndarray = docs[first]

    def __len__(self) -> int:
        return len(self.hashes)

    @property
    def nbytes(self) -> int:
        return int(self.hashes.nbytes + self.docs.nbytes)

    def lookup(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (query position, reference document) pair whose n-gram hashes are equal."""
        left = np.searchsorted(self.hashes, queries, side="left")
        right = np.searchsorted(self.hashes, queries, side="right")
        counts = right - left
        hit = np.flatnonzero(counts)
        return np.repeat(hit, counts[hit]), self.docs[expand_ranges(left[hit], counts[hit])]
