"""Expected values on the host: evaluated from a test's source without running it, compared with what ran.

The host **evaluates** an expected side from the test file's syntax alone (``evaluate``: literals, capped arithmetic,
a short list of standard-library constructors, module constants, a parametrized row), **decodes** an observation
into builtin values (``decode``; what it cannot rebuild exactly is ``OPAQUE``, which no check accepts) and
**judges** (``Check.passes``) with Python's own semantics. Every value on both sides was built here from data, so no
code of the sandbox runs. docs/verification.md, "By construction: expected values never enter the sandbox".
"""

from __future__ import annotations

import ast
import builtins
import collections
import datetime as dt
import decimal
import fractions
import math
import operator
import unittest
import zoneinfo
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import regex

MAX_LENGTH = 100_000  # elements or characters an evaluated constant may have
MAX_DEPTH = 64
MATCH_TIMEOUT_S = 1.0  # a test's ``match=`` pattern against the code under test's message: no ReDoS on the host
MAX_MESSAGE = 8192  # characters of an exception message a ``match=`` is tried on


class NotConstant(Exception):
    """The expression is not something the host can evaluate on its own."""


class _Opaque:
    """A value the host could not rebuild: equal to nothing, true of nothing."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "<opaque>"


OPAQUE = _Opaque()


# --- evaluating an expected side -------------------------------------------------------------

# What a name may stand for, by the qualified name its import gives it: the value constructors the host runs.
CONSTRUCTORS: dict[str, Callable[..., Any]] = {
    "decimal.Decimal": decimal.Decimal,
    "fractions.Fraction": fractions.Fraction,
    "datetime.date": dt.date,
    "datetime.datetime": dt.datetime,
    "datetime.time": dt.time,
    "datetime.timedelta": dt.timedelta,
    "datetime.timezone": dt.timezone,
    "collections.OrderedDict": collections.OrderedDict,
    "collections.Counter": collections.Counter,
    "builtins.float": float,
    "builtins.int": int,
    "builtins.str": str,
    "builtins.complex": complex,
    "builtins.bool": bool,
    "builtins.tuple": tuple,
    "builtins.list": list,
    "builtins.dict": dict,
    "builtins.set": set,
    "builtins.frozenset": frozenset,
    "pytest.approx": pytest.approx,
}
CONSTANTS: dict[str, object] = {"datetime.timezone.utc": dt.UTC, "math.pi": math.pi, "math.inf": math.inf,
                                "math.e": math.e, "math.nan": math.nan, "builtins.None": None}  # fmt: skip
BUILTIN_EXCEPTIONS = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
)
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}


@dataclass(frozen=True)
class Scope:
    """What names in a test file's expected sides may mean: imports by qualified name, module constants
    (their expressions, evaluated on demand), and the values a parametrized test's row binds."""

    imports: Mapping[str, str] = field(default_factory=dict)  # local name -> qualified name ("Decimal" -> ...)
    constants: Mapping[str, ast.expr] = field(default_factory=dict)
    row: Mapping[str, object] = field(default_factory=dict)
    shadowed: frozenset[str] = frozenset()  # names bound otherwise (the module's defs, the test's locals)
    local: frozenset[str] = frozenset()  # of those, what the test binds itself (parameters, locals, columns)
    assigned: frozenset[str] = frozenset()  # the test's local constants (in ``constants``): runtime values too
    # dotted names a test file of the tree is importable as (``tests.answers``, ``answers``): test-land, not the package
    test_modules: frozenset[str] = frozenset()

    def with_row(self, row: Mapping[str, object]) -> Scope:
        return replace(self, row=row)


def qualified(node: ast.expr, scope: Scope) -> str | None:
    """``Decimal`` -> ``decimal.Decimal``, ``dt.date`` -> ``datetime.date``, ``float`` -> ``builtins.float``."""
    if isinstance(node, ast.Name):
        if node.id in scope.shadowed or node.id in scope.constants or node.id in scope.row:
            return None
        if node.id in scope.imports:
            return scope.imports[node.id]
        return f"builtins.{node.id}" if hasattr(builtins, node.id) else None
    if isinstance(node, ast.Attribute):
        base = qualified(node.value, scope)
        return None if base is None or base.startswith("builtins.") else f"{base}.{node.attr}"
    return None


