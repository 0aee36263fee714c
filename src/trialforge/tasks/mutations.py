"""Bug injection: enumerate single-site mutants of a repository's library code.

A mutation family is a small function over one AST node inside a function body (a *site*) that returns the textual
edits turning it into a plausible bug, the inverse of the demo policy's repairs (``rollout/repair_edits.py``). Edits
replace only the mutated span, each checked against the text it replaces (a wrong AST position skips the site).
Nothing here runs code; enumeration is deterministic, sampling seeded. docs/pipeline.md, "Synthetic tasks".
"""

from __future__ import annotations

import ast
import functools
import hashlib
import itertools
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import CodeType

from trialforge import pyast
from trialforge.tasks.patches import IGNORED_DIRS, is_test_path

# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` (character offsets into the file) with ``new``."""

    start: int
    end: int
    new: str


@dataclass(frozen=True)
class Change:
    """What one family proposes for one site: non-overlapping edits plus a note for logs."""

    edits: tuple[Edit, ...]
    note: str


@dataclass(frozen=True)
class Mutant:
    """One candidate bug: a family's change at one site of one file."""

    family: str
    path: str  # POSIX path relative to the repository root
    line: int  # first line the change touches (1-based)
    end_line: int  # last original line the change touches
    edits: tuple[Edit, ...]
    note: str  # e.g. "'<' -> '<='": for logs and debugging, never shown to a solver

    def apply(self, source: str) -> str:
        """The mutated file text: edits applied back to front so earlier offsets stay valid."""
        out = source
        for edit in sorted(self.edits, key=lambda e: e.start, reverse=True):
            out = out[: edit.start] + edit.new + out[edit.end :]
        return out

    @property
    def digest(self) -> str:
        """Stable id of the change (path + edits): the same mutant always gets the same task id."""
        raw = self.path + "".join(f"\0{e.start}:{e.end}:{e.new}" for e in self.edits)
        return hashlib.sha256(raw.encode()).hexdigest()[:12]


# --- source text ------------------------------------------------------------------------------


class SourceText:
    """A file's text with conversions from AST positions (UTF-8 byte columns) to character offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = re.findall(r"[^\n]*\n|[^\n]+$", text)
        self._starts = [0]
        for line in self.lines:
            self._starts.append(self._starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self._starts[lineno - 1] + len(line.encode()[:col].decode(errors="replace"))

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def line_start(self, lineno: int) -> int:
        return self._starts[lineno - 1]

    def line_end(self, lineno: int) -> int:
        """Offset just past line ``lineno`` (its newline included)."""
        return self._starts[lineno]

    def line(self, lineno: int) -> str:
        return self.lines[lineno - 1]

    def segment(self, node: ast.expr) -> str | None:
        """The exact source of expression ``node``, or None when its recorded position is not that expression."""
        text = self.text[self.start(node) : self.end(node)]
        try:
            parsed = pyast.parse_expression(f"(\n{text}\n)")
        except SyntaxError:
            return None
        return text if ast.dump(parsed) == ast.dump(node) else None

    def owns_lines(self, node: ast.stmt) -> bool:
        """True when ``node`` alone fills its lines (only indentation before, only a comment after)."""
        before = self.text[self.line_start(node.lineno) : self.start(node)]
        after = self.text[self.end(node) : self.line_end(node.end_lineno or node.lineno)]
        return not before.strip() and re.fullmatch(r"[ \t]*(#[^\n]*)?\n?", after) is not None

    def indent(self, lineno: int) -> str:
        line = self.line(lineno)
        return line[: len(line) - len(line.lstrip())]


# --- sites ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionFacts:
    """A module-level function's calling shape: which siblings a call could be mistaken for."""

    name: str
    lineno: int
    min_positional: int
    max_positional: int  # a large number when the function takes *args
    params: frozenset[str]


