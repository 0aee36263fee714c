"""Blinded tests: the host rewrites test files so that expected values never enter the sandbox.

An assertion whose expected side the host can evaluate on its own (``expected.evaluate``) becomes a **slot**: in
the sandbox only its actual side runs and is reported (an *observation*); the host compares it with the expected
value it kept. Every other assertion stays in the test and is judged in process. Two rewrites: ``instrument``
(validation: observe each slot, run unchanged, to ``calibrate``) and ``blind`` (grading: slots replaced by
observations; the host keeps a ``Blinding``: which checks each sandbox test id must pass, and its original id).
What becomes a slot, and what the sandbox's file looks like:
docs/verification.md, "By construction: expected values never enter the sandbox".
"""

from __future__ import annotations

import ast
import builtins
import json
import operator
import random
import re
import secrets
import sys
import tokenize
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from trialforge import pyast
from trialforge.envspec import TestRunner
from trialforge.testrun.expected import (
    OPAQUE,
    UNITTEST_CHECKS,
    Check,
    NotConstant,
    Scope,
    Structure,
    decode,
    evaluate,
    expected_classes,
    qualified,
)
from trialforge.testrun.lineedits import LineEdits

OBSERVE, EXPECT, RAISES, RAISES_CALL, END = (
    "__tf_observe__", "__tf_expect__", "__tf_raises__", "__tf_raises_call__", "__tf_end__",
)  # fmt: skip
TRUTH, CLASSES = "__tf_truth__", "__tf_classes__"
_OBSERVER = {"truth": TRUTH, "isinstance": CLASSES}  # what reports a slot's actual side (else OBSERVE)
RECORD_CAP = 64 << 10  # bytes of JSON a recorded expectation may take in the task record
RECORDED_OPS = frozenset({"==", "!=", "is", "is not"})  # what a recorded expectation may be compared by
RECORDED_METHODS = frozenset({
    "assertEqual", "assertEquals", "assertNotEqual", "assertNotEquals", "assertIs", "assertIsNot", "assertListEqual",
    "assertTupleEqual", "assertDictEqual", "assertSetEqual", "assertSequenceEqual", "assertCountEqual",
})  # fmt: skip
_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
        ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}  # fmt: skip
