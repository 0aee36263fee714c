"""Whether a task's fix lies in the repair policy's action space, and why not.

The demo's repair policy (``rollout/repair.py``) rewrites one line of one library file with a
single-token edit (``repair_edits.line_edits``). A task whose gold patch is anything else, a fix that adds a deleted
statement, changes several lines or files, or rewrites a line in a way no single-token edit does, cannot be
solved by it however well it learns: a low solve rate on such tasks says nothing about learning.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trialforge.rollout.repair_edits import Candidate, line_edits, statement
from trialforge.tasks.patches import is_test_path, touched_paths
from trialforge.tasks.schema import Task

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")
_FILE = re.compile(r"^\+\+\+ (?:b/)?(\S+)|^--- (?:a/)?(\S+)")


@dataclass(frozen=True)
class Reach:
    reachable: bool
    reason: str  # why not; empty when reachable


def fix_in_reach(task: Task) -> Reach:
    """Reachable iff the gold patch rewrites exactly one line of one non-test Python file into a line that
    ``line_edits`` proposes for it: the same text but for trailing whitespace, or the same statement once
    parsed (the policy's ``if (x < lo):`` fixes what ``if x < lo:`` fixes).

    This is the action space only: the policy must also localise the line (a line of a function body that a
    failing test ran, or of a function the issue names) and rank the edit among its first attempts.

    A fix that puts back a name (returns it, or passes it as a call's last argument) is proposed only when
    the function binds that name and never reads it. The patch does not show the function, so this check
    assumes so; ``gold_edit`` on an episode's candidates is exact.
    """
    files = {path: lines for path, lines in _changes(task.gold_patch).items() if not is_test_path(path)}
    python = [path for path in files if path.endswith(".py")]
    if not python:
        return Reach(False, "the fix touches no Python file")
    if len(files) > 1:
        return Reach(False, f"the fix changes {len(files)} files; the policy edits one")
    removed, added = files[python[0]]
    if not removed and not added:
        return Reach(False, "the fix changes no line (a rename or a mode change?)")
    if not removed:
        return Reach(False, "the fix adds lines (a deleted statement or branch); the policy only rewrites a line")
    if not added:
        return Reach(False, "the fix removes lines")
    if len(removed) > 1 or len(added) > 1:
        return Reach(False, f"the fix changes {max(len(removed), len(added))} lines; the policy rewrites one")
    old, new = removed[0], added[0]
    names_before = set(_NAME.findall(old))
    put_back = tuple(dict.fromkeys(n for n in _NAME.findall(new) if n not in names_before))
    if not any(_same(candidate, new) for _, candidate in line_edits(old, put_back)):
        return Reach(False, "the one-line fix is neither a one-token edit nor an unread name put back")
    return Reach(True, "")


def gold_edit(task: Task, candidates: list[Candidate]) -> int | None:
    """Which of ``candidates`` is the task's gold fix: None when none is (out of reach, or not localised)."""
    if not fix_in_reach(task).reachable:
        return None
    files = {path: lines for path, lines in _changes(task.gold_patch).items() if not is_test_path(path)}
    ((path, ([old], [new])),) = files.items()
    for i, c in enumerate(candidates):
        if c.path == path and c.old_line.rstrip() == old.rstrip() and _same(c.new_line, new):
            return i
    return None


def family_reach(tasks: Iterable[Task]) -> dict[str, dict[str, Any]]:
    """Per family: how many tasks, how many the policy can reach, and why the rest are out of reach."""
    counts: dict[str, Counter[str]] = {}
    totals: Counter[str] = Counter()
    reachable: Counter[str] = Counter()
    for task in tasks:
        family, reach = task.family(), fix_in_reach(task)
        totals[family] += 1
        counts.setdefault(family, Counter())
        if reach.reachable:
            reachable[family] += 1
        else:
            counts[family][reach.reason] += 1
    return {
        family: {
            "tasks": totals[family],
            "reachable": reachable[family],
            "unreachable_reasons": dict(counts[family].most_common()),
        }
        for family in sorted(totals)
    }


def _same(a: str, b: str) -> bool:
    """The same line but for trailing whitespace, or the same statement (block headers parsed with a body)."""
    if a.rstrip() == b.rstrip():
        return True
    parsed = statement(a)
    return parsed is not None and parsed == statement(b)


def _changes(patch: str) -> dict[str, tuple[list[str], list[str]]]:
    """Per file a unified diff changes: (lines removed, lines added), read hunk by hunk by the hunks' counts.

    A file named only in a ``diff --git`` header (a rename, a mode change) changes no line.
    """
    files: dict[str, tuple[list[str], list[str]]] = {}
    removed: list[str] = []
    added: list[str] = []
    in_file = False
    old_left = new_left = 0
    old_path = ""
    for line in patch.splitlines():
        if (old_left > 0 or new_left > 0) and not line.startswith("diff --git "):
            # Inside a hunk: a "---" line is a removed line, not a header.
            if line.startswith("\\"):  # "\ No newline at end of file"
                continue
            if line.startswith("-"):
                removed.append(line[1:])
                old_left -= 1
            elif line.startswith("+"):
                added.append(line[1:])
                new_left -= 1
            else:
                old_left, new_left = old_left - 1, new_left - 1
            continue
        if line.startswith("diff --git "):
            old_left = new_left = 0  # the next file (a miscounted hunk ends here)
            for path in touched_paths(line)[-1:]:
                removed, added = files.setdefault(path, ([], []))
                in_file = True
        elif match := _FILE.match(line):
            new_path, removed_path = match.groups()
            if removed_path is not None:
                old_path = removed_path
            else:  # a deleted file is named by its old side
                path = old_path if new_path == "/dev/null" else new_path
                removed, added = files.setdefault(path, ([], []))
                in_file = True
        elif (hunk := _HUNK.match(line)) and in_file:
            old_left, new_left = (int(n) if n is not None else 1 for n in hunk.groups())
    return files
