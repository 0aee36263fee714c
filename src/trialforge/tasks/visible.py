"""Values a policy can read in its workspace: an expected value found there anchors no verdict.

A host-judged assertion anchors a task (``HostJudged.fail_to_pass_anchored``) because its expected value never enters
a sandbox: a forged report, or code special-casing the test's input, needs a value it cannot see. That holds only if
the value is nowhere else the policy's code looks: a data file the hidden test reads (``tests/data/scale.json``), a
skipped copy of the assertion in a module the bug did not break, a docstring's example, a data file or conftest the
test patch brings (in the graded sandbox, readable by the package). So validation reads the tree the task's tests run
in (its snapshot and its test patch) less the test modules the test patch hides (graded blinded), and calibration
counts a slot as no anchor when its expected value is spelled there beside one of the slot's own input literals
(``3071`` and ``4071`` on a data file's line, ``fold(9100) == 9190`` in a skipped copy: a red team's two wins,
``tests/test_redteam_hidden.py``): an answer the policy's code can look up by the input it is given.

Only distinctive spellings count: a number of three digits or more, a string of four characters or more. ``21`` or
``"ok"`` appear in any tree and are no more readable there than guessable anyway; and a value found with none of the
test's inputs beside it (a fixture's amount that a balance sums to, a name every test uses) is what the code computes
from what it is given, not an answer stored for this test.
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
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
NEAR = 2  # lines either side of a value where its input counts as beside it
_SKIPPED = frozenset({".git", "__pycache__", ".pytest_cache", ".trialforge"})


class WorkspaceText:
    """The lines of a workspace's files (each file cut at ``MAX_FILE_BYTES``, all at ``MAX_TOTAL_BYTES``), for
    ``answers``."""

    def __init__(self, text: str) -> None:
        self.text, self.lines = text, text.splitlines()

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
                chunks.append(chunk.decode("utf-8", "replace"))
                total += len(chunk)
        return cls("\n".join(chunks))

    def answers(self, value: object, inputs: Collection[object]) -> bool:
        """Whether the workspace spells ``value`` within ``NEAR`` lines of one of ``inputs`` (the test's own input
        literals: ``3071`` beside ``4071`` in a data file, ``fold(9100)`` beside ``9190`` in a skipped copy): an answer
        the policy can look up. A value found alone ties to no test (a fixture's amount, a name every test uses)."""
        telling = [i for i in inputs if distinctive(i)]
        if not telling or not distinctive(value):
            return False
        if isinstance(value, (list, tuple, set, frozenset, dict)):
            items = list(value.items()) if isinstance(value, dict) else list(value)
            parts = [p for item in items for p in (item if isinstance(item, tuple) else (item,)) if distinctive(p)]
            return bool(parts) and all(self.answers(p, telling) for p in parts)
        for index in self._holding(value):
            window = self.lines[max(0, index - NEAR) : index + NEAR + 1]
            if any(any(_spells(line, i) for line in window) for i in telling):
                return True
        return False

    def _holding(self, value: object) -> list[int]:
        """The lines spelling ``value``; the whole text is searched first, once, for what each of them must hold."""
        if _needle(value) not in self.text:
            return []
        return [n for n, line in enumerate(self.lines) if _spells(line, value)]


def _needle(value: object) -> str:
    if isinstance(value, (int, float, decimal.Decimal, fractions.Fraction)):
        return _canonical(str(value)).lstrip("-").split(".")[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _spells(line: str, value: object) -> bool:
    """Whether ``line`` spells ``value``: a number by its decimal value (``957.90``, ``957.9``), a string as is."""
    if isinstance(value, (int, float, decimal.Decimal, fractions.Fraction)) and not isinstance(value, bool):
        wanted = _canonical(str(value))
        return _needle(value) in line and any(_canonical(m.group()) == wanted for m in _NUMBER.finditer(line))
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return isinstance(value, str) and value in line


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
