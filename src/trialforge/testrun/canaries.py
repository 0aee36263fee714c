"""Canary tests: planted by the host into the test files of a graded run, with known outcomes.

Code that makes the run report what it likes cannot tell a canary from a real test, so it moves the canaries too:
a **must-fail** canary passing means outcomes were forced; a self-contained **must-pass** canary missing, skipped or
failing means the run was cut short, filtered or tampered with. The host knows which is which; nothing in the
sandbox does. How they are made and placed: docs/verification.md, "Canaries".
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trialforge import pyast
from trialforge.envspec import TestRunner
from trialforge.testrun.lineedits import split_lines

Must = Literal["pass", "fail"]
MAX_FILES = 3  # test files that get canaries in one run
MAX_COPIES = 4  # must-fail copies per file
_WORD = re.compile(r"[a-z][a-z0-9]*")
_FALLBACK_WORDS = ("value", "case", "basic", "result", "input", "edge", "default", "simple", "again", "mixed")


@dataclass(frozen=True)
class Canary:
    node_id: str  # pytest node id, e.g. tests/test_core.py::TestX::test_y
    must: Must
    kind: str  # mutated_copy | self_contained
    source: str = ""  # a mutated copy's original test: skipped or missing together with it is no evidence

    @property
    def file(self) -> str:
        return self.node_id.split("::", 1)[0]


class TestNames:
    """Fresh test names in one file's own words (``test_parse_empty``), for everything the host adds or renames
    there: blinded graded tests, canaries and their copies share one generator, so no name tells them apart."""

    def __init__(self, module: ast.Module, rng: random.Random) -> None:
        self.taken = {
            n.name for n in ast.walk(module) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }
        self.words = _words(self.taken)
        self.rng = rng
        self.size = 2  # words per name: grows when the names of this many are (nearly) all taken

    def new(self) -> str:
        return self._fresh(lambda words: "_".join(["test", *words]))

    def new_class(self) -> str:
        """A TestCase name in the file's words: TestParseEmpty."""
        return self._fresh(lambda words: "Test" + "".join(w.capitalize() for w in words))

    def _fresh(self, spell: Callable[[list[str]], str]) -> str:
        # A file of thousands of tests in a few words (idna's 6,333 ``test_uts46_N``) takes every two-word name: then
        # three words, and so on (the file has at least 10 words with the borrowed ones: 10! names at most).
        while True:
            for _ in range(100):
                name = spell(self.rng.sample(self.words, min(len(self.words), self.size)))
                if name not in self.taken:
                    self.taken.add(name)
                    return name
            if self.size >= len(self.words):
                raise RuntimeError("no free test name")  # every ordering of every word of the file is taken
            self.size += 1


def plant(
    tree: Path,
    test_ids: list[str],
    rng: random.Random,
    *,
    files: list[str] | None = None,
    copy_from: list[str] | None = None,
    runner: TestRunner = "pytest",
    names: dict[str, TestNames] | None = None,
) -> list[Canary]:
    """Plant canaries in the files of ``test_ids`` (or ``files``) under ``tree``; return what was planted.

    Per file: a must-fail copy of each test of ``copy_from`` (the fail-to-pass tests, whose answers a
    tamper most wants; up to ``MAX_COPIES``) that has a constant expectation, or of one random test of
    the file when ``copy_from`` is None, plus one self-contained must-fail and one must-pass canary.
    ``names``: each file's name generator, when the host already renamed tests there (blinding).
    Files that do not parse are left alone (their tests cannot run either).
    """
    chosen = files if files is not None else list(dict.fromkeys(t.split("::", 1)[0] for t in test_ids))
    planted: list[Canary] = []
    for rel in [f for f in chosen if f.endswith(".py") and (tree / f).is_file()][:MAX_FILES]:
        copies = None if copy_from is None else {_in_file(t) for t in copy_from if t.startswith(rel + "::")}
        planted += _plant_file(tree / rel, rel, copies, rng, runner, (names or {}).get(rel))
    return planted


def _in_file(test_id: str) -> str:
    """``tests/t.py::TestX::test_y[1]`` -> ``TestX::test_y``."""
    return test_id.split("::", 1)[1].split("[", 1)[0]


