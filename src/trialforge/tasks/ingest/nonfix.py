"""Commits that fix nothing, each refused with its own reason: bots, reverts, merges, releases, housekeeping,
and changes whose code side no test could tell from the parent (comments, docstrings, a typo in a string).

The message is judged before the diff is read (:func:`check_message`); the diff's code side after
(:func:`check_code_change`), by comparing syntax trees, not text. Every rule: docs/ingest.md, "Git history".
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

from trialforge.errors import RepoError
from trialforge.pyast import parse
from trialforge.tasks.ingest.fixes import is_support_file
from trialforge.tasks.ingest.objects import Commit

# (reason, what it is, subject or message pattern): the first that matches names the commit. Narrow on purpose: a
# real fix whose subject merely contains a word ("Fix whitespace handling") must pass; the diff rules catch the rest.
_FLAGS = re.IGNORECASE | re.MULTILINE
MESSAGE_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("bot_commit", "a bot's commit (pre-commit.ci, Dependabot, Renovate)", re.compile(
        r"\A(?:\[pre-commit\.ci\]|pre-commit autoupdate|\[(?:dependabot|renovate|bot)\]|bump \S+ from \S+ to \S+"
        r"|(?:chore|build|fix)\(deps(?:-dev)?\)|update (?:dependency|module|pre-commit hook) \S+ to )", _FLAGS)),
    ("revert_commit", "a revert", re.compile(
        r"\Arevert\s+(?:\"|[0-9a-f]{7,40}\b)|^this reverts commit [0-9a-f]{7,40}\b", _FLAGS)),
    ("merge_commit", "a merge rebased to one parent", re.compile(
        r"\Amerge (?:branch|pull request|remote-tracking branch|tag|(?:the )?changes from) ", _FLAGS)),
    ("release_commit", "a release or version bump", re.compile(
        r"\A(?:(?:chore\()?release\)?!?:|(?:release|prepare(?: for)?(?: release)?|bump(?: version)?(?: to)?|version)"
        r"\s+v?\d+\.\d+|v?\d+\.\d+(?:\.\d+)*[\w.+-]*\s*$)", _FLAGS)),
    ("housekeeping_commit", "a chore, docs, CI or build commit (its conventional-commit type)", re.compile(
        r"\A(?:chore|docs?|ci|build|deps)(?:\([^)]*\))?!?:", _FLAGS)),
    ("style_commit", "a formatting or lint commit", re.compile(
        r"\A(?:style(?:\([^)]*\))?!?:|(?:apply|run|ran|use)\s+(?:black|isort|ruff|pyupgrade|autopep8|yapf|flake8"
        r"|pre-commit|codespell)\b|(?:fix(?:ed)?\s+)?(?:lint|linting|linter|flake8|pylint|ruff)\s+(?:errors?|warnings?"
        r"|issues?|complaints?)\s*$|(?:re)?format(?:ted)?\s+(?:the\s+)?(?:code|codebase|sources?|files?)\b)", _FLAGS)),
)  # fmt: skip
_TYPO = re.compile(r"\b(?:typos?|spelling|misspel\w*|mis-spel\w*|spelled|grammar)\b", re.IGNORECASE)

Source = Callable[[str, str], str | None]  # (commit, path) -> the file's text there, None when absent


def check_message(commit: Commit) -> None:
    """The first of ``MESSAGE_RULES`` the message matches, as a ``RepoError`` with that rule's reason."""
    for reason, what, pattern in MESSAGE_RULES:
        if pattern.search(commit.message):
            raise RepoError(f"commit {commit.sha} is {what}: {commit.subject!r}", reason=reason)


def check_code_change(commit: Commit, code_paths: Sequence[str], source: Source) -> None:
    """``no_behaviour_change`` when every code file the commit changes is Python whose syntax tree, docstrings
    left out, is the parent's (comments, docstrings, formatting); ``typo_fix`` when the subject says typo or
    spelling and the trees differ only in string literals. A file that does not parse, or is not Python, counts
    as a change of behaviour: the commit is kept."""
    code = [path for path in code_paths if not is_support_file(path)]  # a README edit beside is no behaviour
    if not code or not all(PurePosixPath(path).suffix == ".py" for path in code):
        return
    pairs = [(source(commit.parents[0], path), source(commit.sha, path)) for path in code]
    if all(_same(before, after, strings=True) for before, after in pairs):
        raise RepoError(
            f"commit {commit.sha} changes only comments, docstrings or formatting of {', '.join(code)}: "
            "no test can tell it from its parent",
            reason="no_behaviour_change",
        )
    if _TYPO.search(commit.subject) and all(_same(before, after, strings=False) for before, after in pairs):
        raise RepoError(
            f"commit {commit.sha} fixes a typo in text ({commit.subject!r}): only string literals change",
            reason="typo_fix",
        )


def _same(before: str | None, after: str | None, *, strings: bool) -> bool:
    """Whether two versions of a module are one program (``strings``: string literals must match too)."""
    if before is None or after is None:
        return False  # a file added or removed
    shapes = [_shape(text, strings=strings) for text in (before, after)]
    return shapes[0] is not None and shapes[0] == shapes[1]


def _shape(source: str, *, strings: bool) -> str | None:
    """The module's syntax tree without docstrings (string values blanked unless ``strings``); None: no parse."""
    try:
        tree = parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and _docstring(body):
            node.body = body[1:] or [ast.Pass()]
        if not strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def _docstring(body: list[ast.stmt] | None) -> bool:
    first = body[0] if body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
