"""Values a policy can read in its workspace: an expected value found there anchors no verdict.

A host-judged assertion anchors a task (``HostJudged.fail_to_pass_anchored``) because its expected value never enters
a sandbox: a forged report, or code special-casing the test's input, needs a value it cannot see. That holds only if
the value is nowhere else the policy's code looks: a data file the hidden test reads (``tests/data/scale.json``), a
skipped copy of the assertion in a module the bug did not break, a docstring's example, a data file or conftest the
test patch brings (in the graded sandbox, readable by the package). So validation reads the tree the task's tests run
in (its snapshot and its test patch) less the test modules the test patch hides (graded blinded), and calibration
counts a slot whose expected value appears there, spelled as a file would spell it, as no anchor (a red team's two
wins: ``tests/test_redteam_hidden.py``).

Only distinctive spellings count: a number of three digits or more, a string of four characters or more, a
container's repr. ``21`` or ``"ok"`` appear in any tree and are no more readable there than guessable anyway.
"""

from __future__ import annotations

import decimal
import fractions
import re
from collections.abc import Collection
from pathlib import Path

MAX_FILE_BYTES = 4 * 1024 * 1024  # a bigger file (a dataset, a binary) is read no further
MAX_TOTAL_BYTES = 64 * 1024 * 1024
MIN_DIGITS = 3
MIN_CHARS = 4
_NUMBER = re.compile(rb"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
_SKIPPED = frozenset({".git", "__pycache__", ".pytest_cache", ".trialforge"})


class WorkspaceText:
    """The text of a workspace's files (each cut at ``MAX_FILE_BYTES``, all at ``MAX_TOTAL_BYTES``), and the numbers
    it spells, for ``shows``."""

    def __init__(self, text: str, numbers: frozenset[str]) -> None:
        self.text, self.numbers = text, numbers

    @classmethod
    def of(cls, tree: Path, leave_out: Collection[str] = ()) -> WorkspaceText:
        """``tree``'s text; ``leave_out``: relative paths no policy reads as they are here (the hidden test modules,
        blinded when graded)."""
        chunks, total = [], 0
        for path in sorted(tree.rglob("*")):
            rel = path.relative_to(tree)
            if total >= MAX_TOTAL_BYTES or _SKIPPED & set(rel.parts) or rel.as_posix() in leave_out:
                continue
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as handle:
                    chunk = handle.read(min(MAX_FILE_BYTES, MAX_TOTAL_BYTES - total))
                chunks.append(chunk)
                total += len(chunk)
        data = b"\n".join(chunks)
        numbers = frozenset(_canonical(m.group().decode()) for m in _NUMBER.finditer(data))
        return cls(data.decode("utf-8", "replace"), numbers)

    def shows(self, value: object) -> bool:
        """Whether ``value`` is spelled in the workspace distinctively enough to be read off it."""
        if isinstance(value, bool) or value is None:
            return False
        if isinstance(value, (int, float, decimal.Decimal, fractions.Fraction)):
            spelled = _canonical(str(value))
            return sum(c.isdigit() for c in spelled) >= MIN_DIGITS and spelled in self.numbers
        if isinstance(value, (str, bytes)):
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            return len(text.strip()) >= MIN_CHARS and text in self.text
        if isinstance(value, (list, tuple, set, frozenset, dict)):
            items = list(value.items()) if isinstance(value, dict) else list(value)
            parts = [p for item in items for p in (item if isinstance(item, tuple) else (item,))]
            telling = [p for p in parts if distinctive(p)]
            return bool(telling) and all(self.shows(p) for p in telling)  # every telling element readable
        return len(repr(value)) >= MIN_CHARS and repr(value) in self.text


def distinctive(value: object) -> bool:
    """A value spelled rarely enough to be told apart from the numbers and words any text holds."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, (int, float, decimal.Decimal, fractions.Fraction)):
        return sum(c.isdigit() for c in str(value)) >= MIN_DIGITS
    if isinstance(value, (str, bytes)):
        return len(value.strip()) >= MIN_CHARS
    return True


def _canonical(number: str) -> str:
    """``957.90``, ``957.9`` and ``9.579e2`` alike: the decimal value, trailing zeros dropped."""
    try:
        return format(decimal.Decimal(number).normalize(), "f")
    except decimal.InvalidOperation:
        return number