def _plant_file(
    path: Path, rel: str, copies: set[str] | None, rng: random.Random, runner: TestRunner, names: TestNames | None
) -> list[Canary]:
    source = path.read_text(encoding="utf-8", errors="surrogateescape")
    try:
        module = pyast.parse(source)
    except SyntaxError:
        return []
    if runner == "unittest" and any(isinstance(n, ast.FunctionDef) and n.name == "load_tests" for n in module.body):
        return []
    lines = split_lines(source)  # as the tokenizer counts them: ast's line numbers index this list
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"
    if names is None:
        names = TestNames(module, rng)
    else:
        names.taken |= {n.name for n in ast.walk(module) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    inserts: list[tuple[int, str, bool]] = []  # (insert after this 1-based line, text, a method copy?)
    planted: list[Canary] = []
    candidates = _copy_candidates(module, copies, runner)
    if copies is None and candidates:
        candidates = [rng.choice(candidates)]
    pool = _constants(module)
    for holder, node, source_path, constant in candidates[:MAX_COPIES]:
        after, text, node_path = _mutated_copy(module, lines, holder, node, constant, rng, names.new, pool)
        inserts.append((after, text, holder is not None))
        planted.append(Canary(f"{rel}::{node_path}", "fail", "mutated_copy", f"{rel}::{source_path}"))
    # Self-contained canaries go below the file's last line, in random order: no line of the file moves for them
    # (code can see where it stands: docs/verification.md). They call no code under test, which tells them apart
    # whatever their place; the copies, which must not be told apart, sit next to their originals.
    base, tail = None, ""
    if runner == "unittest":
        base, imported = _testcase_base(module)
        tail = "" if imported else "\n\nimport unittest\n"
    ends: list[str] = []
    for must in ("fail", "pass"):
        name = names.new()
        if base is None:
            text, node_id = _self_contained(name, must, rng, pool), name
        else:
            cls = names.new_class()
            text, node_id = _self_contained(name, must, rng, pool, base=base, cls=cls), f"{cls}::{name}"
        ends.append("\n\n" + text)
        planted.append(Canary(f"{rel}::{node_id}", must, "self_contained"))
    rng.shuffle(ends)
    # Bottom up, so earlier line numbers stay valid; at one line the method copies go in last, so they land
    # right after their class's last line, before a copy of a function placed at the same line.
    for after, text, _ in sorted(inserts, key=lambda i: (i[0], not i[2]), reverse=True):
        lines.insert(after, text)
    path.write_text("".join([*lines, tail, *ends]), encoding="utf-8", errors="surrogateescape")
    return planted


def _constants(module: ast.Module) -> dict[type, list[object]]:
    """The file's own constants by type (ints, floats, strings): what a mutated expectation is drawn from."""
    pool: dict[type, list[object]] = {int: [], float: [], str: []}
    for node in ast.walk(module):
        usable = isinstance(node, ast.Constant) and type(node.value) in pool
        if usable and not (isinstance(node.value, str) and (len(node.value) > 80 or "\n" in node.value)):
            pool[type(node.value)].append(node.value)
    return {kind: sorted(set(values), key=repr) for kind, values in pool.items()}


def _words(names: set[str]) -> list[str]:
    found = {w for n in names if n.startswith("test") for w in _WORD.findall(n.lower()) if w != "test" and len(w) > 2}
    return sorted(found | set(_FALLBACK_WORDS) if len(found) < 8 else found)  # a small file borrows common words


def _testcase_base(module: ast.Module) -> tuple[str, bool]:
    """How the module names ``unittest.TestCase``, and whether it imports it (else ``import unittest`` goes in)."""
    for node in module.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "unittest":
                    return f"{alias.asname or 'unittest'}.TestCase", True
        elif isinstance(node, ast.ImportFrom) and node.module == "unittest" and not node.level:
            for alias in node.names:
                if alias.name == "TestCase":
                    return alias.asname or "TestCase", True
    return "unittest.TestCase", False


def _copy_candidates(module: ast.Module, copies: set[str] | None, runner: TestRunner) -> list:
    """(class or None, function, node path, its expected constant) of each test that can be copied."""
    found = []
    for holder, node in _test_functions(module, runner):
        path = f"{holder.name}::{node.name}" if holder else node.name
        if node.decorator_list or (copies is not None and path not in copies):
            continue
        constant = _expected_constant(node)
        if constant is not None:
            found.append((holder, node, path, constant))
    return found


def _mutated_copy(module, lines, holder, node, constant, rng: random.Random, new_name, pool) -> tuple[int, str, str]:
    """(insert after line, text, node path) of a copy of ``node`` expecting another value than ``constant``."""
    body = lines[node.lineno - 1 : node.end_lineno]
    replacement = _mutate(constant.value, rng, pool)
    row = constant.lineno - node.lineno
    line = body[row]
    start, end = _byte_to_char(line, constant.col_offset), _byte_to_char(line, constant.end_col_offset)
    body[row] = line[:start] + repr(replacement) + line[end:]
    name = new_name()  # a fresh name: a copy named after its source would say which of the two is the copy
    body[0] = re.sub(rf"\bdef\s+{re.escape(node.name)}\b", f"def {name}", body[0], count=1)
    # Right before or right after its original, at even odds: which of two twins runs first says nothing. Each twin
    # has the original's blank lines above it, so spacing says nothing either (the file is not reprinted).
    blank = 0
    while node.lineno - 1 - blank > 0 and not lines[node.lineno - 2 - blank].strip():
        blank += 1
    gap = "\n" * blank
    if rng.random() < 0.5:
        return node.lineno - 1, "".join(body) + gap, f"{holder.name}::{name}" if holder else name
    return node.end_lineno, gap + "".join(body), f"{holder.name}::{name}" if holder else name


def _test_functions(module: ast.Module, runner: TestRunner = "pytest"):
    """Tests the runner collects: pytest's functions and Test* classes' methods; unittest's methods of any
    class with a base (a TestCase, or the copy goes missing together with its source)."""
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            if runner == "pytest":
                yield None, node
        elif (
            isinstance(node, ast.ClassDef)
            and (node.name.startswith("Test") if runner == "pytest" else bool(node.bases))
            and not node.decorator_list
        ):
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef) and inner.name.startswith("test"):
                    yield node, inner