_IDENTITY_CONSTANTS = (None, True, False)
# where code stands in its file (typeguard: ``lineno == test_check_type.__code__.co_firstlineno + 2``)
_LAYOUT = frozenset({"co_firstlineno", "co_lines", "co_positions", "f_lineno", "lineno", "end_lineno", "tb_lineno"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING_SCAN = 4096  # characters of each string searched for names (a test's data can be megabytes)
# builtins that read a file or a namespace: what they return may be an answer the test left in the sandbox
_READING_BUILTINS = frozenset({"open", "eval", "exec", "compile", "__import__", "globals", "locals", "vars", "input",
                               "getattr", "breakpoint", "help", "memoryview", "dir"})  # fmt: skip
# standard-library modules a recorded expected side may use: values from arguments, no file, no other module's state
_VALUE_MODULES = frozenset({"datetime", "decimal", "fractions", "collections", "enum", "math", "cmath", "operator",
                            "functools", "itertools", "string", "re", "ipaddress", "uuid", "zoneinfo", "types",
                            "typing", "dataclasses", "numbers", "statistics", "textwrap", "unicodedata", "copy",
                            "heapq", "bisect", "struct", "base64", "binascii", "hashlib", "json", "array",
                            "ast"})  # fmt: skip
_PATHLIKE = re.compile(r"[/\\]|\.(?:json|ya?ml|toml|txt|csv|tsv|xml|html?|ini|cfg|dat|bin|pkl|pickle|npy|py|md)$")
_PREDICATES = frozenset({"isinstance", "issubclass"})  # checks of classes: their own kind of slot, or in process
# decorators that call the test once, as written: any other (hypothesis's @given, a retry) may run it many times
_SAFE_DECORATORS = ("pytest.mark.", "unittest.skip", "unittest.expectedFailure", "unittest.mock.patch", "mock.patch",
                     "freezegun.freeze_time")  # fmt: skip
# Assertion helpers of nose and of SQLAlchemy-style test kits (``from mako.testing.assertions import eq_``), as the
# unittest check each stands for; calibration keeps in process any whose module means something else by the name.
HELPERS = {
    "eq_": "assertEqual", "assert_equal": "assertEqual", "assert_equals": "assertEqual", "ne_": "assertNotEqual",
    "assert_not_equal": "assertNotEqual", "is_": "assertIs", "assert_is": "assertIs", "is_not_": "assertIsNot",
    "is_not": "assertIsNot", "assert_is_not": "assertIsNot", "in_": "assertIn", "assert_in": "assertIn",
    "not_in_": "assertNotIn", "not_in": "assertNotIn", "assert_not_in": "assertNotIn", "ok_": "assertTrue",
    "assert_true": "assertTrue", "assert_false": "assertFalse", "assert_is_none": "assertIsNone",
    "assert_is_not_none": "assertIsNotNone", "assert_almost_equal": "assertAlmostEqual",
    "assert_raises": "assertRaises", "assert_raises_message": "assertRaisesRegex",
    "assert_raises_regex": "assertRaisesRegex", "expect_raises": "assertRaises",
    "expect_raises_message": "assertRaisesRegex",
}  # fmt: skip
# Checks a forger could pass by guessing, whatever the test: truthiness and classes, one-sided comparisons (a big
# number passes ``>=``), inequality, membership (a long string contains it), identity with None/True/False.
_WEAK_KINDS = frozenset({"truth", "isinstance"})
_WEAK_OPS = frozenset({"!=", "<", "<=", ">", ">=", "in", "not in", "is", "is not"})
_WEAK_METHODS = frozenset({
    "assertTrue", "assertFalse", "assertIsNone", "assertIsNotNone", "assertIs", "assertIsNot", "assertNotEqual",
    "assertNotEquals", "assertIn", "assertNotIn", "assertGreater", "assertGreaterEqual", "assertLess",
    "assertLessEqual", "assertNotAlmostEqual",
})  # fmt: skip


@dataclass(frozen=True)
class Slot:
    """One assertion the host can judge: where it is, what it checks, and what its actual side is."""

    key: str  # file::qual#index, stable across runs of the same test file
    index: int  # its number among its test's slots: what the sandbox reports
    kind: str  # compare | truth | unittest | raises
    stmt: ast.stmt
    actual: ast.expr | None  # the observed expression (raises: the callable of a call form, else None)
    expected: tuple[ast.expr, ...] = ()  # expected-side expressions (compare: one; unittest: the others)
    op: str = "=="
    reflected: bool = False
    negated: bool = False
    method: str = ""
    position: int = 0
    options: tuple[tuple[str, ast.expr], ...] = ()
    raises: ast.expr | None = None  # the exception class(es)
    match: ast.expr | None = None
    item: int = -1  # a with-statement raises: which item
    names: frozenset[str] = frozenset()  # module constants and parameter columns its expected side reads
    # the ``if`` tests it stands under, each with the truth it needs (``_straight_line``): decided on the host per row
    guards: tuple[tuple[ast.expr, bool], ...] = ()
    recorded: bool = False  # its expected side is code (``Interval(at(9), at(12))``): the gold patch's runs record it

    @property
    def weak(self) -> bool:
        """A check a forger could pass by guessing (``_WEAK_*``), or an ``== True``/``None`` in disguise; a raises
        check without a message pattern (the exception class is guessable from the statement)."""
        if self.kind in _WEAK_KINDS:
            return True
        if self.kind == "raises":
            return self.match is None
        if self.kind == "compare":
            guessable = isinstance(self.expected[0], ast.Constant) and self.expected[0].value in _IDENTITY_CONSTANTS
            return self.op in _WEAK_OPS or guessable
        return self.method in _WEAK_METHODS

    def check(self, scope: Scope, recorded: Mapping[str, object] | None = None) -> Check:
        """The host's check, with this slot's expected side evaluated in ``scope``, or for a recorded slot decoded
        from what validation recorded of it (``NotConstant`` if neither can be had)."""
        if self.recorded:
            return self._recorded_check((recorded or {}).get(self.key))
        if self.kind == "truth":
            return Check("truth", negated=self.negated)
        if self.kind == "compare":
            return Check("compare", op=self.op, expected=evaluate(self.expected[0], scope), reflected=self.reflected)
        if self.kind == "unittest":
            values = tuple(evaluate(e, scope) for e in self.expected)
            options = {name: evaluate(value, scope) for name, value in self.options}
            return Check("unittest", method=self.method, expected=values, position=self.position, options=options)
        assert self.raises is not None
        if self.kind == "isinstance":
            classes = expected_classes(self.raises, scope, exceptions_only=False)
            return Check("isinstance", classes=classes, negated=self.negated)
        match = evaluate(self.match, scope) if self.match is not None else None
        if match is not None and not isinstance(match, str):
            raise NotConstant("match= is not a string")
        return Check("raises", classes=expected_classes(self.raises, scope), match=match)

    def _recorded_check(self, encoded: object) -> Check:
        expected = decode(encoded) if encoded is not None else OPAQUE
        if expected is OPAQUE:
            raise NotConstant("no recorded expectation")
        identity = self.op in ("is", "is not") or self.method in ("assertIs", "assertIsNot")
        if identity and not (isinstance(expected, Structure) and expected.member):
            raise NotConstant("identity with an object that is not an Enum member")  # only members are unique
        if self.kind == "compare":
            op = {"is": "==", "is not": "!="}.get(self.op, self.op)
            return Check("compare", op=op, expected=expected, reflected=self.reflected)
        method = {"assertIs": "assertEqual", "assertIsNot": "assertNotEqual"}.get(self.method, self.method)
        return Check("unittest", method=method, expected=(expected,), position=self.position)


@dataclass
class Parametrize:
    """A test's single ``@pytest.mark.parametrize`` whose rows the host can read."""

    decorator: ast.Call
    names: list[str]
    rows: list[list[ast.expr]]  # per row, the value node of each name
    columns: set[str] = field(default_factory=set)  # names whose every use is an expected side (removable)

    def values(self, row: int, scope: Scope) -> dict[str, object]:
        return {name: evaluate(self.rows[row][self.names.index(name)], scope) for name in self.columns}


@dataclass
class TestFunction:
    """A test in a file: its slots (every eligible assertion, in order) and how many assertions it has."""

    qual: str  # "test_f" or "TestC::test_f"
    node: ast.FunctionDef
    holder: ast.ClassDef | None
    slots: list[Slot]
    assertions: int
    blindable: bool  # its body runs once, to its end, when it passes: slots can be checked in sequence
    renamable: bool
    parametrize: Parametrize | None
    shadowed: frozenset[str]
    constants: dict[str, ast.stmt] = field(default_factory=dict)  # local constants (``_local_constants``)


@dataclass
class FileAnalysis:
    rel: str
    source: str
    module: ast.Module
    scope: Scope
    tests: dict[str, TestFunction]
    constants: dict[str, ast.stmt]  # module constant -> its assignment

    def slot(self, key: str) -> Slot | None:
        qual = key.split("::", 1)[1].rsplit("#", 1)[0]
        test = self.tests.get(qual)
        return next((s for s in test.slots if s.key == key), None) if test else None


# --- analysis ---------------------------------------------------------------------------------


def analyse(
    source: str, rel: str, runner: TestRunner = "pytest", test_modules: frozenset[str] = frozenset()
) -> FileAnalysis | None:
    """The file's tests and their slots; None when the host cannot parse it (its tests stay as they are).
    ``test_modules``: what the tree's test files are importable as (``importable_test_modules``)."""
    try:
        module = pyast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    imports, bound, constants = _module_names(module)
    values = {n: _value(a) for n, a in constants.items()}
    scope = Scope(imports, values, {}, frozenset(bound), test_modules=test_modules)
    tests = {t.qual: t for t in _tests(module, rel, scope, runner)}
    _settle_removable(module, scope, tests, constants)
    return FileAnalysis(rel, source, module, scope, tests, constants)


def _value(assign: ast.stmt) -> ast.expr:
    assert isinstance(assign, (ast.Assign, ast.AnnAssign)) and assign.value is not None
    return assign.value


def _module_names(module: ast.Module) -> tuple[dict[str, str], set[str], dict[str, ast.stmt]]:
    """Imports (local name -> qualified name), names bound otherwise, and single-assignment constants."""
    imports: dict[str, str] = {}
    bound: set[str] = set()
    assigned: dict[str, list[ast.stmt]] = {}
    for node in module.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                imports[local] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if node.level == 0 and node.module and alias.name != "*":
                    imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                else:
                    bound.add(alias.asname or alias.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name) and node.value is not None:
                assigned.setdefault(targets[0].id, []).append(node)
            else:
                bound.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        else:
            bound.update(_bound_by(node))
    for node in ast.walk(module):
        if isinstance(node, ast.Global):
            bound.update(node.names)
        elif isinstance(node, (ast.AugAssign, ast.Delete)):
            bound.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    constants = {name: stmts[0] for name, stmts in assigned.items() if len(stmts) == 1 and name not in bound}
    bound.update(name for name in assigned if name not in constants)
    bound.update(name for name in imports if name in assigned)
    return imports, bound, constants


def _bound_by(node: ast.stmt) -> set[str]:
    """Names a module-level statement other than an import or a simple assignment binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _tests(module: ast.Module, rel: str, scope: Scope, runner: TestRunner) -> Iterator[TestFunction]:
    """The file's tests; a test that reads its own file records nothing (``_own_file_names``)."""
    own_file = _own_file_names(module)
    for test in _found_tests(module, rel, scope, runner):
        if any(isinstance(n, ast.Name) and n.id in own_file for n in ast.walk(test.node)):
            test.slots = [s for s in test.slots if not s.recorded]
        yield test


def _own_file_names(module: ast.Module) -> set[str]:
    """``__file__`` and the module-level names computed from it (``basename = os.path.basename(__file__)``). A test
    that reads them may compute from its own file's bytes (bottle's ``serve(basename)`` compared with
    ``open(__file__).read()``), which validation's instrumented file and grading's blinded one spell differently: a
    value recorded from one is never the other's, so such a test's recorded slots stay in process."""
    names = {"__file__"}
    while True:
        grown = names | {
            target.id
            for stmt in module.body
            if isinstance(stmt, ast.Assign) and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(stmt))
            for target in stmt.targets
            if isinstance(target, ast.Name)
        }
        if grown == names:
            return names
        names = grown


def _found_tests(module: ast.Module, rel: str, scope: Scope, runner: TestRunner) -> Iterator[TestFunction]:
    subclassed = {b.id for n in module.body if isinstance(n, ast.ClassDef) for b in n.bases if isinstance(b, ast.Name)}
    referenced = referenced_names(module)
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and runner == "pytest":
            yield _test(node, None, node.name, rel, scope, referenced)
        elif isinstance(node, ast.ClassDef) and _plain_class(node, scope) and (node.bases or runner == "pytest"):
            # pytest's ``python_classes`` may name any class a test class (mako's ``*Test``): only the graded ids say
            # which are, and a slot in a class that is none is never observed
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef) and inner.name.startswith("test"):
                    test = _test(inner, node, f"{node.name}::{inner.name}", rel, scope, referenced)
                    if node.name in subclassed:  # its tests run under other names too: leave them as they are
                        test.blindable = test.renamable = False
                        test.slots = []
                    yield test


