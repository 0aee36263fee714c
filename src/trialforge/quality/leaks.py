"""Answer-leak check: the problem statement and hints must not contain the answer.

Three kinds of leak, each reported with the span that matched: ``added_line`` (a line of code the gold patch adds),
``new_identifier`` (a name the patch introduces that the tests do not call) and ``expected_value`` (a literal a
fail-to-pass test asserts). Nothing here runs code. What counts and what is skipped: docs/pipeline.md,
"Quality gates".
"""

from __future__ import annotations

import ast
import builtins
import io
import itertools
import keyword
import re
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from trialforge import pyast
from trialforge.quality.change import Change, ChangedFile
from trialforge.tasks.patches import IGNORED_DIRS
from trialforge.tasks.quality_record import LEAK_KINDS, LeakKind, LeakSpan

if TYPE_CHECKING:
    from trialforge.tasks.schema import Task

MIN_LINE_CHARS = 12
MIN_IDENTIFIER_CHARS = 4
MIN_STRING_CHARS = 3
MAX_FILE_BYTES = 1 << 20
FIELDS: tuple[Literal["problem_statement", "hints"], ...] = ("problem_statement", "hints")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CODE_REGIONS = re.compile(r"```.*?(?:```|\Z)|`[^`\n]+`|^[ \t]*>>>[^\n]*", re.DOTALL | re.MULTILINE)
_SKIPPED_TOKENS = {
    tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER
}  # fmt: skip
_BUILTIN_NAMES = frozenset(dir(builtins))


@dataclass(frozen=True)
class Needle:
    kind: LeakKind
    source: str  # what would leak, as the patch or test writes it
    pattern: re.Pattern[str]
    code_only: bool = False  # counts only inside the statement's code regions


def find_leaks(task: Task, gold: Change, tests: Change, kinds: Iterable[LeakKind] = LEAK_KINDS) -> list[LeakSpan]:
    """Every span of the statement and hints that matches a needle of the enabled ``kinds``."""
    wanted = set(kinds)
    needles: list[Needle] = []
    if "added_line" in wanted:
        needles += added_line_needles(gold)
    if "new_identifier" in wanted:
        needles += identifier_needles(gold, known=words_in_tree(gold.base) | set(_WORD.findall(task.test_patch)))
    if "expected_value" in wanted:
        needles += expected_value_needles(tests, task.fail_to_pass)
    return [span for name in FIELDS for span in scan(name, getattr(task, name), needles)]


def scan(field: Literal["problem_statement", "hints"], text: str, needles: list[Needle]) -> list[LeakSpan]:
    """The matches of ``needles`` in ``text``, in order of position; a match inside a longer one of the
    same kind is the same leak (``100.00`` within ``-100.00``) and is not reported twice."""
    if not text:
        return []
    code = [m.span() for m in _CODE_REGIONS.finditer(text)]
    spans = []
    for needle in needles:
        for match in needle.pattern.finditer(text):
            start, end = match.span()
            if needle.code_only and not any(lo <= start and end <= hi for lo, hi in code):
                continue
            spans.append(LeakSpan(field=field, kind=needle.kind, start=start, end=end, text=match.group(),
                                  source=needle.source))  # fmt: skip
    outer = [
        s for s in spans
        if not any(o.kind == s.kind and o.start <= s.start and s.end <= o.end and o.end - o.start > s.end - s.start
                   for o in spans)
    ]  # fmt: skip
    return sorted(outer, key=lambda s: (s.start, s.end, s.kind))


# --- added lines ------------------------------------------------------------------------------


def added_line_needles(gold: Change) -> list[Needle]:
    needles: dict[str, Needle] = {}
    for changed in gold.python_files():
        existing = {_joined(_code_tokens(line)) for line in (changed.before or "").splitlines()}
        lines = (changed.after or "").splitlines()
        prose = _string_lines(changed.after or "")
        for number in sorted(changed.added_lines() - prose):
            tokens = _code_tokens(lines[number - 1])
            joined = _joined(tokens)
            if _trivial_line(tokens, joined) or joined in existing or joined in needles:
                continue
            needles[joined] = Needle("added_line", lines[number - 1].strip(), _token_pattern(tokens))
    return list(needles.values())


def _code_tokens(line: str) -> list[tokenize.TokenInfo]:
    """Python tokens of one line (comments dropped); a line that opens a bracket it does not close is fine."""
    tokens = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if token.type not in _SKIPPED_TOKENS:
                tokens.append(token)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # the tokens read so far are the line's
    return tokens


def _joined(tokens: list[tokenize.TokenInfo]) -> str:
    return " ".join(t.string for t in tokens)


def _trivial_line(tokens: list[tokenize.TokenInfo], joined: str) -> bool:
    named = any(t.type == tokenize.NAME and not keyword.iskeyword(t.string) for t in tokens)
    return len(tokens) < 3 or len(joined.replace(" ", "")) < MIN_LINE_CHARS or not named


def _token_pattern(tokens: list[tokenize.TokenInfo]) -> re.Pattern[str]:
    """The tokens in order with any spacing between them (at least some between two words)."""
    parts = [re.escape(tokens[0].string)]
    for prev, token in itertools.pairwise(tokens):
        gap = r"\s+" if prev.string[-1:].isalnum() and token.string[:1].isalnum() else r"\s*"
        parts += [gap, re.escape(token.string)]
    return re.compile("".join(parts))