def _expected_constant(function: ast.FunctionDef) -> ast.Constant | None:
    """The last constant expected by ``assert x == C`` / ``assert C == x`` / ``self.assertEqual(x, C)``."""
    found = None
    for node in ast.walk(function):
        sides: list[ast.expr] = []
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
            compare = node.test
            if len(compare.ops) == 1 and isinstance(compare.ops[0], ast.Eq):
                sides = [compare.left, compare.comparators[0]]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "assertEqual"
            and len(node.args) == 2
        ):
            sides = list(node.args)
        for side in sides:
            usable = isinstance(side, ast.Constant) and _mutable_constant(side.value) and side.lineno == side.end_lineno
            if usable and (found is None or (side.lineno, side.col_offset) > (found.lineno, found.col_offset)):
                found = side
    return found


def _mutable_constant(value: object) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _mutate(value: int | float | str, rng: random.Random, pool: dict[type, list[object]] | None = None) -> object:
    """A different value of the same type and look, drawn near the original and absent from the file: a value the
    file already holds elsewhere, or one a fixed offset away, would say which of two twins is the copy."""
    taken = set((pool or {}).get(type(value), [])) | {value}
    if isinstance(value, int):
        spread = max(abs(value), 10)
        for _ in range(1000):
            candidate = value + rng.randint(-spread, spread)
            if candidate not in taken:
                return candidate
        return max(taken) + 1  # every nearby value is taken: one the file has not
    if isinstance(value, float):
        text = repr(value)
        places = len(text.split(".", 1)[1]) if "." in text and "e" not in text else 2
        spread = max(abs(value), 1.0)
        for _ in range(1000):
            candidate = round(value + rng.uniform(-spread, spread), places)
            if candidate not in taken:
                return candidate
        return max(taken) + 1.0
    letters = "abcdefghijklmnopqrstuvwxyz"
    if not value:
        return rng.choice(letters)
    position = rng.randrange(len(value))
    return value[:position] + rng.choice([c for c in letters if c != value[position]]) + value[position + 1 :]


def _byte_to_char(line: str, offset: int) -> int:
    """ast offsets count UTF-8 bytes; slicing counts characters."""
    return len(line.encode("utf-8")[:offset].decode("utf-8", errors="ignore"))


def _self_contained(
    name: str,
    must: Must,
    rng: random.Random,
    pool: dict[type, list[object]] | None = None,
    *,
    base: str = "",
    cls: str = "",
) -> str:
    """A small test that touches no code under test: passes, or fails, on any honest run.

    A function, or with ``cls`` a TestCase class of that name (deriving from ``base``) holding one method."""
    values = rng.sample(range(2, 500), rng.randint(3, 6))
    kind = rng.choice(("sorted", "sum", "join", "dict"))
    if kind == "sorted":
        setup, got, right = f"values = {values!r}", "sorted(values)[0]", min(values)
    elif kind == "sum":
        setup, got, right = f"values = {values!r}", "sum(values)", sum(values)
    elif kind == "join":
        parts = [f"p{v}" for v in values]
        setup, got, right = f"parts = {parts!r}", '"-".join(parts)', "-".join(parts)
    else:
        pairs = {f"k{v}": v for v in values}
        key = rng.choice(list(pairs))
        setup, got, right = f"table = {pairs!r}", f"table[{key!r}]", pairs[key]
    wrong = [v for v in values if v != right] if kind in ("sorted", "dict") else [_mutate(right, rng, pool)]
    expected = right if must == "pass" else rng.choice(wrong)
    if cls:
        return (
            f"class {cls}({base}):\n    def {name}(self):\n        {setup}\n"
            f"        self.assertEqual({got}, {expected!r})\n"
        )
    return f"def {name}():\n    {setup}\n    assert {got} == {expected!r}\n"
