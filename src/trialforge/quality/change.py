"""What a patch changes in a task's base tree, file by file and line by line: ``Change`` and ``ChangedFile``.

The audits reason about a fix through this: the lines it adds or touches, and its hunks, which can be applied
one at a time (a partial revert of a fix is built from some of them).
"""

from __future__ import annotations

import difflib
import shutil
from dataclasses import dataclass
from pathlib import Path

from trialforge.tasks.patches import apply_patch, touched_paths

HUNK_CONTEXT = 3  # lines of context that separate two hunks, as in ``git diff``

Opcode = tuple[str, int, int, int, int]


@dataclass(frozen=True)
class ChangedFile:
    """One text file a patch changes. ``before``/``after`` is None when the patch creates/deletes it.

    Hunks are the patch's change groups (changes closer than ``HUNK_CONTEXT`` lines form one hunk);
    ``with_hunks`` applies only some of them, which is how a partial revert of a fix is built.
    """

    path: str
    before: str | None
    after: str | None
    opcodes: tuple[Opcode, ...]
    groups: tuple[int, ...]  # the hunk of each opcode; -1 for unchanged runs

    @classmethod
    def of(cls, path: str, before: str | None, after: str | None) -> ChangedFile:
        old, new = _lines(before), _lines(after)
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        opcodes = tuple(matcher.get_opcodes())  # first: get_grouped_opcodes trims the cached list in place
        hunk_of = {
            op: number
            for number, group in enumerate(matcher.get_grouped_opcodes(HUNK_CONTEXT))
            for op in group
            if op[0] != "equal"
        }  # fmt: skip
        return cls(path, before, after, opcodes, tuple(hunk_of.get(op, -1) for op in opcodes))

    @property
    def hunks(self) -> int:
        return max(self.groups, default=-1) + 1

    def hunk_line(self, hunk: int) -> int:
        """The first line (of ``after``) that ``hunk`` changes: where a person would look."""
        return next(j1 + 1 for (_, _, _, j1, _), g in zip(self.opcodes, self.groups, strict=True) if g == hunk)

    def added_lines(self) -> frozenset[int]:
        """1-based lines of ``after`` that the patch adds or rewrites."""
        return frozenset(j + 1 for (tag, _, _, j1, j2) in self.opcodes if tag != "equal" for j in range(j1, j2))

    def touched_lines(self) -> frozenset[int]:
        """1-based lines of ``before`` that the patch removes or rewrites, and the line before each insertion."""
        lines: set[int] = set()
        for tag, i1, i2, _, _ in self.opcodes:
            if tag != "equal":
                lines.update(range(i1 + 1, i2 + 1) if i2 > i1 else [max(i1, 1)])
        return frozenset(lines)

    def with_hunks(self, keep: set[int]) -> str | None:
        """The file with only the hunks in ``keep`` applied (None: the file does not exist then)."""
        everything = set(range(self.hunks))
        if (self.before is None and not keep & everything) or (self.after is None and everything <= keep):
            return None
        old, new = _lines(self.before), _lines(self.after)
        return "".join(
            "".join(new[j1:j2] if group in keep else old[i1:i2])
            for (_, i1, i2, j1, j2), group in zip(self.opcodes, self.groups, strict=True)
        )


@dataclass(frozen=True)
class Change:
    """A patch applied to a copy of the base tree: the patched tree and every text file it changed."""

    base: Path
    tree: Path
    files: tuple[ChangedFile, ...]

    @classmethod
    def apply(cls, base: Path, patch: str, dest: Path) -> Change:
        """Copy ``base`` to ``dest`` and apply ``patch`` there (raises PatchError when it does not apply)."""
        shutil.copytree(base, dest, symlinks=True)
        if patch.strip():
            apply_patch(dest, patch)
        files = []
        for path in touched_paths(patch):
            before, after = _read_text(base / path), _read_text(dest / path)
            if before != after:
                files.append(ChangedFile.of(path, before, after))
        return cls(base, dest, tuple(files))

    def texts(self) -> dict[str, str | None]:
        """Every changed file's patched text (None: deleted): the patch as whole-file rewrites of the base."""
        return {f.path: f.after for f in self.files}

    def python_files(self) -> list[ChangedFile]:
        """The changed Python files that exist after the patch."""
        return [f for f in self.files if f.after is not None and f.path.endswith(".py")]


def _lines(text: str | None) -> list[str]:
    return text.splitlines(keepends=True) if text else []


def _read_text(path: Path) -> str | None:
    """A regular file's text; None when absent (or binary: the audits reason about text only)."""
    if not path.is_file() or path.is_symlink():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