def _plain_class(node: ast.ClassDef, scope: Scope) -> bool:
    """Whether a class's decorators leave its tests as written: none, or marks that call each test once
    (``@pytest.mark.usefixtures``, a skip, ``mock.patch``; arrow decorates most of its test classes so). A class-wide
    parametrize runs each test once per row under ids its methods' decorators do not spell: not analysed."""
    names = [_decorator_name(d, scope) for d in node.decorator_list]
    return all(n is not None and n.startswith(_SAFE_DECORATORS) and n != "pytest.mark.parametrize" for n in names)


def referenced_names(module: ast.Module) -> dict[str, int]:
    """How often each name is read (as a name, an attribute or a word of a string) anywhere in the module.

    A word of a string counts: a test that matches its own qualified name in a message (typeguard's
    ``rf"...\\.test_return_invalid\\.<locals>\\.Foo"``) would fail under another name."""
    counts: dict[str, int] = {}
    for node in ast.walk(module):
        names = (
            [node.id] if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
            else [node.attr] if isinstance(node, ast.Attribute)
            else _IDENTIFIER.findall(node.value[:_STRING_SCAN]) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            else []
        )  # fmt: skip
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _bound_inside(node: ast.FunctionDef) -> set[str]:
    """Every name the test's body binds: assigned, and named by a class, function, import or handler of its own.

    A class the test defines is local like an assigned name: ``describe(Foo)`` of a local ``Foo`` is no expected
    value validation could record once for every run (it would record the code under test's answer)."""
    found: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            found.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not node:
            found.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            found.update((alias.asname or alias.name).split(".")[0] for alias in n.names)
        elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name:
            found.add(n.name)
    return found


def _test(
    node: ast.FunctionDef, holder: ast.ClassDef | None, qual: str, rel: str, scope: Scope, referenced: dict[str, int]
) -> TestFunction:
    decorators = [_decorator_name(d, scope) for d in node.decorator_list]
    params = [d for d in node.decorator_list if _decorator_name(d, scope) == "pytest.mark.parametrize"]
    parametrize = _parametrize(params[0]) if len(params) == 1 and isinstance(params[0], ast.Call) else None
    arguments = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
    for extra in (node.args.vararg, node.args.kwarg):
        if extra is not None:
            arguments.add(extra.arg)
    stores = _bound_inside(node)
    columns = set(parametrize.names) if parametrize else set()
    constants = _local_constants(node, arguments)
    bound = arguments | stores | columns
    shadowed = frozenset((arguments | stores | scope.shadowed) - columns - set(constants))
    values = {**scope.constants, **{name: _value(stmt) for name, stmt in constants.items()}}
    own = frozenset(bound - set(constants))
    local = replace(scope, constants=values, shadowed=shadowed, local=own, assigned=frozenset(constants))
    self_name = node.args.args[0].arg if holder is not None and node.args.args else None
    returns = any(isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await)) for n in _own_nodes(node))
    safe = all(d is not None and d.startswith(_SAFE_DECORATORS) for d in decorators)
    blindable = safe and not returns and not (len(params) > 1)
    slots: list[Slot] = []
    if blindable:
        decides = _decider(local, parametrize)
        for stmt, guards in _straight_line(node.body, local, self_name, decides):
            slot = _slot(stmt, local, self_name, columns, f"{rel}::{qual}#{len(slots)}", len(slots))
            if slot is not None:
                slots.append(replace(slot, guards=guards))
    renamable = referenced.get(node.name, 0) == 0 and "request" not in arguments and safe
    assertions = sum(1 for n in _own_nodes(node) if _is_assertion(n, local, self_name))
    return TestFunction(qual, node, holder, slots, assertions, blindable, renamable, parametrize, shadowed, constants)