@dataclass(frozen=True)
class Site:
    """One AST node inside a function body, with what a family needs to know about its place."""

    node: ast.AST
    parent: ast.AST
    field: str  # the parent's field holding ``node`` ("body", "test", "slice", "args", ...)
    function: ast.FunctionDef | ast.AsyncFunctionDef
    src: SourceText
    siblings: tuple[FunctionFacts, ...]

    def statements(self) -> list[ast.stmt]:
        """The statement list ``node`` sits in (empty when it is not in one)."""
        value = getattr(self.parent, self.field, None)
        return value if isinstance(value, list) and self.node in value else []


Family = Callable[[Site], list[Change]]

# Fields that hold annotations or decorations: mutating them changes nothing a test can see.
_SKIP_FIELDS = frozenset({"annotation", "returns", "decorator_list", "type_comment", "type_params"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def iter_sites(tree: ast.Module, src: SourceText) -> Iterator[Site]:
    """Every positioned node in every function body (docstrings and annotations excluded), in a fixed order."""
    siblings = tuple(_facts(fn) for fn in tree.body if isinstance(fn, _FUNCTIONS))
    for fn in ast.walk(tree):
        if isinstance(fn, _FUNCTIONS):
            body = fn.body[1:] if _docstring(fn.body) else fn.body
            for stmt in body:
                yield from _walk(stmt, fn, "body", fn, src, siblings)


def _walk(node: ast.AST, parent: ast.AST, field: str, fn: ast.FunctionDef | ast.AsyncFunctionDef,
          src: SourceText, siblings: tuple[FunctionFacts, ...]) -> Iterator[Site]:  # fmt: skip
    if hasattr(node, "lineno"):
        yield Site(node, parent, field, fn, src, siblings)
    if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
        return  # a nested function is a site list of its own (ast.walk in iter_sites finds it)
    for name, value in ast.iter_fields(node):
        if name in _SKIP_FIELDS:
            continue
        children = value if isinstance(value, list) else [value]
        for child in children:
            if isinstance(child, ast.AST):
                yield from _walk(child, node, name, fn, src, siblings)


def _docstring(body: Sequence[ast.stmt]) -> bool:
    first = body[0] if body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def _facts(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> FunctionFacts:
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    required = len(positional) - len(args.defaults)
    names = {a.arg for a in [*positional, *args.kwonlyargs]}
    most = 1 << 16 if args.vararg else len(positional)
    return FunctionFacts(fn.name, fn.lineno, required, most, frozenset(names))


# --- helpers shared by families ---------------------------------------------------------------

_CMP_TEXT = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.In: r"in", ast.NotIn: r"not\s+in", ast.Is: r"is", ast.IsNot: r"is\s+not",
}  # fmt: skip
_CMP_FLIPS = {
    ast.Lt: ("<=", ">"), ast.LtE: ("<", ">="), ast.Gt: (">=", "<"), ast.GtE: (">", "<="),
    ast.Eq: ("!=",), ast.NotEq: ("==",), ast.In: ("not in",), ast.NotIn: ("in",),
    ast.Is: ("is not",), ast.IsNot: ("is",),
}  # fmt: skip
_ARITH = {ast.Add: (r"\+", "-"), ast.Sub: ("-", "+"), ast.Mult: (r"\*", "/"), ast.Div: ("/", "//"),
          ast.FloorDiv: ("//", "/")}  # fmt: skip
_AUG = {ast.Add: (r"\+=", "-="), ast.Sub: ("-=", "+=")}
_BUILTIN_TWINS = {"min": "max", "max": "min", "any": "all", "all": "any"}
_METHOD_TWINS = {
    "lower": "upper", "upper": "lower", "startswith": "endswith", "endswith": "startswith",
    "lstrip": "rstrip", "rstrip": "lstrip", "strip": "rstrip", "ljust": "rjust", "rjust": "ljust",
    "find": "rfind", "rfind": "find", "index": "rindex", "rindex": "index",
    "removeprefix": "removesuffix", "removesuffix": "removeprefix", "isdigit": "isalpha", "isalpha": "isdigit",
    "isupper": "islower", "islower": "isupper", "keys": "values", "values": "keys", "floor": "ceil",
    "ceil": "floor", "insort_right": "insort_left", "insort_left": "insort_right", "bisect_right": "bisect_left",
    "bisect_left": "bisect_right", "append": "extend", "extend": "append", "title": "capitalize",
    "capitalize": "title", "casefold": "upper", "popleft": "pop", "appendleft": "append",
}  # fmt: skip
# Calls whose positional arguments commute: swapping them is an equivalent mutant, a wasted sandbox run.
_COMMUTATIVE = frozenset({"min", "max", "print", "set", "frozenset"})
# Expressions that bind looser than ``not`` / ``+``: they need parentheses when wrapped.
_LOOSE = (ast.BoolOp, ast.IfExp, ast.NamedExpr, ast.Lambda, ast.Compare, ast.Tuple)
_SELF_NAMES = frozenset({"self", "cls"})


def _operator_span(src: SourceText, left: ast.AST, right: ast.AST, pattern: str) -> tuple[int, int] | None:
    """Where the operator between two operands is, when nothing but spaces and parentheses surround it."""
    lo, hi = src.end(left), src.start(right)
    match = re.fullmatch(rf"[\s()\\]*({pattern})[\s()\\]*", src.text[lo:hi])
    return (lo + match.start(1), lo + match.end(1)) if match else None


def _int_value(node: ast.AST) -> int | None:
    """The value of an int literal, negative ones included (booleans are not ints here)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_value(node.operand)
        return -inner if inner is not None else None
    return None


def _replace(src: SourceText, node: ast.AST, new: str) -> Edit:
    return Edit(src.start(node), src.end(node), new)


def _wrap(src: SourceText, node: ast.expr, prefix: str, suffix: str) -> tuple[Edit, ...]:
    """Insert text around ``node`` (parenthesised when it binds looser than what is added)."""
    start, end = src.start(node), src.end(node)
    if isinstance(node, _LOOSE):
        prefix, suffix = prefix + "(", ")" + suffix
    edits = [Edit(end, end, suffix)] if suffix else []
    return (Edit(start, start, prefix), *edits) if prefix else tuple(edits)


def _remove_lines(src: SourceText, first: int, last: int, siblings_left: bool) -> Edit:
    """Delete whole lines ``first..last``; leave ``pass`` when the block would otherwise be empty."""
    new = "" if siblings_left else src.indent(first) + "pass\n"
    return Edit(src.line_start(first), src.line_end(last), new)


def _is_stringy(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str | bytes))


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


# --- families ---------------------------------------------------------------------------------


def flip_compare(site: Site) -> list[Change]:
    """``a < b`` -> ``a <= b`` / ``a > b``, ``==`` <-> ``!=``, ``in`` <-> ``not in``, ``is`` <-> ``is not``."""
    node = site.node
    if not isinstance(node, ast.Compare):
        return []
    operands = [node.left, *node.comparators]
    changes = []
    for i, op in enumerate(node.ops):
        span = _operator_span(site.src, operands[i], operands[i + 1], _CMP_TEXT[type(op)])
        if span is None:
            continue
        old = site.src.text[span[0] : span[1]]
        changes += [Change((Edit(*span, new),), f"{old!r} -> {new!r}") for new in _CMP_FLIPS[type(op)]]
    return changes


def flip_boolean(site: Site) -> list[Change]:
    """``and`` <-> ``or`` between two operands of a boolean expression."""
    node = site.node
    if not isinstance(node, ast.BoolOp):
        return []
    old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
    changes = []
    for left, right in itertools.pairwise(node.values):
        span = _operator_span(site.src, left, right, old)
        if span is not None:
            changes.append(Change((Edit(*span, new),), f"{old!r} -> {new!r}"))
    return changes


def flip_arith(site: Site) -> list[Change]:
    """``+`` <-> ``-``, ``*`` -> ``/``, ``/`` <-> ``//`` (numbers only), and ``+=`` <-> ``-=``."""
    node = site.node
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        if _is_stringy(node.left) or _is_stringy(node.right):
            return []  # string concatenation or repetition: a '-' there is a TypeError, not a plausible bug
        pattern, new = _ARITH[type(node.op)]
        span = _operator_span(site.src, node.left, node.right, pattern)
    elif isinstance(node, ast.AugAssign) and type(node.op) in _AUG:
        pattern, new = _AUG[type(node.op)]
        span = _operator_span(site.src, node.target, node.value, pattern)
    else:
        return []
    if span is None:
        return []
    return [Change((Edit(*span, new),), f"{site.src.text[span[0] : span[1]]!r} -> {new!r}")]


def off_by_one(site: Site) -> list[Change]:
    """±1 on a slice bound, an integer index, a ``range`` argument; drop the ``+ 1`` of ``x + 1``."""
    node, parent, src = site.node, site.parent, site.src
    if not isinstance(node, ast.expr):
        return []
    is_bound = isinstance(parent, ast.Slice) and site.field in ("lower", "upper")
    is_index = isinstance(parent, ast.Subscript) and site.field == "slice" and _index_like(node)
    is_range = isinstance(parent, ast.Call) and site.field == "args" and _callee(parent) == "range"
    if is_bound or is_index or is_range:
        return _shift_by_one(src, node)
    if isinstance(node, ast.BinOp) and _offset(node) == 1 and src.segment(node) is not None:
        return [_drop_offset(src, node)]
    return []


def _offset(node: ast.AST) -> int | None:
    """``c`` when ``node`` is ``x + c`` or ``x - c`` with a positive int literal ``c``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        value = _int_value(node.right)
        return value if value is not None and value > 0 else None
    return None


def _drop_offset(src: SourceText, node: ast.BinOp) -> Change:
    return Change((Edit(src.end(node.left), src.end(node), ""),), "drop the offset")


def _index_like(node: ast.expr) -> bool:
    """An index that is clearly an integer: a literal, ``len(...)``, or something plus/minus a literal."""
    if _int_value(node) is not None:
        return True
    if isinstance(node, ast.Call) and _callee(node) == "len":
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub) and _int_value(node.right) is not None


def _shift_by_one(src: SourceText, node: ast.expr) -> list[Change]:
    """``n`` -> ``n ± 1``; a literal or an existing offset is moved instead of stacking ``+ 1 - 1``."""
    if src.segment(node) is None:
        return []
    value = _int_value(node)
    if value is not None:
        shifted = [value + 1, value - 1] if value != 0 else [1]
        return [Change((_replace(src, node, str(v)),), f"{value} -> {v}") for v in shifted]
    if isinstance(node, ast.BinOp) and (offset := _offset(node)) is not None:
        bigger = Change((_replace(src, node.right, str(offset + 1)),), f"offset {offset} -> {offset + 1}")
        if offset == 1:
            return [bigger, _drop_offset(src, node)]
        return [bigger, Change((_replace(src, node.right, str(offset - 1)),), f"offset {offset} -> {offset - 1}")]
    return [Change(_wrap(src, node, "", f" {op} 1"), f"{op} 1") for op in ("+", "-")]


def change_constant(site: Site) -> list[Change]:
    """A numeric literal moved by one (or doubled for floats), ``True`` <-> ``False``."""
    node, src = site.node, site.src
    if isinstance(site.parent, ast.UnaryOp) and isinstance(site.parent.op, ast.USub):
        return []  # the literal is the operand of a minus sign: the UnaryOp site handles the whole number
    value = _int_value(node)
    if value is not None:
        if src.segment(node) is None:  # type: ignore[arg-type]
            return []
        news = [value + 1, value - 1] if value not in (0, 1) else [1 - value, value + 2]
        return [Change((_replace(src, node, str(v)),), f"{value} -> {v}") for v in news]
    if not isinstance(node, ast.Constant) or src.segment(node) is None:
        return []
    if isinstance(node.value, bool):
        return [Change((_replace(src, node, str(not node.value)),), f"{node.value} -> {not node.value}")]
    if isinstance(node.value, float):
        new = node.value * 2 if node.value else 1.0
        return [Change((_replace(src, node, repr(new)),), f"{node.value} -> {new}")]
    return []


def swap_args(site: Site) -> list[Change]:
    """Two adjacent positional arguments of a call exchanged: ``f(a, b)`` -> ``f(b, a)``."""
    node, src = site.node, site.src
    if not isinstance(node, ast.Call) or _callee(node) in _COMMUTATIVE:
        return []
    args = node.args
    if len(args) < 2 or any(isinstance(a, ast.Starred) for a in args):
        return []
    changes = []
    for left, right in list(itertools.pairwise(args))[:2]:
        a, b = src.segment(left), src.segment(right)
        if a is None or b is None or a == b:
            continue
        changes.append(Change((_replace(src, left, b), _replace(src, right, a)), f"swap {a!r} and {b!r}"))
    return changes


_DROPPABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Continue, ast.Break)


def drop_statement(site: Site) -> list[Change]:
    """An assignment, a call statement (``xs.append(x)``), ``continue`` or ``break`` deleted from its block."""
    node, src = site.node, site.src
    if not isinstance(node, _DROPPABLE) or not site.statements() or not src.owns_lines(node):
        return []
    if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Call):
        return []  # a bare string or name: dropping it changes nothing
    if isinstance(node, ast.AnnAssign) and node.value is None:
        return []
    siblings_left = len(site.statements()) > 1
    edit = _remove_lines(src, node.lineno, node.end_lineno or node.lineno, siblings_left)
    return [Change((edit,), f"drop {type(node).__name__}")]


def drop_branch(site: Site) -> list[Change]:
    """An ``if`` block without ``else`` removed, an ``else`` or ``elif`` branch removed, ``a if c else b`` -> a / b."""
    node, src = site.node, site.src
    if isinstance(node, ast.IfExp):
        body, orelse = src.segment(node.body), src.segment(node.orelse)
        if body is None or orelse is None or src.segment(node) is None:
            return []
        return [Change((_replace(src, node, body),), "keep the if-branch only"),
                Change((_replace(src, node, orelse),), "keep the else-branch only")]  # fmt: skip
    if not isinstance(node, ast.If) or not site.statements() or not src.owns_lines(node):
        return []
    if not node.orelse:
        if _is_elif(src, node):
            return []  # removing a trailing elif is the enclosing if's change ("drop an elif")
        edit = _remove_lines(src, node.lineno, node.end_lineno or node.lineno, len(site.statements()) > 1)
        return [Change((edit,), "drop the whole if block")]
    first = node.orelse[0]
    if isinstance(first, ast.If) and _is_elif(src, first):
        last = first.body[-1]
        if not src.owns_lines(last):
            return []
        return [Change((_remove_lines(src, first.lineno, last.end_lineno or last.lineno, True),), "drop an elif")]
    else_line = _else_line(src, node)
    last = node.orelse[-1]
    if else_line is None or not src.owns_lines(last):
        return []
    return [Change((_remove_lines(src, else_line, last.end_lineno or last.lineno, True),), "drop the else branch")]


def _is_elif(src: SourceText, node: ast.If) -> bool:
    return src.text.startswith("elif", src.start(node))


def _else_line(src: SourceText, node: ast.If) -> int | None:
    """The line of a bare ``else:`` between an if's body and its else block (None for one-liners)."""
    for lineno in range((node.body[-1].end_lineno or node.lineno) + 1, node.orelse[0].lineno):
        if re.fullmatch(r"[ \t]*else[ \t]*:[ \t]*(#[^\n]*)?\n?", src.line(lineno)):
            return lineno
    return None


def invert_condition(site: Site) -> list[Change]:
    """The test of an ``if``/``while``/conditional expression/comprehension filter negated (or un-negated)."""
    node, parent, src = site.node, site.parent, site.src
    is_test = isinstance(parent, ast.If | ast.While | ast.IfExp) and site.field == "test"
    is_filter = isinstance(parent, ast.comprehension) and site.field == "ifs"
    if not (is_test or is_filter) or not isinstance(node, ast.expr) or src.segment(node) is None:
        return []
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        start, inner = src.start(node), src.start(node.operand)
        rest = src.text[start + 3 : inner].lstrip()  # what sits between "not" and its operand: "" or "("
        return [Change((Edit(start, inner, rest),), "drop 'not'")]
    return [Change(_wrap(src, node, "not ", ""), "add 'not'")]


def wrong_return(site: Site) -> list[Change]:
    """``return expr`` -> ``return <another local>`` or ``return None``."""
    node, src = site.node, site.src
    if not isinstance(node, ast.Return) or node.value is None or src.segment(node.value) is None:
        return []
    value = node.value
    if isinstance(value, ast.Constant) and isinstance(value.value, bool):
        return []  # change_constant flips it
    used = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
    changes = []
    other = _nearest_local(site.function, node.lineno, used)
    if other is not None:
        changes.append(Change((_replace(src, value, other),), f"return {other}"))
    if not (isinstance(value, ast.Constant) and value.value is None):
        changes.append(Change((_replace(src, value, "None"),), "return None"))
    return changes


def _nearest_local(fn: ast.FunctionDef | ast.AsyncFunctionDef, before: int, exclude: set[str]) -> str | None:
    """The local assigned closest before line ``before``, else the first parameter, not in ``exclude``."""
    assigned = [
        (n.lineno, n.id)
        for n in ast.walk(fn)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.lineno < before and n.id not in exclude
    ]
    if assigned:
        return max(assigned)[1]
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]]
    return next((p for p in params if p not in exclude and p not in _SELF_NAMES), None)


