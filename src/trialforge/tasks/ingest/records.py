"""Reading export files (JSON lines or one JSON array) into records, each with the line it came from.

Bad input never stops a run and is never truncated: a line over ``IngestCaps.max_record_bytes`` is dropped
before it is decoded or parsed (``oversize_record``); a record that is not JSON, not an object, or holds
bytes that are not UTF-8 is dropped with its line (``malformed_json``, ``invalid_record``, ``bad_encoding``)
and its neighbours survive.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trialforge.funnel import Funnel
from trialforge.tasks.ingest.caps import CAPS_SETTING, DEFAULT_CAPS, IngestCaps

_SKIP_CHUNK = 1 << 20  # the rest of an oversize line is read and discarded in pieces this big


@dataclass(frozen=True)
class Record:
    where: str  # file:line, for the report
    data: dict[str, Any]


def read_lines(path: Path, funnel: Funnel, max_record_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes without the line end) of each non-blank line; longer ones are dropped unread.

    A line over ``max_record_bytes`` is never held whole: ``readline`` stops at the cap and the rest is
    read and discarded in pieces, so a 50 MB line costs one pass and a megabyte of memory. It goes to
    ``funnel`` as ``oversize_record`` with its line number and size.
    """
    with path.open("rb") as fh:
        for lineno, line in enumerate(_bounded_lines(fh, max_record_bytes), start=1):
            if isinstance(line, int):
                funnel.drop(
                    f"{path.name}:{lineno}",
                    "oversize_record",
                    f"line {lineno} is {line:,} bytes > {max_record_bytes:,} ({CAPS_SETTING}.max_record_bytes)",
                )
            elif line.strip():
                yield lineno, line.removeprefix(b"\xef\xbb\xbf") if lineno == 1 else line


def _bounded_lines(fh: BinaryIO, limit: int) -> Iterator[bytes | int]:
    """Each line without its end, or the size of a line over ``limit`` bytes in its place."""
    while chunk := fh.readline(limit + 2):  # room for the line end: a line of exactly ``limit`` bytes fits
        line = chunk.removesuffix(b"\n").removesuffix(b"\r") if chunk.endswith(b"\n") else chunk
        if len(line) <= limit:
            yield line
            continue
        size = len(line)
        while not chunk.endswith(b"\n") and (chunk := fh.readline(_SKIP_CHUNK)):
            size += len(chunk.removesuffix(b"\n"))
        yield size


def read_json_records(path: Path, funnel: Funnel, *, caps: IngestCaps = DEFAULT_CAPS) -> Iterator[Record]:
    """Records of a JSON-lines file or of one JSON array; unreadable ones go to ``funnel`` with their line.

    Bytes that are not UTF-8 are kept as lone surrogates while parsing, so one bad record is reported
    (``bad_encoding``, naming its field) and its neighbours survive. A JSON-lines record over
    ``caps.max_record_bytes`` is dropped before it is decoded (:func:`read_lines`); a JSON array is one
    document, read whole, so its elements are measured as they are parsed (give big exports as JSON lines).
    """
    if _first_char(path) == b"[":
        text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
        parsed = _array_records(path.name, text, funnel, caps.max_record_bytes)
    else:
        parsed = _line_records(path, funnel, caps.max_record_bytes)
    for where, value in parsed:
        if not isinstance(value, dict):
            funnel.drop(where, "invalid_record", f"expected a JSON object, got {type(value).__name__}")
            continue
        bad = find_undecodable(value)
        if bad is not None:
            funnel.drop(where, "bad_encoding", f"field {bad} is not valid UTF-8")
            continue
        yield Record(where, value)


def _first_char(path: Path) -> bytes:
    """The first byte that is not whitespace or a byte-order mark (``[`` for a JSON array)."""
    with path.open("rb") as fh:
        while (byte := fh.read(1)) and (byte.isspace() or byte in b"\xef\xbb\xbf"):
            pass
    return byte


def _line_records(path: Path, funnel: Funnel, max_record_bytes: int) -> Iterator[tuple[str, Any]]:
    for lineno, line in read_lines(path, funnel, max_record_bytes):
        where = f"{path.name}:{lineno}"
        try:
            yield where, json.loads(line.decode("utf-8", errors="surrogateescape"))
        except json.JSONDecodeError as exc:
            funnel.drop(where, "malformed_json", f"line {lineno}: {exc}")


def _array_records(name: str, text: str, funnel: Funnel, max_record_bytes: int) -> Iterator[tuple[str, Any]]:
    """Elements of a top-level JSON array one at a time, so each has a line number and a size."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        pos = _skip(text, pos, ",")
        if pos >= len(text) or text[pos] == "]":
            return
        where = f"{name}:{text.count(chr(10), 0, pos) + 1}"
        start = pos
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            funnel.drop(where, "malformed_json", f"{exc}; the rest of the array cannot be read")
            return
        # characters <= bytes <= 4 * characters: encode only when the count is in doubt
        size = pos - start
        if size * 4 > max_record_bytes:
            size = len(text[start:pos].encode("utf-8", "surrogateescape"))
        if size > max_record_bytes:
            cap = f"{max_record_bytes:,} ({CAPS_SETTING}.max_record_bytes)"
            funnel.drop(where, "oversize_record", f"array element is {size:,} bytes > {cap}")
            continue
        yield where, value


def _skip(text: str, pos: int, separators: str) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
        pos += 1
    return pos


def find_undecodable(value: Any, where: str = "") -> str | None:
    """The path of the first string holding a lone surrogate (an undecodable byte), or None."""
    if isinstance(value, str):
        return where or "(value)" if any("\ud800" <= ch <= "\udfff" for ch in value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = find_undecodable(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None