def _local_constants(node: ast.FunctionDef, arguments: set[str]) -> dict[str, ast.stmt]:
    """Locals the test's body assigns once, at its top, from an expression that reads no other local
    (``expected = Version.parse("3.5.0")``): an expected value, when only expected sides read it. Never a name a
    nested function rebinds (``nonlocal result``: more-itertools' ``result = 0`` was taken out with its assertion,
    and the graded file no longer compiled)."""
    rebound = {name for n in ast.walk(node) if isinstance(n, ast.Nonlocal) for name in n.names}
    stored: dict[str, int] = {}
    for n in _own_nodes(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            stored[n.id] = stored.get(n.id, 0) + 1
    bound = set(stored) | arguments
    found: dict[str, ast.stmt] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name = stmt.targets[0].id
        reads = {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
        if stored.get(name) == 1 and name not in arguments | rebound and not reads & bound:
            found[name] = stmt
    return found


def _own_nodes(function: ast.FunctionDef) -> Iterator[ast.AST]:
    """The nodes of ``function``'s body, not those of functions or classes defined inside it."""
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _decorator_name(node: ast.expr, scope: Scope) -> str | None:
    target = node.func if isinstance(node, ast.Call) else node
    return qualified(target, scope)


def _parametrize(call: ast.Call) -> Parametrize | None:
    """The decorator's names and rows, when they are written out (a literal list of rows)."""
    if len(call.args) < 2 or any(k.arg in ("indirect", None) for k in call.keywords):
        return None
    names_node, rows_node = call.args[0], call.args[1]
    if isinstance(names_node, ast.Constant) and isinstance(names_node.value, str):
        names = [n.strip() for n in names_node.value.split(",") if n.strip()]
    elif isinstance(names_node, (ast.Tuple, ast.List)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in names_node.elts
    ):
        names = [e.value for e in names_node.elts]  # type: ignore[attr-defined]
    else:
        return None
    if not isinstance(rows_node, (ast.List, ast.Tuple)) or not names:
        return None
    rows = []
    for row in rows_node.elts:
        values = _row_values(row, len(names))
        if values is None:
            return None
        rows.append(values)
    return Parametrize(call, names, rows)


def _row_values(row: ast.expr, width: int) -> list[ast.expr] | None:
    if isinstance(row, ast.Call) and isinstance(row.func, ast.Attribute) and row.func.attr == "param":
        values = list(row.args)
    elif width == 1:
        values = [row]
    elif isinstance(row, (ast.Tuple, ast.List)):
        values = list(row.elts)
    else:
        return None
    return values if len(values) == width and not any(isinstance(v, ast.Starred) for v in values) else None


def _straight_line(
    body: list[ast.stmt],
    scope: Scope,
    self_name: str | None,
    decides: Callable[[ast.expr, tuple[tuple[ast.expr, bool], ...]], bool],
    guards: tuple[tuple[ast.expr, bool], ...] = (),
) -> Iterator[tuple[ast.stmt, tuple[tuple[ast.expr, bool], ...]]]:
    """Statements a passing run executes once, in order, each with the ``if`` tests it needs (test, truth): the body,
    bodies of non-raises ``with``s, and both branches of an ``if`` whose test the host decides for every row
    (``decides``: humanize's ``if not isinstance(test_input, str):``). Which of a row's slots are due is then the
    host's to say, so a run that skips a branch, or takes the other, misses a due observation."""
    for stmt in body:
        yield stmt, guards
        if isinstance(stmt, ast.With) and _raises_item(stmt, scope, self_name) is None:
            yield from _straight_line(stmt.body, scope, self_name, decides, guards)
        elif isinstance(stmt, ast.If) and decides(stmt.test, guards):
            yield from _straight_line(stmt.body, scope, self_name, decides, (*guards, (stmt.test, True)))
            yield from _straight_line(stmt.orelse, scope, self_name, decides, (*guards, (stmt.test, False)))


_DECIDABLE = (ast.BoolOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Constant, ast.Name, ast.Attribute, ast.Tuple,
              ast.List, ast.Set, ast.Dict, ast.BinOp, ast.Load, ast.boolop, ast.unaryop, ast.cmpop, ast.operator,
              ast.keyword)  # fmt: skip
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}  # fmt: skip


def _decider(scope: Scope, param: Parametrize | None) -> Callable[[ast.expr, tuple[tuple[ast.expr, bool], ...]], bool]:
    """Whether the host decides an ``if`` test for every row of the test that reaches it (``guards``: the tests above
    it, already decided; one run when not parametrized): an ``elif`` is asked only of the rows the ``if`` let by."""

    def decides(test: ast.expr, guards: tuple[tuple[ast.expr, bool], ...]) -> bool:
        if not all(isinstance(n, _DECIDABLE) for n in ast.walk(test)):
            return False
        rows = range(len(param.rows)) if param is not None else [None]
        try:
            for row in rows:
                row_scope = guard_scope(scope, param, row)
                if all(decide(above, row_scope) is truth for above, truth in guards):
                    decide(test, row_scope)
        except NotConstant:
            return False
        return True

    return decides


def guard_scope(scope: Scope, param: Parametrize | None, row: int | None) -> Scope:
    """``scope`` with every column of ``row`` the host can evaluate (a guard may read any column, hidden or not)."""
    if param is None:
        return scope
    if row is None or not 0 <= row < len(param.rows):
        raise NotConstant("the row is unknown")
    values = {}
    for name, node in zip(param.names, param.rows[row], strict=True):
        try:
            values[name] = evaluate(node, scope)
        except NotConstant:
            continue
    return scope.with_row(values)


def decide(test: ast.expr, scope: Scope) -> bool:
    """The truth of an ``if`` test from syntax and the row alone: ``and``/``or``/``not``, comparisons, and
    ``isinstance`` with builtin classes over values ``evaluate`` builds; ``NotConstant`` for anything else."""
    if isinstance(test, ast.BoolOp):
        values = (decide(v, scope) for v in test.values)
        return all(values) if isinstance(test.op, ast.And) else any(values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return not decide(test.operand, scope)
    if isinstance(test, ast.Compare):
        left = evaluate(test.left, scope)
        for op, node in zip(test.ops, test.comparators, strict=True):
            right = evaluate(node, scope)
            if not _truth(_COMPARE[type(op)], left, right):
                return False
            left = right
        return True
    if _is_isinstance(test, scope):
        assert isinstance(test, ast.Call)
        classes = _builtin_classes(test.args[1], scope)
        return isinstance(evaluate(test.args[0], scope), classes)
    return _truth(bool, evaluate(test, scope))


def _truth(function: Callable[..., Any], *args: Any) -> bool:
    try:
        return bool(function(*args))
    except Exception as exc:  # a comparison of values that refuse it (``1 < "a"``) is not decided here
        raise NotConstant(f"{type(exc).__name__}: {exc}") from None


def _builtin_classes(node: ast.expr, scope: Scope) -> tuple[type, ...]:
    parts = node.elts if isinstance(node, ast.Tuple) else [node]
    classes = []
    for part in parts:
        name = qualified(part, scope) if isinstance(part, (ast.Name, ast.Attribute)) else None
        value = getattr(builtins, name[len("builtins.") :], None) if name and name.startswith("builtins.") else None
        if not isinstance(value, type):
            raise NotConstant(f"isinstance with {ast.unparse(part)}")
        classes.append(value)
    return tuple(classes)


def _is_assertion(node: ast.AST, scope: Scope, self_name: str | None) -> bool:
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Call):
        name = _call_name(node, scope, self_name)
        return name is not None and (name in UNITTEST_CHECKS or name in ("pytest.raises", "assertRaises",
                                                                          "assertRaisesRegex"))  # fmt: skip
    return False


def _call_name(call: ast.Call, scope: Scope, self_name: str | None) -> str | None:
    """``assertEqual`` for ``self.assertEqual(...)``, ``pytest.raises`` for ``pytest.raises(...)``."""
    func = call.func
    if (
        self_name
        and isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == self_name
    ):
        return func.attr
    name = qualified(func, scope)
    if name is not None and not name.startswith("builtins.") and name.rpartition(".")[2] in HELPERS:
        return HELPERS[name.rpartition(".")[2]]  # an imported helper: the check it stands for
    return name


def _raises_item(stmt: ast.With, scope: Scope, self_name: str | None) -> int | None:
    for index, item in enumerate(stmt.items):
        expr = item.context_expr
        if isinstance(expr, ast.Call) and _call_name(expr, scope, self_name) in (
            "pytest.raises", "assertRaises", "assertRaisesRegex",
        ):  # fmt: skip
            return index
    return None


def _slot(stmt: ast.stmt, scope: Scope, self_name: str | None, columns: set[str], key: str, index: int) -> Slot | None:
    """The slot ``stmt`` is, if the host can evaluate what it expects (for every row, when it reads columns)."""
    found: Slot | None = None
    if isinstance(stmt, ast.Assert):
        found = _assert_slot(stmt, scope, key, index)
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        found = _call_slot(stmt, stmt.value, scope, self_name, key, index)
    elif isinstance(stmt, ast.With):
        position = _raises_item(stmt, scope, self_name)
        if position is not None:
            found = _raises_slot(stmt, stmt.items[position].context_expr, scope, self_name, key, index, position)
    if found is None:
        return None
    names = frozenset(_names(found)) & (set(scope.constants) | columns)
    found = _with_names(found, names)
    try:
        if not names & columns and not found.recorded:  # columns are checked row by row; recorded ones at calibration
            found.check(scope)
    except NotConstant:
        return None
    if found.recorded and names & columns:
        return None
    return found


def _with_names(slot: Slot, names: frozenset[str]) -> Slot:
    return Slot(**{**slot.__dict__, "names": names})


def _names(slot: Slot) -> Iterator[str]:
    for expr in (*slot.expected, *(v for _, v in slot.options), slot.raises, slot.match):
        if expr is not None:
            yield from (n.id for n in ast.walk(expr) if isinstance(n, ast.Name))


def _constant(node: ast.expr, scope: Scope) -> bool:
    """The expression has no name the test binds itself and evaluates on the host (columns checked later)."""
    if any(isinstance(n, ast.Name) and n.id in scope.shadowed for n in ast.walk(node)):
        return False
    if any(isinstance(n, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.ListComp, ast.DictComp, ast.SetComp,
                          ast.GeneratorExp, ast.JoinedStr)) for n in ast.walk(node)):  # fmt: skip
        return False
    try:
        evaluate(node, _with_columns(scope, node))
    except NotConstant:
        return False
    return True


def _with_columns(scope: Scope, node: ast.expr) -> Scope:
    """Names that are neither constants nor imports stand for parameter columns: a placeholder value each."""
    free = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    unknown = {n for n in free if n not in scope.constants and n not in scope.imports and n not in scope.shadowed}
    return scope.with_row({n: 0 for n in unknown if not hasattr(builtins, n)})


def _observable(node: ast.expr, scope: Scope) -> bool:
    """A value the code under test computes (not a constant, not a check made in process)."""
    if isinstance(node, ast.Name) and node.id in scope.assigned:
        return True  # a local constant read as the actual side: its value when the assertion runs (it may have changed)
    if isinstance(node, (ast.Compare, ast.BoolOp, ast.Constant)) or _constant(node, scope):
        return False
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _PREDICATES:
        return False
    return not any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr)) for n in ast.walk(node))


def _closed(node: ast.expr, scope: Scope, seen: frozenset[str] = frozenset()) -> bool:
    """The expression reads nothing the test binds itself (no local, parameter or column): its value is the same
    wherever the test stands, so the gold patch's runs can record it (a recorded expectation).

    And every name it reads leaves nothing behind once it is taken out of the graded test: the package's imports,
    standard-library modules that only compute values, builtins that read no file and no namespace, constants whose
    own expressions are such (their definitions go with their last reader). A name the test file binds otherwise (a
    ``def``, a class), a constant read from a file, a name imported from a test module (``from answers import
    ANSWER``), a star import's or an unknown one would stay in the sandbox holding the answer for the package to
    read (the branches red team's four wins)."""
    if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr, ast.Lambda)) for n in ast.walk(node)):
        return False
    if any(isinstance(n, ast.Attribute) and n.attr in _LAYOUT for n in ast.walk(node)):
        return False  # a must-fail copy planted above it in grading moves its lines: never recorded
    inner = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - inner
    if loads & scope.local:
        return False
    strings = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    if any(_PATHLIKE.search(text) for text in strings):
        return False  # ``load("tests/expected.json")``: the file stays behind
    return _reads_no_test_data(node, scope, frozenset(inner), seen)