def wrong_callee(site: Site) -> list[Change]:
    """The wrong function called: ``min`` <-> ``max``, ``.lower()`` -> ``.upper()``, a sibling function."""
    node, src = site.node, site.src
    if not isinstance(node, ast.Call):
        return []
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in _METHOD_TWINS:
        end = src.end(func)
        if not src.text[:end].endswith(func.attr):
            return []
        new = _METHOD_TWINS[func.attr]
        return [Change((Edit(end - len(func.attr), end, new),), f".{func.attr}() -> .{new}()")]
    if not isinstance(func, ast.Name) or src.segment(func) != func.id:
        return []
    new = _BUILTIN_TWINS.get(func.id) or _sibling(site, node)
    return [Change((_replace(src, func, new),), f"{func.id}() -> {new}()")] if new else []


def _sibling(site: Site, call: ast.Call) -> str | None:
    """The nearest other module-level function that accepts this call's arguments (None if there is none)."""
    name = call.func.id  # type: ignore[attr-defined]
    if name not in {f.name for f in site.siblings} or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    keywords = {k.arg for k in call.keywords}
    if None in keywords:
        return None
    n = len(call.args)
    home = next(f for f in site.siblings if f.name == name)
    fits = [
        f for f in site.siblings
        if f.name not in (name, site.function.name) and not f.name.startswith("__")
        and f.min_positional <= n + len(keywords) and n <= f.max_positional and keywords <= f.params
    ]  # fmt: skip
    return min(fits, key=lambda f: (abs(f.lineno - home.lineno), f.lineno)).name if fits else None