def evaluate(node: ast.expr, scope: Scope, _depth: int = 0) -> object:
    """The value of ``node`` computed from syntax alone, or ``NotConstant``."""
    if _depth > MAX_DEPTH:
        raise NotConstant("nested too deep")
    depth = _depth + 1
    if isinstance(node, ast.Constant):
        return _sized(node.value)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        if any(isinstance(e, ast.Starred) for e in node.elts):
            raise NotConstant("starred element")
        items = [evaluate(e, scope, depth) for e in node.elts]
        kind = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)]
        return _sized(kind(items))
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise NotConstant("dict unpacking")
        pairs = zip(node.keys, node.values, strict=True)
        return _sized({evaluate(k, scope, depth): evaluate(v, scope, depth) for k, v in pairs})  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _apply(_UNARY[type(node.op)], evaluate(node.operand, scope, depth))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = evaluate(node.left, scope, depth), evaluate(node.right, scope, depth)
        _check_binary(node.op, left, right)
        return _sized(_apply(_BINARY[type(node.op)], left, right))
    if isinstance(node, ast.Name):
        if node.id in scope.row:
            return scope.row[node.id]
        if node.id in scope.constants and node.id not in scope.shadowed:
            return evaluate(scope.constants[node.id], scope, depth)
    name = qualified(node, scope) if isinstance(node, (ast.Name, ast.Attribute)) else None
    if name in CONSTANTS:
        return CONSTANTS[name]
    if isinstance(node, ast.Call):
        return _call(node, scope, depth)
    raise NotConstant(f"{type(node).__name__} is not a constant")


def _call(node: ast.Call, scope: Scope, depth: int) -> object:
    name = qualified(node.func, scope)
    constructor = CONSTRUCTORS.get(name or "")
    if constructor is None:
        raise NotConstant(f"call of {name or ast.unparse(node.func)}")
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise NotConstant("unpacked arguments")
    args = [evaluate(a, scope, depth) for a in node.args]
    kwargs = {k.arg: evaluate(k.value, scope, depth) for k in node.keywords if k.arg}
    if constructor in (int, str, float, complex, decimal.Decimal) and any(
        isinstance(a, (int, float)) and not isinstance(a, bool) and abs(a) > 10**MAX_LENGTH for a in args
    ):
        raise NotConstant("number too large")
    if constructor in (str, tuple, list, set, frozenset, dict) and len(args) > 1:
        raise NotConstant("decoding or iterating with options")
    return _sized(_apply(constructor, *args, **kwargs))