def _no_test_data(actual: ast.expr, scope: Scope) -> bool:
    """The actual side of a recorded slot reads the test's own values and what ``_closed`` allows, no data the test
    file holds: ``f(1) == ANSWER`` read the other way round would record ``f(1)`` against a test module's constant."""
    return _reads_no_test_data(actual, scope, scope.local | scope.assigned)


def _reads_no_test_data(node: ast.expr, scope: Scope, own: frozenset[str], seen: frozenset[str] = frozenset()) -> bool:
    """Every name ``node`` reads but ``own`` leaves nothing behind in the sandbox (``_leaves_nothing``), and no
    dotted name it reads is in a test module or a standard-library module that reads files or state."""
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - own
    if not all(_leaves_nothing(name, scope, seen) for name in loads):
        return False
    bases = {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    chains = [n for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in bases]
    return not any(_reads_elsewhere(qualified(chain, scope), scope.test_modules) for chain in chains)


def _leaves_nothing(name: str, scope: Scope, seen: frozenset[str]) -> bool:
    if name in scope.imports:
        return True  # what it names: ``_reads_elsewhere``
    if name in scope.constants and name not in scope.shadowed:
        return name not in seen and _closed(scope.constants[name], scope, seen | {name})
    return name not in scope.shadowed and hasattr(builtins, name) and name not in _READING_BUILTINS


def _reads_elsewhere(name: str | None, test_modules: frozenset[str]) -> bool:
    """``name`` (dotted) is, is inside, or holds one of the tree's test modules, or is a standard-library module
    other than those that only compute values (``pathlib``, ``os``, ``sys``: files, the environment, other modules)."""
    if name is None:
        return False
    top = name.split(".", 1)[0]
    if top == "builtins":  # ``repr``, ``sorted``: a builtin reads what ``_READING_BUILTINS`` says, no module
        return name.split(".")[1] in _READING_BUILTINS
    if top in sys.stdlib_module_names and top not in _VALUE_MODULES:
        return True
    return any(name == m or name.startswith(m + ".") or m.startswith(name + ".") for m in test_modules)


def importable_test_modules(test_files: Iterable[str]) -> frozenset[str]:
    """What each test file is importable as: its dotted path from the root and from each directory above it
    (pytest puts a test's directory, or its package's root, on ``sys.path``): ``tests/answers.py`` is ``answers`` and
    ``tests.answers``."""
    names = set()
    for rel in test_files:
        if rel.endswith(".py"):
            parts = rel[: -len(".py")].split("/")
            names |= {".".join(parts[i:]) for i in range(len(parts))}
    return frozenset(names)


def _assert_slot(stmt: ast.Assert, scope: Scope, key: str, index: int) -> Slot | None:
    test = stmt.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPS:
        op, left, right = _OPS[type(test.ops[0])], test.left, test.comparators[0]
        for actual, expected, reflected in ((left, right, False), (right, left, True)):
            if _observable(actual, scope) and _constant(expected, scope):
                if op in ("is", "is not") and not (
                    isinstance(expected, ast.Constant) and expected.value in _IDENTITY_CONSTANTS
                ):
                    return None
                return Slot(key, index, "compare", stmt, actual, (expected,), op, reflected)
        if op in RECORDED_OPS:  # ``result == Interval(at(9), at(12))``: the expected side is code, closed
            for actual, expected, reflected in ((left, right, False), (right, left, True)):
                if (
                    _observable(actual, scope)
                    and _closed(expected, scope)
                    and _observable(expected, scope)
                    and _no_test_data(actual, scope)
                ):
                    return Slot(key, index, "compare", stmt, actual, (expected,), op, reflected, recorded=True)
        return None
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    actual = test.operand if isinstance(test, ast.UnaryOp) and negated else test
    if _is_isinstance(actual, scope):
        assert isinstance(actual, ast.Call)
        return _isinstance_slot(stmt, actual.args[0], actual.args[1], scope, key, index, negated)
    if _observable(actual, scope):
        return Slot(key, index, "truth", stmt, actual, negated=negated)
    return None


def _is_isinstance(node: ast.expr, scope: Scope) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return False
    return qualified(node.func, scope) == "builtins.isinstance" and len(node.args) == 2 and not node.keywords


def _isinstance_slot(
    stmt: ast.stmt, value: ast.expr, classes: ast.expr, scope: Scope, key: str, index: int, negated: bool
) -> Slot | None:
    """``isinstance(VALUE, CLASSES)``: the value's classes are observed, the classes checked for stay on the host."""
    try:
        expected_classes(classes, scope, exceptions_only=False)
    except NotConstant:
        return None
    if not _observable(value, scope):
        return None
    return Slot(key, index, "isinstance", stmt, value, negated=negated, raises=classes)


def _call_slot(
    stmt: ast.Expr, call: ast.Call, scope: Scope, self_name: str | None, key: str, index: int
) -> Slot | None:
    name = _call_name(call, scope, self_name)
    if name in ("pytest.raises", "assertRaises", "assertRaisesRegex") and len(call.args) >= 2:
        return _raises_slot(stmt, call, scope, self_name, key, index, -1)
    if name in ("assertIsInstance", "assertNotIsInstance") and len(call.args) >= 2:
        negated = name == "assertNotIsInstance"
        return _isinstance_slot(stmt, call.args[0], call.args[1], scope, key, index, negated)
    if name not in UNITTEST_CHECKS or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    count = UNITTEST_CHECKS[name]
    values = call.args[:count]
    if len(values) != count or any(k.arg not in ("places", "delta", "msg") for k in call.keywords):
        return None
    observed = [i for i, v in enumerate(values) if _observable(v, scope)]
    others = [v for i, v in enumerate(values) if i not in observed]
    if count == 2 and len(observed) == 2 and name in RECORDED_METHODS and not call.keywords:
        for position in (0, 1):  # ``assertEqual(result, Task("a", 1))``: the expected value is code
            if _closed(values[1 - position], scope) and _no_test_data(values[position], scope):
                return Slot(key, index, "unittest", stmt, values[position], (values[1 - position],), method=name,
                            position=position, recorded=True)  # fmt: skip
        return None
    if len(observed) != 1 or not all(_constant(v, scope) for v in others):
        return None
    if name in ("assertIs", "assertIsNot") and not all(
        isinstance(v, ast.Constant) and v.value in _IDENTITY_CONSTANTS for v in others
    ):
        return None
    options = tuple((k.arg, k.value) for k in call.keywords if k.arg in ("places", "delta"))
    if not all(_constant(v, scope) for _, v in options):
        return None
    position = observed[0]
    return Slot(key, index, "unittest", stmt, values[position], tuple(others), method=name, position=position,
                options=options)  # fmt: skip


def _raises_slot(
    stmt: ast.stmt, call: ast.Call, scope: Scope, self_name: str | None, key: str, index: int, item: int
) -> Slot | None:
    name = _call_name(call, scope, self_name)
    if not call.args or any(isinstance(a, ast.Starred) for a in call.args[:2]):
        return None
    exc = call.args[0]
    if name == "assertRaisesRegex":
        if len(call.args) < 2 or call.keywords:
            return None
        match, rest = call.args[1], call.args[2:]
    else:
        extra = [k for k in call.keywords if k.arg != "match"]
        if extra and item >= 0:
            return None
        match = next((k.value for k in call.keywords if k.arg == "match"), None)
        rest = call.args[1:]
    if item < 0 and not rest:
        return None  # a call form needs the callable
    if not _constant(exc, scope) and qualified(exc, scope) is None and not isinstance(exc, ast.Tuple):
        return None
    if match is not None and not _constant(match, scope):
        return None
    callable_ = rest[0] if item < 0 else None
    if callable_ is not None and _constant(callable_, scope):
        return None
    return Slot(key, index, "raises", stmt, callable_, raises=exc, match=match, item=item, method=name or "")


def _settle_removable(
    module: ast.Module, scope: Scope, tests: dict[str, TestFunction], constants: dict[str, ast.stmt]
) -> None:
    """Keep slots whose expected side can leave the sandbox: every use of each name they read is an expected
    side of a kept slot (else the value would stay behind in the file). Parameter columns need readable rows."""
    for test in tests.values():
        param = test.parametrize
        if param is not None:
            used = {n for slot in test.slots for n in slot.names if n in param.names}
            param.columns = {c for c in used if _column_values_ok(param, c, scope)}
        test.slots = [s for s in test.slots if _columns_ok(s, param)]
    local_reads = {
        id(n) for t in tests.values() for n in _own_nodes(t.node) if isinstance(n, ast.Name) and n.id in t.constants
    }  # reads of a test's own local constant: that test's business, not the module constant's
    while True:
        kept = {id(n) for t in tests.values() for s in t.slots for e in _expected_nodes(s) for n in ast.walk(e)}
        loose = {
            n.id for n in ast.walk(module)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in constants and id(n) not in kept
            and id(n) not in local_reads
        }  # fmt: skip
        for test in tests.values():
            param = test.parametrize
            if param is not None:
                own = {id(n) for n in ast.walk(param.decorator)}
                loose_columns = {
                    n.id for n in _own_nodes(test.node)
                    if isinstance(n, ast.Name) and n.id in param.columns and id(n) not in kept and id(n) not in own
                }  # fmt: skip
                param.columns -= loose_columns
        before = sum(len(t.slots) for t in tests.values())
        for test in tests.values():
            columns = test.parametrize.columns if test.parametrize else set()
            own = set(test.constants)
            loose_own = {
                n.id for n in _own_nodes(test.node)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in own and id(n) not in kept
            }  # fmt: skip
            known = set(constants) | columns | own
            test.slots = [
                s for s in test.slots if not (s.names & (loose - own) or s.names & loose_own) and s.names <= known
            ]
        if sum(len(t.slots) for t in tests.values()) == before:
            break
    for test in tests.values():  # number the slots that stayed
        test.slots = [_renumbered(s, i, test) for i, s in enumerate(test.slots)]


def _renumbered(slot: Slot, index: int, test: TestFunction) -> Slot:
    key = slot.key.rsplit("#", 1)[0] + f"#{index}"
    return Slot(**{**slot.__dict__, "index": index, "key": key})


def _expected_nodes(slot: Slot) -> Iterator[ast.expr]:
    yield from slot.expected
    yield from (v for _, v in slot.options)
    for expr in (slot.raises, slot.match):
        if expr is not None:
            yield expr


def _column_values_ok(param: Parametrize, column: str, scope: Scope) -> bool:
    index = param.names.index(column)
    try:
        for row in param.rows:
            evaluate(row[index], scope)
    except NotConstant:
        return False
    return True


def _columns_ok(slot: Slot, param: Parametrize | None) -> bool:
    if param is None:
        return True
    reads = slot.names & set(param.names)
    return reads <= param.columns


# --- validation: observe, then calibrate -----------------------------------------------------------


def instrument(analysis: FileAnalysis) -> str | None:
    """The file with every slot's actual side observed in place (the test runs as written); None: unchanged."""
    edits: list[tuple[int, int, str]] = []  # (line, column in characters, text), inserted
    lines = analysis.source.splitlines(keepends=True)

    def at(line: int, offset: int) -> tuple[int, int]:
        return line, len(lines[line - 1].encode("utf-8")[:offset].decode("utf-8", errors="ignore"))

    for test in analysis.tests.values():
        for slot in test.slots:
            if slot.kind == "raises" and slot.item >= 0:
                assert isinstance(slot.stmt, ast.With)
                item = slot.stmt.items[slot.item]
                end = item.optional_vars or item.context_expr
                edits.append((*at(end.end_lineno or end.lineno, end.end_col_offset or 0),
                              f", {RAISES}({slot.index}, False)"))  # fmt: skip
            elif slot.actual is not None:
                node = slot.actual
                observer = RAISES_CALL if slot.kind == "raises" else _OBSERVER.get(slot.kind, OBSERVE)
                opening = f"{observer}({slot.index}, "
                closing = ", False)" if slot.kind == "raises" else ")"
                edits.append((*at(node.lineno, node.col_offset), opening))
                edits.append((*at(node.end_lineno or node.lineno, node.end_col_offset or 0), closing))
                if slot.recorded:  # what the gold patch's code makes of the expected side, recorded for grading
                    expected = slot.expected[0]
                    edits.append((*at(expected.lineno, expected.col_offset), f"{EXPECT}({slot.index}, "))
                    edits.append((*at(expected.end_lineno or expected.lineno, expected.end_col_offset or 0), ")"))
    if not edits:
        return None
    for line, column, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        lines[line - 1] = lines[line - 1][:column] + text + lines[line - 1][column:]
    rewritten = "".join(lines)
    try:
        pyast.check_compiles(rewritten, analysis.rel)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # never hand the sandbox a file the host broke: its tests run unobserved
    return rewritten


def calibrate_test(
    analysis: FileAnalysis,
    test: TestFunction,
    row: int | None,
    observations: list[tuple[int, object]],
    expectations: list[tuple[int, object]],
    recorded: dict[str, object],
) -> set[str]:
    """Slot keys of one passing test (by the gold patch) whose observation the host's check rejects.

    ``expectations``: what the run computed of recorded slots' expected sides; the first value of each slot goes
    into ``recorded``, and a slot whose value differs between runs, rows or repeats is rejected (not a constant)."""
    scope = _row_scope(analysis, test, row)
    demoted: set[str] = set()
    seen = dict(observations)
    expected_seen: dict[int, list[object]] = {}
    for index, value in expectations:
        expected_seen.setdefault(index, []).append(value)
    for slot in test.slots:
        try:
            due = _due(slot, analysis, test, row)
        except NotConstant:
            due = None
        if due is None or len([i for i, _ in observations if i == slot.index]) != due:
            demoted.add(slot.key)  # a passing run that did not observe it once where due, or at all where not
            continue
        if not due:
            continue
        if slot.recorded:
            values = expected_seen.get(slot.index, [])
            first = recorded.setdefault(slot.key, values[0]) if len(values) == 1 else None
            if first is None or values[0] != first or len(json.dumps(first)) > RECORD_CAP:
                demoted.add(slot.key)
                continue
        try:
            ok = scope is not None and slot.check(scope, recorded).passes(seen[slot.index])
        except NotConstant:
            ok = False
        if not ok:
            demoted.add(slot.key)
    return demoted


def _row_scope(analysis: FileAnalysis, test: TestFunction, row: int | None) -> Scope | None:
    scope = _test_scope(analysis, test)
    param = test.parametrize
    if param is None or not param.columns:
        return scope
    if row is None or not 0 <= row < len(param.rows):
        return None
    try:
        return scope.with_row(param.values(row, scope))
    except NotConstant:
        return None


def _test_scope(analysis: FileAnalysis, test: TestFunction) -> Scope:
    values = {**analysis.scope.constants, **{name: _value(stmt) for name, stmt in test.constants.items()}}
    return replace(analysis.scope, constants=values, shadowed=test.shadowed)


def _due(slot: Slot, analysis: FileAnalysis, test: TestFunction, row: int | None) -> bool:
    """Whether ``row``'s run of ``test`` reaches ``slot``: its guards, decided on the host (``NotConstant``: not)."""
    if not slot.guards:
        return True
    scope = guard_scope(_test_scope(analysis, test), test.parametrize, row)
    return all(decide(test_node, scope) is truth for test_node, truth in slot.guards)


def due_slots(analysis: FileAnalysis, test: TestFunction, row: int | None, slots: Iterable[Slot]) -> list[Slot]:
    """Of ``slots``, those ``row``'s run reaches; none under a guard the host cannot decide for it."""
    found = []
    for slot in slots:
        try:
            if _due(slot, analysis, test, row):
                found.append(slot)
        except NotConstant:
            continue
    return found


def host_check(
    analysis: FileAnalysis, test: TestFunction, row: int | None, slot: Slot, recorded: Mapping[str, object]
) -> Check | None:
    """The host's check of ``slot`` in ``row``'s run (None when the host has no value for it)."""
    scope = _row_scope(analysis, test, row)
    try:
        return slot.check(scope, recorded) if scope is not None else None
    except NotConstant:
        return None


def close_demotions(analysis: FileAnalysis, demoted: set[str]) -> set[str]:
    """``demoted`` plus every slot that reads a name a demoted slot reads (the name stays in the sandbox)."""
    names: dict[str, set[str]] = {}  # name -> slot keys reading it, per test for columns
    for test in analysis.tests.values():
        for slot in test.slots:
            for name in slot.names:
                column = test.parametrize is not None and name in test.parametrize.columns
                scope_key = f"{test.qual}:{name}" if column or name in test.constants else name
                names.setdefault(scope_key, set()).add(slot.key)
    closed = set(demoted)
    while True:
        grown = set(closed)
        for keys in names.values():
            if keys & grown:
                grown |= keys
        if grown == closed:
            return closed
        closed = grown


# --- grading: blind -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Blinding:
    """What the host keeps of a blinded run: the checks each sandbox test id must pass, and its original id."""

    checks: Mapping[str, tuple[tuple[int, Check], ...]] = field(default_factory=dict)  # sandbox id -> (slot, check)
    original: Mapping[str, str] = field(default_factory=dict)  # sandbox id -> original id (renamed tests)
    host_judged: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # original id -> (slots, assertions)

    def sandbox_ids(self, original_ids: Iterable[str]) -> list[str]:
        back = {v: k for k, v in self.original.items()}
        return [back.get(t, t) for t in original_ids]

    def merged(self, other: Blinding) -> Blinding:
        return Blinding({**self.checks, **other.checks}, {**self.original, **other.original},
                        {**self.host_judged, **other.host_judged})  # fmt: skip


def blind(
    analysis: FileAnalysis,
    graded: Iterable[str],
    in_process: Iterable[str] = (),
    param_rows: Mapping[str, int] | None = None,
    new_name: Callable[[], str] | None = None,
    rng: random.Random | None = None,
    recorded: Mapping[str, object] | None = None,
    read_elsewhere: frozenset[str] = frozenset(),
    run_recorded: bool = False,
) -> tuple[str, Blinding] | None:
    """The file for a graded run, and what the host keeps; None when nothing in it could be blinded.

    ``run_recorded``: a recorded slot's expected side still runs where it stood, its value unused (validation's
    check that taking it out hides no effect of the code under repair: ``tasks.validate``); never in grading.

    ``read_elsewhere``: names other files read (idna's codec tests call ``IDNATests().test_decode``): a test of
    this file by such a name keeps it, and stays in the file when it is not graded.

    ``graded``: the original ids of the tests of this file the run grades. ``in_process``: slot keys the
    task's validation kept in process. ``param_rows``: each graded parametrized id's row, and ``recorded``: each
    recorded slot's expected value, both from validation (a recorded slot without one stays in process).

    The file is edited in place, never reprinted (``lineedits``): every line keeps its number, so code that reads
    where it stands (``co_firstlineno``, a warning's ``lineno``, ``inspect.getsource``) sees what validation saw.
    """
    rng = rng or random.Random(secrets.randbits(64))
    new_name = new_name or (lambda: f"test_{secrets.token_hex(4)}")
    param_rows = param_rows or {}
    by_qual: dict[str, list[str]] = {}
    for test_id in graded:
        qual = test_id.split("::", 1)[1].split("[", 1)[0]
        by_qual.setdefault(qual, []).append(test_id)
    keep_in_process = close_demotions(analysis, set(in_process))
    edits = LineEdits(analysis.source)
    checks: dict[str, tuple[tuple[int, Check], ...]] = {}
    original: dict[str, str] = {}
    host_judged: dict[str, tuple[int, int]] = {}
    graded_names = {q.rsplit("::", 1)[-1] for q in by_qual}
    blinded: list[tuple[TestFunction, list[Slot], str]] = []  # each graded test, its slots and its sandbox name
    left: dict[int, int] = {}  # id of a body -> its statements still there (a body is never emptied)
    try:
        edits.strip_comments()
        for qual, test in analysis.tests.items():
            ids = by_qual.get(qual)
            if ids is None:
                body = (test.holder or analysis.module).body
                remaining = left.setdefault(id(body), len(body))
                if test.renamable and test.node.name not in graded_names | read_elsewhere and remaining > 1:
                    left[id(body)] = remaining - 1
                    decorators = [d.lineno for d in test.node.decorator_list]
                    edits.remove(test.node, first_line=min(decorators, default=test.node.lineno))
                continue
            rows = [param_rows.get(t) for t in ids]
            slots, per_id = _checked_slots(analysis, test, ids, rows, keep_in_process, recorded or {})
            for test_id in ids:
                host_judged[test_id] = (len(slots), test.assertions)
            node = test.node
            name = new_name() if test.renamable and node.name not in read_elsewhere else node.name
            opaque = _blind_function(edits, test, slots, name, rng, run_recorded, hide_columns=bool(
                test.parametrize and {c for s in slots for c in s.names} & test.parametrize.columns))  # fmt: skip
            blinded.append((test, slots, name))
            prefix = f"{analysis.rel}::{test.holder.name + '::' if test.holder else ''}{name}"
            for test_id, row in zip(ids, rows, strict=True):
                if opaque is not None and row is not None:
                    sandbox_id = f"{prefix}[{opaque[row]}]"
                else:
                    sandbox_id = prefix + (test_id[test_id.index("[") :] if "[" in test_id else "")
                original[sandbox_id] = test_id
                if slots:  # every observation that replaced an assertion has its check here: never one without
                    checks[sandbox_id] = per_id[test_id]
        if not original:
            return None
        first = analysis.module.body[0] if analysis.module.body else None
        if _is_docstring(first) and len(analysis.module.body) > 1:
            assert first is not None
            edits.remove(first)
        text = _drop_unread(edits.apply(), analysis, blinded)
        pyast.check_compiles(text, analysis.rel)  # a symbol-table error too: an import of it would fail
    except (SyntaxError, ValueError, RecursionError, MemoryError, tokenize.TokenError):
        return None
    return text, Blinding(checks, original, host_judged)


def _checked_slots(
    analysis: FileAnalysis,
    test: TestFunction,
    ids: list[str],
    rows: list[int | None],
    in_process: set[str],
    recorded: Mapping[str, object],
) -> tuple[list[Slot], dict[str, tuple[Check, ...]]]:
    """The slots this run blinds in ``test`` and their checks per graded id. A slot whose expected side the host
    cannot evaluate for one of the ids (a row it does not know) stays in process, with every slot reading the
    same column or standing under a guard; so does a recorded slot validation recorded nothing for. Each id's
    checks are those of the slots its row reaches (``_due``), by slot index."""
    slots = [s for s in test.slots if s.key not in in_process and (not s.recorded or s.key in recorded)]
    columns = test.parametrize.columns if test.parametrize else set()
    while True:
        per_id: dict[str, tuple[tuple[int, Check], ...]] = {}
        failed = False
        for test_id, row in zip(ids, rows, strict=True):
            scope = _row_scope(analysis, test, row)
            try:
                if scope is None:
                    raise NotConstant("the row is unknown")
                due = [s for s in slots if _due(s, analysis, test, row)]
                per_id[test_id] = tuple((s.index, s.check(scope, recorded)) for s in due)
            except NotConstant:
                failed = True
                break
        if not failed:
            return slots, per_id
        if not any(s.names & columns or s.guards for s in slots):
            return [], {}
        slots = [s for s in slots if not (s.names & columns or s.guards)]


def _is_docstring(stmt: ast.stmt | None) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _blind_function(
    edits: LineEdits,
    test: TestFunction,
    slots: list[Slot],
    name: str,
    rng: random.Random,
    run_recorded: bool,
    hide_columns: bool,
) -> list[str] | None:
    """Edit the test in place; return the opaque ids given to its rows (None: ids unchanged)."""
    node = test.node
    if name != node.name:
        edits.rename_function(node, name)
    for slot in slots:
        _observe(edits, slot, run_recorded)
    if _is_docstring(node.body[0]):
        edits.remove(node.body[0], placeholder="pass" if len(node.body) == 1 else "")
    if slots:
        _end(edits, node)
    param = test.parametrize
    if param is None or not hide_columns:
        return None
    used = _still_read(node, slots)
    gone = [i for i, n in enumerate(param.names) if n in param.columns and n not in used]
    opaque = [f"{rng.choice('abcdefghjkmnpqrstuvwxyz')}{rng.randrange(16**6):06x}" for _ in param.rows]
    for values in param.rows:
        for index in gone:
            edits.replace_node(values[index], "(None", ")")
    rows = param.decorator.args[1]
    assert isinstance(rows, (ast.List, ast.Tuple))
    for row in rows.elts:  # an explicit id would spell the values: pytest.param's id=None defers to ids=
        for keyword in row.keywords if isinstance(row, ast.Call) else []:
            if keyword.arg == "id":
                edits.replace_node(keyword.value, "(None", ")")
    listed = "[" + ", ".join(repr(o) for o in opaque)
    given = param.decorator.args[3] if len(param.decorator.args) > 3 else None
    given = next((k.value for k in param.decorator.keywords if k.arg == "ids"), given)
    if given is not None:
        edits.replace_node(given, listed, "]")
    else:
        last = max((*param.decorator.args, *param.decorator.keywords), key=lambda n: (n.end_lineno, n.end_col_offset))
        edits.insert(edits.end(last), f", ids={listed}]")
    return opaque


def _still_read(node: ast.FunctionDef, slots: list[Slot]) -> set[str]:
    """Names the test reads once its slots are observations (their expected sides, messages and checks gone)."""
    gone: set[int] = set()
    for slot in slots:
        stmt = slot.stmt
        if slot.kind == "raises" and slot.item >= 0:
            gone |= {id(n) for n in ast.walk(stmt.items[slot.item].context_expr)}  # type: ignore[attr-defined]
            continue
        if slot.kind == "raises":
            call = stmt.value  # type: ignore[attr-defined]
            position = 2 if slot.method == "assertRaisesRegex" else 1
            dropped = [call.func, *call.args[:position], *(k for k in call.keywords if k.arg == "match")]
            gone |= {id(n) for part in dropped for n in ast.walk(part)}
            continue
        kept = {id(n) for n in ast.walk(slot.actual)} if slot.actual is not None else set()
        gone |= {id(n) for n in ast.walk(stmt) if id(n) not in kept}
    loads = (n for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))
    return {n.id for n in loads if id(n) not in gone}