def drop_argument(site: Site) -> list[Change]:
    """The last keyword argument of a call dropped, or the last of two or more positional ones."""
    node, src = site.node, site.src
    if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
        return []
    if any(k.arg is None for k in node.keywords):
        return []
    ordered = sorted([*node.args, *node.keywords], key=src.start)
    if len(ordered) < 2 and not node.keywords:
        return []  # f(x) -> f() is a TypeError on every call, not a believable bug
    last = ordered[-1]
    if isinstance(last, ast.keyword):
        if not re.match(rf"{last.arg}\s*=", src.text[src.start(last) :]):
            return []
        label = f"drop {last.arg}="
    else:
        if src.segment(last) is None:
            return []
        label = "drop the last argument"
    start = src.end(ordered[-2]) if len(ordered) > 1 else src.start(last)
    return [Change((Edit(start, src.end(last), ""),), label)]


# Order matters only for deduplication: when two families produce the same text, the first one keeps it.
FAMILIES: Mapping[str, Family] = {
    "flip_compare": flip_compare,
    "flip_boolean": flip_boolean,
    "flip_arith": flip_arith,
    "off_by_one": off_by_one,
    "change_constant": change_constant,
    "swap_args": swap_args,
    "drop_statement": drop_statement,
    "drop_branch": drop_branch,
    "invert_condition": invert_condition,
    "wrong_return": wrong_return,
    "wrong_callee": wrong_callee,
    "drop_argument": drop_argument,
}