def _apply(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return function(*args, **kwargs)
    except Exception as exc:  # a constant that raises is not a constant
        raise NotConstant(f"{type(exc).__name__}: {exc}") from None


def _check_binary(op: ast.operator, left: object, right: object) -> None:
    """Refuse arithmetic whose result would be huge (``10 ** 10 ** 9``, ``"x" * 10 ** 9``)."""
    numbers = all(isinstance(v, (int, float, complex, decimal.Decimal, fractions.Fraction)) for v in (left, right))
    if isinstance(op, ast.Pow) and numbers:
        exponent = abs(right) if isinstance(right, (int, float)) else MAX_LENGTH  # type: ignore[arg-type]
        magnitude = abs(left) if isinstance(left, (int, float)) else MAX_LENGTH  # type: ignore[arg-type]
        if exponent > 4096 or (magnitude > 2 and exponent * math.log10(max(magnitude, 2)) > 4000):
            raise NotConstant("power too large")
    if isinstance(op, ast.Mult) and not numbers:
        count = right if isinstance(right, int) else left if isinstance(left, int) else 0
        other = left if isinstance(right, int) else right
        if isinstance(count, int) and hasattr(other, "__len__") and count * len(other) > MAX_LENGTH:  # type: ignore[arg-type]
            raise NotConstant("repetition too large")


def _sized(value: object) -> object:
    if isinstance(value, (str, bytes, tuple, list, set, frozenset, dict)) and len(value) > MAX_LENGTH:
        raise NotConstant("constant too large")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * MAX_LENGTH:
        raise NotConstant("integer too large")
    return value


# --- decoding an observation ------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Structure:
    """An object of a class defined in Python, rebuilt as its class's qualified name and its instance state (its
    ``__dict__`` and slots): equal to another with the same class and equal state. Only recorded expectations
    (``blinding``: values the gold patch's own runs computed) are ever compared with one."""

    cls: str
    state: tuple[tuple[str, object], ...]
    member: bool = False  # an Enum member (one object per class and name: equality is identity)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Structure):
            return NotImplemented
        return self.cls == other.cls and self.state == other.state

    def __hash__(self) -> int:
        return hash(self.cls)

    def __bool__(self) -> bool:
        raise TypeError("the truth of an object of a Python class is its class's to say")


@dataclass(frozen=True)
class Raised:
    """An exception the code under test raised, as observed: its classes and how its message reads."""

    classes: tuple[str, ...]  # "module.qualname" of each class in its MRO
    message: str | None  # str(exc), when the host could rebuild it exactly


def decode(encoded: object, _depth: int = 0) -> object:
    """The builtin value an observation encodes; ``OPAQUE`` where it cannot be rebuilt exactly."""
    if _depth > MAX_DEPTH or not isinstance(encoded, list) or not encoded or not isinstance(encoded[0], str):
        return OPAQUE
    tag, args, depth = encoded[0], encoded[1:], _depth + 1
    try:
        if tag == "n":
            return None
        if tag == "b":
            return bool(args[0])
        if tag == "i":
            return int(args[0], 16)
        if tag == "f":
            return float.fromhex(args[0])
        if tag == "c":
            return complex(float.fromhex(args[0]), float.fromhex(args[1]))
        if tag == "s":
            return _string(args[0])
        if tag in ("y", "ya"):
            raw = bytes.fromhex(args[0])
            return raw if tag == "y" else bytearray(raw)
        if tag in ("l", "t", "S", "F", "q"):
            items = [decode(e, depth) for e in args[0]]
            if any(i is OPAQUE for i in items):
                return OPAQUE
            kind = {"l": list, "t": tuple, "S": set, "F": frozenset, "q": collections.deque}[tag]
            return kind(items)
        if tag in ("d", "od", "cn", "dd"):
            pairs = [(decode(k, depth), decode(v, depth)) for k, v in args[0]]
            if any(k is OPAQUE or v is OPAQUE for k, v in pairs):
                return OPAQUE
            kind = {"d": dict, "od": collections.OrderedDict, "cn": collections.Counter, "dd": dict}[tag]
            return kind(pairs)
        if tag == "D":
            return decimal.Decimal(_string(args[0]))
        if tag == "Q":
            return fractions.Fraction(int(args[0], 16), int(args[1], 16))
        if tag == "r":
            return range(*(int(a, 16) for a in args))
        if tag == "dt":
            return _datetime(args, depth)
        if tag == "x":
            classes = tuple(str(c) for c in args[0])
            return Raised(classes, _message(args[1], args[2], depth))
        if tag == "u":
            state = tuple((_string(k), decode(v, depth)) for k, v in args[1])
            if any(v is OPAQUE for _, v in state):
                return OPAQUE
            return Structure(_string(args[0]), tuple(sorted(state, key=lambda kv: kv[0])), bool(args[2]))
        if tag == "T":
            return Structure("builtins.type", (("name", _string(args[0])),))
    except (ValueError, TypeError, IndexError, ArithmeticError, OverflowError, zoneinfo.ZoneInfoNotFoundError):
        return OPAQUE
    return OPAQUE


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _datetime(args: list, depth: int) -> object:
    kind, fields = args[0], args[1]
    if kind == "tz":
        return dt.timezone(dt.timedelta(seconds=float.fromhex(fields[0])))
    if kind == "zi":
        key = _string(fields[0])
        if len(key) > 64 or key.startswith("/") or ".." in key:
            raise ValueError("not a time zone key")
        return zoneinfo.ZoneInfo(key)
    if kind == "td":
        return dt.timedelta(days=int(fields[0], 16), seconds=int(fields[1], 16), microseconds=int(fields[2], 16))
    numbers = [int(f, 16) for f in fields[:-1]]
    tz = decode(fields[-1], depth)
    if tz is OPAQUE or not (tz is None or isinstance(tz, dt.tzinfo)):
        raise ValueError("a time zone the host cannot rebuild")
    if kind == "d":
        return dt.date(*numbers)
    if kind == "t":
        return dt.time(*numbers[:4], tzinfo=tz, fold=numbers[4])
    return dt.datetime(*numbers[:7], tzinfo=tz, fold=numbers[7])


def _message(provider: object, args: object, depth: int) -> str | None:
    """``str(exc)`` rebuilt from the builtin class that gives the exception its ``__str__`` and its args."""
    if not isinstance(provider, str) or not provider.startswith("builtins.") or not isinstance(args, list):
        return None
    cls = getattr(builtins, provider.removeprefix("builtins."), None)
    values = [decode(a, depth) for a in args]
    if not (isinstance(cls, type) and issubclass(cls, BaseException)) or any(v is OPAQUE for v in values):
        return None
    try:
        return str(cls(*values))[:MAX_MESSAGE]
    except Exception:  # args the builtin class refuses (UnicodeError's family): no message to compare
        return None


# --- judging -------------------------------------------------------------------------------------

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "in": lambda a, b: a in b, "not in": lambda a, b: a not in b, "is": operator.is_, "is not": operator.is_not,
}  # fmt: skip
# unittest assert methods the host runs itself, on rebuilt values: how many leading arguments are values
UNITTEST_CHECKS = {
    "assertEqual": 2, "assertEquals": 2, "assertNotEqual": 2, "assertNotEquals": 2, "assertTrue": 1,
    "assertFalse": 1, "assertIs": 2, "assertIsNot": 2, "assertIsNone": 1, "assertIsNotNone": 1, "assertIn": 2,
    "assertNotIn": 2, "assertGreater": 2, "assertGreaterEqual": 2, "assertLess": 2, "assertLessEqual": 2,
    "assertAlmostEqual": 2, "assertAlmostEquals": 2, "assertNotAlmostEqual": 2, "assertCountEqual": 2,
    "assertListEqual": 2, "assertTupleEqual": 2, "assertDictEqual": 2, "assertSetEqual": 2,
    "assertSequenceEqual": 2, "assertMultiLineEqual": 2,
}  # fmt: skip
_CASE = unittest.TestCase()
_CASE.maxDiff = 0


