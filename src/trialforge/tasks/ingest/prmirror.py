"""PR mirror: candidate bugs made by reverting one hunk of a real fix from a repository's history (SWE-smith's name).

A fix commit is one gitlog mining would take as a fix: it changes code and tests together, and its message and
syntax trees say it fixes something (``fixes.commit_fix``, ``nonfix``). Each of its code hunks (``difflib``'s
grouping, ``HUNK_CONTEXT`` lines of context, as ``git diff`` groups them) whose fixed text is still in the
current file, exactly once, becomes a candidate: the current file with that text put back as it was before the
fix. The current tree is the fix; whether the candidate is a bug is left to the repository's own tests, which
screen it like any mutant (``tasks/synthesize.py``). docs/synthesis.md.
"""

from __future__ import annotations

import difflib
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trialforge.errors import RepoError
from trialforge.tasks.ingest.fixes import MAX_CHANGED_LINES, commit_fix
from trialforge.tasks.ingest.git import rev_list
from trialforge.tasks.ingest.nonfix import check_code_change, check_message
from trialforge.tasks.ingest.objects import Commit, ObjectReader
from trialforge.tasks.mutations import Edit, Mutant
from trialforge.tasks.patches import touched_paths
from trialforge.tasks.pytestconfig import python_files

log = logging.getLogger(__name__)

FAMILY = "pr_mirror"
HUNK_CONTEXT = 3  # lines of context around a hunk: they anchor it in the current file


@dataclass
class MirrorScan:
    """What the history gave: commits judged (taken as fixes, or skipped by reason) and hunks (reverted or not)."""

    commits: Counter[str] = field(default_factory=Counter)
    hunks: Counter[str] = field(default_factory=Counter)


def pr_mirror_mutants(
    repo: Path, rev: str, sources: Mapping[str, str], *, max_changed_lines: int = MAX_CHANGED_LINES
) -> tuple[list[Mutant], MirrorScan]:
    """One candidate per revertible code hunk of the fix commits reachable from ``rev`` (newest first, each
    distinct result once); ``sources``: the current text of the library files a candidate may change."""
    scan = MirrorScan()
    found: dict[tuple[str, str], Mutant] = {}
    with ObjectReader(repo) as objects:
        for sha, parents in reversed(rev_list(repo, rev)):
            commit = objects.commit(sha)
            try:
                paths = _fixed_paths(repo, objects, commit, max_changed_lines)
            except RepoError as exc:
                scan.commits[exc.reason] += 1
                continue
            scan.commits["fix"] += 1
            for path in paths:
                before, after = objects.text(parents[0], path), objects.text(sha, path)
                now = _current_path(path, sources)
                if now is None or before is None or after is None:
                    scan.hunks["not_library_code_now"] += 1
                    continue
                for mutant in _reverted_hunks(now, before, after, sources[now], sha, scan):
                    found.setdefault((now, mutant.apply(sources[now])), mutant)
    scan.hunks["reverted"] = len(found)
    log.info("pr mirror %s@%s: %d candidates", repo, rev, len(found), extra={"commits": dict(scan.commits),
                                                                              "hunks": dict(scan.hunks)})  # fmt: skip
    return list(found.values()), scan


def _current_path(path: str, sources: Mapping[str, str]) -> str | None:
    """Where a file the fix changed is now: the same path, or the one library file whose path ends with it (a
    package moved under ``src/``)."""
    if path in sources:
        return path
    moved = [now for now in sources if now.endswith("/" + path)]
    return moved[0] if len(moved) == 1 else None


def _fixed_paths(repo: Path, objects: ObjectReader, commit: Commit, max_changed_lines: int) -> list[str]:
    """The code paths of a commit gitlog would mine as a fix; a ``RepoError`` (with its reason) otherwise."""
    check_message(commit)
    collected = python_files(lambda name: objects.text(commit.sha, name))
    code, _ = commit_fix(repo, commit, max_changed_lines=max_changed_lines, collected=collected)
    paths = touched_paths(code)
    check_code_change(commit, paths, objects.text)
    return [p for p in paths if p.endswith(".py")]


def _reverted_hunks(path: str, before: str, after: str, current: str, sha: str, scan: MirrorScan) -> list[Mutant]:
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    out = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for number, group in enumerate(matcher.get_grouped_opcodes(HUNK_CONTEXT)):
        # The changed lines with as much of their context as still anchors them in the current file: code near a
        # fix often changed since, the fixed lines themselves less often.
        for context in range(HUNK_CONTEXT, -1, -1):
            (i1, i2), (j1, j2) = _span(group, context)
            fixed, buggy = "".join(new[j1:j2]), "".join(old[i1:i2])
            start = _only_place(current, fixed)
            if start is not None:
                break
        else:
            scan.hunks["changed_since"] += 1
            continue
        first = current.count("\n", 0, start) + 1
        edit = Edit(start, start + len(fixed), buggy)
        note = f"revert hunk {number} of {sha[:12]} in {path}"
        out.append(Mutant(FAMILY, path, first, first + max(fixed.count("\n") - 1, 0), (edit,), note))
    return out


Opcode = tuple[str, int, int, int, int]  # difflib's (tag, i1, i2, j1, j2)


def _span(group: list[Opcode], context: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (before, after) line ranges of one hunk with at most ``context`` lines of its context on each side."""
    (first, a1, a2, b1, b2), (last, c1, c2, d1, d2) = group[0], group[-1]
    i1, j1 = (max(a1, a2 - context), max(b1, b2 - context)) if first == "equal" else (a1, b1)
    i2, j2 = (min(c2, c1 + context), min(d2, d1 + context)) if last == "equal" else (c2, d2)
    return (i1, i2), (j1, j2)


def _only_place(text: str, block: str) -> int | None:
    """Where ``block`` (whole lines) occurs in ``text``, when it occurs there exactly once and starts a line."""
    if not block.strip():
        return None
    at = text.find(block)
    if at < 0 or (at > 0 and text[at - 1] != "\n") or text.find(block, at + 1) >= 0:
        return None
    return at