def _string_lines(source: str) -> set[int]:
    """Lines that are prose in a Python file: docstrings and other string-only statements, and the
    continuation lines of multi-line strings."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return set()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        elif isinstance(node, ast.Constant | ast.JoinedStr) and (node.end_lineno or node.lineno) > node.lineno:
            lines.update(range(node.lineno + 1, (node.end_lineno or node.lineno) + 1))
    return lines


# --- new identifiers --------------------------------------------------------------------------


def identifier_needles(gold: Change, known: set[str]) -> list[Needle]:
    """Names on the patch's added lines that are new to the repository (``known``: names not to count)."""
    names: set[str] = set()
    for changed in gold.python_files():
        names |= names_on_lines(changed.after or "", changed.added_lines())
    fresh = sorted(
        n for n in names
        if len(n) >= MIN_IDENTIFIER_CHARS and n not in known and not keyword.iskeyword(n) and n not in _BUILTIN_NAMES
    )  # fmt: skip
    return [
        Needle("new_identifier", n, re.compile(rf"(?<!\w){re.escape(n)}(?!\w)"), code_only=not _code_shaped(n))
        for n in fresh
    ]


def names_on_lines(source: str, lines: frozenset[int]) -> set[str]:
    """Every name a Python file binds, reads or imports on ``lines``."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) not in lines:
            continue
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
            if node.asname:
                names.add(node.asname)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(node.module.split("."))
    return names


def words_in_tree(tree: Path) -> set[str]:
    """Every identifier-like word in the tree's text files (the repository's existing vocabulary)."""
    words: set[str] = set()
    for path in tree.rglob("*"):
        rel = path.relative_to(tree)
        if any(part in IGNORED_DIRS for part in rel.parts) or not path.is_file() or path.is_symlink():
            continue
        if path.stat().st_size <= MAX_FILE_BYTES:
            words.update(_WORD.findall(path.read_bytes().decode("utf-8", errors="ignore")))
    return words


def _code_shaped(name: str) -> bool:
    """``snake_case``, ``camelCase``/``CamelCase``, names with digits: no one writes these in prose."""
    core = name.strip("_")
    return "_" in core or any(c.isdigit() for c in core) or any(c.isupper() for c in core[1:])


# --- expected values --------------------------------------------------------------------------


def expected_value_needles(tests: Change, fail_to_pass: list[str]) -> list[Needle]:
    by_path = {f.path: f for f in tests.python_files()}
    values: dict[str, Needle] = {}
    for test_id in fail_to_pass:
        path, _, rest = test_id.partition("::")
        changed = by_path.get(path)
        if changed is None or not rest:
            continue
        for value in _expected_literals(changed, re.sub(r"\[.*\]$", "", rest).split("::")):
            if value not in values:
                values[value] = Needle("expected_value", value, _literal_pattern(value))
    return list(values.values())


def _expected_literals(changed: ChangedFile, qualname: list[str]) -> list[str]:
    """Non-trivial literals on the right of ``==`` in the added asserts of test ``qualname`` that the test
    file never feeds in: a value that is also an input (``"Café Olé"`` in a CSV row the test loads) is not
    the answer, and a statement that shows it gives nothing away."""
    try:
        tree = pyast.parse(changed.after or "")
    except SyntaxError:
        return []
    test = _find_def(tree.body, qualname)
    if test is None:
        return []
    added = changed.added_lines()
    expected_sides = [side for node in ast.walk(tree) for side in _expected_sides(node, added)]
    in_expected = {id(sub) for side in expected_sides for sub in ast.walk(side)}
    inputs = [
        text for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.lineno in added and id(node) not in in_expected
        and (text := _literal_text(node.value)) is not None
    ]  # fmt: skip
    found = [v for node in ast.walk(test) for side in _expected_sides(node, added) for v in _literals(side)]
    return [v for v in dict.fromkeys(found) if not any(v in given for given in inputs)]


def _expected_sides(node: ast.AST, added: frozenset[int]) -> list[ast.expr]:
    """The right-hand operands of ``==`` in an ``assert`` on an added line."""
    if not (isinstance(node, ast.Assert) and node.lineno in added and isinstance(node.test, ast.Compare)):
        return []
    operands = [node.test.left, *node.test.comparators]
    return [operands[i + 1] for i, op in enumerate(node.test.ops) if isinstance(op, ast.Eq)]


def _find_def(body: list[ast.stmt], qualname: list[str]) -> ast.AST | None:
    """The function (or method, through its classes) named by a pytest node id's path."""
    head, *rest = qualname
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == head:
            if not rest:
                return node
            return _find_def(node.body, rest) if isinstance(node, ast.ClassDef) else None
    return None


def _literals(node: ast.AST) -> Iterator[str]:
    """A literal expected value as text: a constant, ``-number``, a one-argument constructor of a constant
    (``Decimal("0.13")``), or a list/tuple/set of those; trivial values are left out."""
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        for element in node.elts:
            yield from _literals(element)
        return
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        text = _literal_text(-value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    else:
        text = _literal_text(node.value) if isinstance(node, ast.Constant) else None
    if text is not None:
        yield text


def _literal_text(value: object) -> str | None:
    """How a literal would be written in prose, or None when it is too common to mean anything."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return None if float(value).is_integer() and abs(value) < 10 else repr(value)
    if isinstance(value, str):
        stripped = value.strip()
        return value if len(stripped) >= MIN_STRING_CHARS and any(c.isalnum() for c in stripped) else None
    return None


def _literal_pattern(value: str) -> re.Pattern[str]:
    """``value`` not glued to a longer word or number (``0.13`` does not match inside ``10.135``)."""
    before = r"(?<![\w.])" if value[:1].isalnum() or value[:1] == "_" else ""
    after = r"(?!\w|\.\d)" if value[-1:].isalnum() or value[-1:] == "_" else ""
    return re.compile(before + re.escape(value) + after)
