"""Commits that fix nothing, each refused with its own reason: bots, reverts, merges, releases, housekeeping,
and changes whose code side no test could tell from the parent (comments, docstrings, a typo in a string).

The message is judged before the diff is read (:func:`check_message`); the diff's code side after
(:func:`check_code_change`), by comparing syntax trees, not text. Every rule: docs/ingest.md, "Git history".
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import PurePosixPath

from trialforge.errors import RepoError
from trialforge.pyast import parse
from trialforge.tasks.ingest.fixes import is_support_file
from trialforge.tasks.ingest.objects import Commit


@dataclass(frozen=True)
class MessageRule:
    """A kind of commit that fixes nothing, told by how its subject opens (case-insensitive), or by a line of its
    message (``line``). Anchored on purpose: a fix whose subject merely contains a word ("Fix whitespace
    handling") passes; the diff rules catch the rest."""

    reason: str
    what: str
    opens: tuple[str, ...]
    line: str = ""

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        line = f"|^(?:{self.line})" if self.line else ""
        return re.compile(rf"\A(?:{'|'.join(self.opens)}){line}", re.IGNORECASE | re.MULTILINE)

    def matches(self, message: str) -> bool:
        return self._pattern.search(message) is not None


_CONVENTIONAL = r"(?:\([^)]*\))?!?:"  # a conventional commit's optional scope, breaking mark and colon
_TOOLS = r"(?:black|isort|ruff|pyupgrade|autopep8|yapf|flake8|pre-commit|codespell)\b"
MESSAGE_RULES = (  # the first that matches names the commit
    MessageRule("bot_commit", "a bot's commit (pre-commit.ci, Dependabot, Renovate)", (
        r"\[pre-commit\.ci\]", r"pre-commit autoupdate", r"\[(?:dependabot|renovate|bot)\]",
        r"bump \S+ from \S+ to \S+", r"(?:chore|build|fix)\(deps(?:-dev)?\)",
        r"update (?:dependency|module|pre-commit hook) \S+ to ")),
    MessageRule("revert_commit", "a revert", (r'revert\s+(?:"|[0-9a-f]{7,40}\b)',),
                line=r"this reverts commit [0-9a-f]{7,40}\b"),
    MessageRule("merge_commit", "a merge rebased to one parent",
                (r"merge (?:branch|pull request|remote-tracking branch|tag|(?:the )?changes from) ",)),
    MessageRule("release_commit", "a release or version bump", (
        rf"(?:chore\()?release\)?{_CONVENTIONAL}",
        r"(?:release|prepare(?: for)?(?: release)?|bump(?: version)?(?: to)?|version)\s+v?\d+\.\d+",
        r"v?\d+\.\d+(?:\.\d+)*[\w.+-]*\s*$")),
    MessageRule("housekeeping_commit", "a chore, docs, CI or build commit (its conventional-commit type, or says so)",
                (rf"(?:chore|docs?|ci|build|deps){_CONVENTIONAL}",
                 r"(?:dev(?:elopment)?\s+|misc\s+)?chores?\s*(?:\(#\d+\))?\s*$",  # all of it: "Chores list..." fixes
                 r"update (?:the )?project (?:files|config(?:uration)?|tooling)\b")),
    MessageRule("style_commit", "a formatting or lint commit", (
        rf"style{_CONVENTIONAL}", rf"(?:apply|run|ran|use)\s+{_TOOLS}",
        r"(?:fix(?:ed)?\s+)?(?:lint|linting|linter|flake8|pylint|ruff)\s+(?:errors?|warnings?|issues?|complaints?)\s*$",
        r"(?:re)?format(?:ted)?\s+(?:the\s+)?(?:code|codebase|sources?|files?)\b")),
)  # fmt: skip
_TYPO = re.compile(r"\b(?:typos?|spelling|misspel\w*|mis-spel\w*|spelled|grammar)\b", re.IGNORECASE)

_PYTHON_SCRIPT = re.compile(r"#![^\n]*\bpython[\d.]*\b")
Source = Callable[[str, str], str | None]  # (commit, path) -> the file's text there, None when absent


def check_message(commit: Commit) -> None:
    """The first of ``MESSAGE_RULES`` the message matches, as a ``RepoError`` with that rule's reason."""
    for rule in MESSAGE_RULES:
        if rule.matches(commit.message):
            raise RepoError(f"commit {commit.sha} is {rule.what}: {commit.subject!r}", reason=rule.reason)


def check_code_change(commit: Commit, code_paths: Sequence[str], source: Source) -> None:
    """``no_behaviour_change`` when every code file the commit changes is Python whose syntax tree, docstrings
    left out, is the parent's (comments, docstrings, formatting); ``typo_fix`` when the subject says typo or
    spelling and the trees differ only in string literals. A file that does not parse, or is not Python (a
    ``.py`` module or a Python script), counts as a change of behaviour: the commit is kept."""
    code = [path for path in code_paths if not is_support_file(path)]  # a README edit beside is no behaviour
    if not code or not all(PurePosixPath(path).suffix in (".py", "") for path in code):
        return
    pairs = [(source(commit.parents[0], path), source(commit.sha, path)) for path in code]
    if not all(_python(path, *pair) for path, pair in zip(code, pairs, strict=True)):
        return
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


def _python(path: str, *texts: str | None) -> bool:
    """A module, or a script named without ``.py`` whose first line runs Python (jmespath's ``scripts/astrender``)."""
    return PurePosixPath(path).suffix == ".py" or any(text and _PYTHON_SCRIPT.match(text) for text in texts)


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
