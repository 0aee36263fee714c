"""Values a policy can read in its workspace: an expected value found there anchors no verdict.

A host-judged assertion anchors a task (``HostJudged.fail_to_pass_anchored``) because its expected value never enters
a sandbox: a forged report, or code special-casing the test's input, needs a value it cannot see. That holds only if
the value is nowhere else the policy's code looks. So validation reads the tree the task's tests run in (its snapshot
and its test patch) less the test modules the test patch hides (graded blinded), and calibration counts a slot as no
anchor when its expected value is readable there, by rules that need no guess at how code would look it up:

- **any file that is not Python source** spelling the value: a data file a test reads (``tests/data/scale.json``, a
  snapshot ``case7.out`` beside ``case7.in``), a README's example, a conftest's fixture text. Such a file links its
  answers to their inputs by layout, by record or by file name, in ways no window of lines bounds: the first rule
  (the value within two lines of an input) was beaten by a record spread over more lines and by an input that is no
  literal of the test;
- **a Python module** spelling the value and one of the test's input literals (the constants of the test function and
  its decorators, other than the values it expects): a skipped copy of the assertion however far apart its lines, a
  table of cases, a docstring's example. A module spelling the value alone (a fixture's amount that a balance sums to,
  a name every test uses) holds what the code computes from what it is given, not an answer stored for this test.

Only distinctive spellings count: a number of three digits or more, a string of four characters or more. ``21`` or
``"ok"`` appear in any tree and are no more readable there than guessable anyway.
"""

from __future__ import annotations

import bz2
import decimal
import fractions
import gzip
import io
import lzma
import pickle
import pickletools
import re
import zipfile
from collections.abc import Collection
from pathlib import Path

import numpy
import pyarrow
import pyarrow.parquet

MAX_FILE_BYTES = 16 * 1024 * 1024  # past either cap the tree is not read further, and every value counts as readable
MAX_TOTAL_BYTES = 128 * 1024 * 1024
# images, documents, fonts, sound and executables: no value a test compares with is read off one
_MEDIA = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"%PDF", b"wOF", b"\x00\x01\x00\x00", b"OTTO", b"RIFF", b"\x7fELF")
MIN_DIGITS = 3
MIN_CHARS = 4
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
_SKIPPED = frozenset({".git", "__pycache__", ".pytest_cache", ".trialforge"})
_SOURCE = (".py", ".pyi")


class WorkspaceText:
    """The text of a workspace's files for ``answers``, Python modules apart from every other file; ``cut``: the tree
    holds more than the caps, and every distinctive value counts as readable (a dataset past them is one the code
    can read and the host did not)."""

    def __init__(self, modules: list[str], data: list[str], cut: bool = False) -> None:
        self.modules, self.data, self.cut = modules, data, cut

    @classmethod
    def of(cls, tree: Path, leave_out: Collection[str] = ()) -> WorkspaceText:
        """``tree``'s text; ``leave_out``: relative paths no policy reads as they are here (the hidden test modules,
        blinded when graded)."""
        modules: list[str] = []
        data: list[str] = []
        total = 0
        for path in sorted(tree.rglob("*")):
            rel = path.relative_to(tree)
            if _SKIPPED & set(rel.parts) or rel.as_posix() in leave_out or not path.is_file() or path.is_symlink():
                continue
            with path.open("rb") as handle:
                raw = handle.read(MAX_FILE_BYTES + 1)
            if raw.startswith(_MEDIA):
                continue
            text = text_of(raw[:MAX_FILE_BYTES])[:MAX_FILE_BYTES]  # an array or a pickle spelled out, as much
            total += len(text)
            if len(raw) > MAX_FILE_BYTES or len(text) >= MAX_FILE_BYTES or total > MAX_TOTAL_BYTES:
                return cls([], [], cut=True)
            (modules if path.suffix in _SOURCE else data).append(text)
        return cls(modules, data)

    def answers(self, value: object, inputs: Collection[object]) -> bool:
        """Whether the workspace spells ``value`` where code can look it up (module docstring): in a file that is not
        Python source, or in a module that also spells one of ``inputs`` (the test's own input literals). A container
        is readable when each of its distinctive elements is."""
        if not distinctive(value):
            return False
        if self.cut:
            return True  # a tree past the caps, unread: any value may be in it
        if isinstance(value, (list, tuple, set, frozenset, dict)):
            items = list(value.items()) if isinstance(value, dict) else list(value)
            parts = [p for item in items for p in (item if isinstance(item, tuple) else (item,)) if distinctive(p)]
            return bool(parts) and all(self.answers(p, inputs) for p in parts)
        if any(_spells(text, value) for text in self.data):
            return True
        telling = [i for i in inputs if distinctive(i)]
        return any(_spells(text, value) and any(_spells(text, i) for i in telling) for text in self.modules)