# --- enumeration and sampling -----------------------------------------------------------------


def mutants_of_source(path: str, text: str, families: Sequence[str] | None = None) -> list[Mutant]:
    """Every distinct mutant of one file's text, in file order (deterministic; duplicates by result removed)."""
    try:
        tree = pyast.parse(text)
    except SyntaxError:
        return []
    src = SourceText(text)
    chosen = [(name, FAMILIES[name]) for name in (families or FAMILIES)]
    found: list[tuple[tuple[int, int, int, int], Mutant]] = []
    for site in iter_sites(tree, src):
        for rank, (name, family) in enumerate(chosen):
            for variant, change in enumerate(family(site)):
                mutant = _mutant(name, path, src, change)
                found.append(((mutant.edits[0].start, rank, site.src.start(site.node), variant), mutant))
    seen: set[str] = set()
    unique = []
    for _, mutant in sorted(found, key=lambda item: item[0]):
        result = mutant.apply(text)
        if result != text and result not in seen:
            seen.add(result)
            unique.append(mutant)
    return unique


def _mutant(family: str, path: str, src: SourceText, change: Change) -> Mutant:
    edits = tuple(sorted(change.edits, key=lambda e: e.start))
    first = src.text.count("\n", 0, edits[0].start) + 1
    last = max(src.text.count("\n", 0, max(e.end - 1, e.start)) + 1 for e in edits)
    return Mutant(family, path, first, max(first, last), edits, change.note)