def _observe(edits: LineEdits, slot: Slot, run_recorded: bool = False) -> None:
    """What stands in the sandbox for a slot: its actual side, observed, on the lines it had; the expected side gone
    (a recorded one run after it, in the order Python evaluates the two, where ``run_recorded``)."""
    stmt, index = slot.stmt, slot.index
    if slot.kind == "raises" and slot.item >= 0:
        assert isinstance(stmt, ast.With)
        edits.replace_node(stmt.items[slot.item].context_expr, f"{RAISES}({index}, True", ")")
        return
    if slot.kind == "raises":
        call = stmt.value  # type: ignore[attr-defined]
        assert isinstance(call, ast.Call)
        position = 2 if slot.method == "assertRaisesRegex" else 1
        rest = [*call.args[position + 1 :], *(k for k in call.keywords if k.arg != "match")]
        rest.sort(key=lambda n: (n.lineno, n.col_offset))
        pieces: list[str | ast.AST] = [f"{RAISES_CALL}({index}, (", call.args[position], "), True)("]
        for number, arg in enumerate(rest):
            pieces += [", "] * bool(number) + [arg]
        edits.rebuild(stmt, pieces, ")")
        return
    assert slot.actual is not None
    observed: list[str | ast.AST] = [f"{_OBSERVER.get(slot.kind, OBSERVE)}({index}, (", slot.actual, ")"]
    if run_recorded and slot.recorded:
        expected: list[str | ast.AST] = [f"{EXPECT}({index}, (", slot.expected[0], ")"]
        first, then = (expected, observed) if slot.reflected else (observed, expected)
        observed = [*first[:-1], ")); ", *then]
    edits.rebuild(stmt, observed, ")")