def text_of(raw: bytes, depth: int = 0) -> str:
    """What code reading ``raw`` with a common library sees, as text: a compressed file's or an archive's contents
    (each cut at ``MAX_FILE_BYTES``), a pickle's constants (read by disassembly: nothing of it runs), a NumPy array's
    or a Parquet table's values; any other file decoded as UTF-8. A value stored so is as readable as one in a text
    file, one import away."""
    try:
        if depth < 2 and raw.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")):
            opener = gzip.open if raw[:2] == b"\x1f\x8b" else bz2.open if raw[:3] == b"BZh" else lzma.open
            with opener(io.BytesIO(raw)) as stream:
                return text_of(stream.read(MAX_FILE_BYTES), depth + 1)
        if depth < 2 and raw.startswith(b"PK\x03\x04"):
            texts, left = [], MAX_FILE_BYTES  # the members together, as much as one file
            with zipfile.ZipFile(io.BytesIO(raw)) as archive:
                for member in (m for m in archive.infolist() if not m.is_dir()):
                    if left <= 0:
                        break
                    texts.append(text_of(archive.open(member).read(left), depth + 1)[:left])
                    left -= len(texts[-1])
            return "\n".join(texts)
        if raw.startswith(b"\x80") and raw[1:2] and raw[1] <= pickle.HIGHEST_PROTOCOL:
            return "\n".join(str(arg) for _op, arg, _pos in pickletools.genops(raw) if arg is not None)
        if raw.startswith(b"\x93NUMPY"):
            return "\n".join(map(str, numpy.load(io.BytesIO(raw), allow_pickle=False).ravel()[:1_000_000].tolist()))
        if raw.startswith(b"PAR1"):
            return str(pyarrow.parquet.read_table(pyarrow.BufferReader(raw)).to_pylist()[:100_000])
    except Exception:  # a file cut at the size cap, or not what its first bytes say: read as text
        pass
    return raw.decode("utf-8", "replace")


def _needle(value: object) -> str:
    if isinstance(value, (int, float, decimal.Decimal, fractions.Fraction)):
        return _canonical(str(value)).lstrip("-").split(".")[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _spells(text: str, value: object) -> bool:
    """Whether ``text`` spells ``value``: a number by its decimal value (``957.90``, ``957.9``), a string as is."""
    needle = _needle(value)
    if needle not in text:
        return False
    if isinstance(value, (int, float, decimal.Decimal, fractions.Fraction)) and not isinstance(value, bool):
        wanted, at = _canonical(str(value)), text.find(needle)
        while at >= 0:  # the lines holding the needle, each read whole for the numbers on it
            start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
            end = len(text) if end < 0 else end
            if any(_canonical(m.group()) == wanted for m in _NUMBER.finditer(text, start, end)):
                return True
            at = text.find(needle, end)
        return False
    return isinstance(value, (str, bytes))


def distinctive(value: object) -> bool:
    """A value spelled rarely enough to be told apart from the numbers and words any text holds."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, (int, float, decimal.Decimal, fractions.Fraction)):
        return sum(c.isdigit() for c in _canonical(str(value))) >= MIN_DIGITS
    if isinstance(value, (str, bytes)):
        return len(value.strip()) >= MIN_CHARS
    return isinstance(value, (list, tuple, set, frozenset, dict))


def _canonical(number: str) -> str:
    """``957.90`` and ``957.9`` alike: the decimal value, trailing zeros dropped."""
    try:
        return format(decimal.Decimal(number).normalize(), "f")
    except decimal.InvalidOperation:
        return number