@dataclass(frozen=True)
class Check:
    """What one blinded assertion requires of the value the sandbox observed (host only; never sent there).

    ``kind``: ``compare`` (``actual OP expected``, or ``expected OP actual`` when ``reflected``), ``truth``
    (``bool(actual)``, which the sandbox computed, is ``not negated``), ``unittest`` (``case.METHOD(...)`` with the
    observed value at ``position`` among the expected ones), ``raises`` (the observed exception is one of
    ``classes``; its message matches ``match``), ``isinstance`` (the observed object's classes include one of
    ``classes``, or none when ``negated``).
    """

    kind: str
    op: str = "=="
    expected: object = None
    reflected: bool = False
    negated: bool = False
    method: str = ""
    position: int = 0
    options: Mapping[str, object] = field(default_factory=dict)  # places=, delta=
    classes: tuple[tuple[str, str], ...] = ()  # (module or package, qualname) of each accepted exception class
    match: str | None = None

    def passes(self, encoded: object) -> bool:
        actual = decode(encoded)
        if self.kind == "raises":
            return isinstance(actual, Raised) and self._raised(actual)
        if self.kind == "isinstance":
            found = isinstance(actual, Raised) and any(
                _is_class(name, module, qual) for module, qual in self.classes for name in actual.classes
            )
            return found is not self.negated and isinstance(actual, Raised)
        if actual is OPAQUE or isinstance(actual, Raised):
            return False
        try:
            if self.kind == "truth":
                return bool(actual) is not self.negated  # (a Structure refuses: TypeError)
            if self.kind == "compare":
                left, right = (self.expected, actual) if self.reflected else (actual, self.expected)
                return bool(_COMPARE[self.op](left, right))
            if self.kind == "unittest":
                values = list(self.expected) if isinstance(self.expected, tuple) else []  # type: ignore[arg-type]
                values.insert(self.position, actual)
                getattr(_CASE, self.method)(*values, **self.options)
                return True
        except (AssertionError, TypeError, ValueError, ArithmeticError):
            return False
        return False

    def _raised(self, raised: Raised) -> bool:
        if not any(_is_class(name, module, qual) for module, qual in self.classes for name in raised.classes):
            return False
        if self.match is None:
            return True
        if raised.message is None:
            return False
        try:
            return regex.search(self.match, raised.message, timeout=MATCH_TIMEOUT_S) is not None
        except (regex.error, TimeoutError):
            return False


def _is_class(observed: str, module: str, qualname: str) -> bool:
    """An observed ``module.qualname`` is the expected class: the same qualified name, or, for a class the test
    imported from a package, the same name in that package or one of its modules (``ledger.errors.MoneyError``
    for ``from ledger import MoneyError``)."""
    if observed == f"{module}.{qualname}":
        return True
    observed_module, _, observed_name = observed.rpartition(".")
    same_package = observed_module.split(".")[0] == module.split(".")[0]
    return module != "builtins" and observed_name == qualname and same_package


def expected_classes(node: ast.expr, scope: Scope, exceptions_only: bool = True) -> tuple[tuple[str, str], ...]:
    """``(module, qualname)`` of each class ``pytest.raises(node)`` (or ``isinstance(x, node)``) accepts, or
    ``NotConstant``.

    A class the test imports from the code under test is named as imported (``ledger.MoneyError``): a raised
    class of that name anywhere in the same top-level package is it (``Check`` compares names, never objects).
    """
    nodes = node.elts if isinstance(node, ast.Tuple) else [node]
    found = []
    for one in nodes:
        name = qualified(one, scope)
        if name is None:
            raise NotConstant("an exception class the host cannot name")
        module, _, qual = name.rpartition(".")
        builtin = getattr(builtins, qual, None) if module == "builtins" else None
        nameable = isinstance(builtin, type) and (qual in BUILTIN_EXCEPTIONS or not exceptions_only)
        if module == "builtins" and not nameable:
            raise NotConstant(f"{qual} is not a class the check can name")
        found.append((module, qual))
    return tuple(found)