_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.TryStar, ast.Match,
             ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # fmt: skip


def _end(edits: LineEdits, node: ast.FunctionDef) -> None:
    """``__tf_end__()`` after the test's last statement: on its line, or on the blank line below a compound one
    (a line added below only where there is none: the one case where lines below move)."""
    last = node.body[-1]
    call = f"{END}()"
    if not isinstance(last, _COMPOUND):
        edits.insert(edits.end(last), f"; {call}")
        return
    first = node.body[0]
    indent = edits.lines[first.lineno - 1][: edits.column(first.lineno, first.col_offset)]
    below = (last.end_lineno or last.lineno) + 1
    if edits.blank(below):
        edits.insert((below, 0), indent + call)
    else:
        edits.insert(edits.end(last), "\n" + indent + call)


def _drop_unread(text: str, analysis: FileAnalysis, blinded: list[tuple[TestFunction, list[Slot], str]]) -> str:
    """``text`` less the constants nothing reads any more (their only readers were blinded expected sides): module
    constants, and blinded tests' own, found in the edited file by their sandbox names."""
    module = pyast.parse(text)
    loads = {n.id for n in ast.walk(module) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    read = {name for test in analysis.tests.values() for slot in test.slots for name in slot.names}
    unused = {name for name in analysis.constants if name in read and name not in loads}
    edits = LineEdits(text)
    gone = [s for s in module.body if isinstance(s, (ast.Assign, ast.AnnAssign)) and _assigned_name(s) in unused]
    if len(gone) == len(module.body):
        gone = gone[1:]  # a module is never left without a statement
    functions: dict[str, ast.FunctionDef] = {}  # qual -> the definition Python keeps (the last of a name)
    for holder in [module, *(n for n in module.body if isinstance(n, ast.ClassDef))]:
        prefix = f"{holder.name}::" if isinstance(holder, ast.ClassDef) else ""
        functions |= {prefix + n.name: n for n in holder.body if isinstance(n, ast.FunctionDef)}
    for test, slots, name in blinded:
        edited = functions.get((f"{test.holder.name}::" if test.holder else "") + name)
        if edited is None:
            continue
        names = {n.id for n in ast.walk(edited) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        mine = {n for s in slots for n in s.names if n in test.constants and n not in names}
        own = [s for s in edited.body if isinstance(s, ast.Assign) and _assigned_name(s) in mine]
        gone += own[: len(edited.body) - 1]
    for stmt in gone:
        edits.remove(stmt)
    return edits.apply()


def _assigned_name(stmt: ast.Assign | ast.AnnAssign) -> str | None:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None