def library_files(repo: Path) -> list[str]:
    """The repository's Python files that are code under test: no tests, test config, caches or setup scripts."""
    found = []
    for path in sorted(repo.rglob("*.py")):
        rel = PurePosixPath(path.relative_to(repo).as_posix())
        if any(part in IGNORED_DIRS or part.startswith(".") for part in rel.parts) or is_test_path(str(rel)):
            continue
        if rel.name in ("setup.py", "noxfile.py") or (rel.parts and rel.parts[0] in ("docs", "examples", "benchmarks")):
            continue
        found.append(str(rel))
    return found


def compile_error(mutant: Mutant, source: str) -> str | None:
    """Why the mutated file is not a valid mutant (does not compile, or compiles to the same code), else None."""
    try:
        code = compile(mutant.apply(source), mutant.path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if code == _compiled(mutant.path, source):
        return "equivalent: the mutant compiles to the same code"
    return None


@functools.lru_cache(maxsize=64)
def _compiled(path: str, source: str) -> CodeType:
    return compile(source, path, "exec", dont_inherit=True)


def sample_mutants(
    mutants: Sequence[Mutant], *, max_per_file: int | None, max_total: int | None, seed: int
) -> list[Mutant]:
    """A seeded, family-balanced sample: at most ``max_per_file`` per file, then ``max_total`` overall.

    Within each cap, mutants are shuffled per family and taken round-robin across families, so
    the plentiful families (constants, dropped statements) cannot crowd out the rare ones.
    """
    rng = random.Random(seed)
    by_file: dict[str, list[Mutant]] = {}
    for mutant in mutants:
        by_file.setdefault(mutant.path, []).append(mutant)
    per_file = [m for path in sorted(by_file) for m in _balanced(by_file[path], max_per_file, rng)]
    return _balanced(per_file, max_total, rng)


def _balanced(mutants: Sequence[Mutant], limit: int | None, rng: random.Random) -> list[Mutant]:
    names = dict.fromkeys([*FAMILIES, *(m.family for m in mutants)])  # candidates made elsewhere too (PR mirror)
    groups = [[m for m in mutants if m.family == name] for name in names]
    for group in groups:
        rng.shuffle(group)
    rng.shuffle(groups)  # which family goes first matters when the cap is smaller than the number of families
    picked: list[Mutant] = []
    cap = len(mutants) if limit is None else min(limit, len(mutants))
    while len(picked) < cap:
        for group in groups:
            if group and len(picked) < cap:
                picked.append(group.pop())
    return picked
