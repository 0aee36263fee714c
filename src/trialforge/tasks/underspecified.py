"""Is a task's statement enough to act on? What its fail-to-pass tests require that the statement never states.

Read from the test functions' source (the test patch applied): the exception types a test expects raised
(``pytest.raises``, ``assertRaises``, ``assertRaisesRegex``; a tuple asks for any one of them) and the string
literals it compares against (``assert x == "..."``, ``assertEqual``, ``assertIn``, ``match=``). A type is
derivable when the statement names it (the observed behaviour counts: ``DID NOT RAISE <class 'LookupError'>``),
or a builtin subclass of it (raising the ``KeyError`` a statement names satisfies ``pytest.raises(LookupError)``).
A literal matters only when the fix introduces it (an added line holds it, no removed line does): anything else
the agent can read in the code. The task is underspecified when one of either is missing; the record says which
(``StatementRecord``), and the quality gate drops it when ``underspecified`` is enforced.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterator, Mapping, Sequence

RAISES = frozenset({"raises", "assertRaises", "assertRaisesRegex"})
COMPARES = frozenset({"assertEqual", "assertEquals", "assertIn", "assertNotEqual", "assertMultiLineEqual",
                      "assertRegex", "assertStartsWith"})  # fmt: skip
MIN_LITERAL = 4  # shorter strings ("", "a", "ok") are not what a statement fails to specify
_REGEX_META = re.compile(r"(?<!\\)[.*+?^$()\[\]{}|]")


def missing(
    statement: str, modules: Mapping[str, ast.Module], fail_to_pass: Sequence[str], fix: str
) -> tuple[list[str], list[str]]:
    """(exception types, literals) that ``fail_to_pass`` require and ``statement`` does not state; ``modules``: test
    module path -> its tree with the test patch applied; ``fix``: the gold patch."""
    words = set(re.findall(r"\w+", statement))
    exceptions: dict[str, None] = {}
    literals: dict[str, None] = {}
    for node in _test_functions(modules, fail_to_pass):
        for group in _raised(node):
            if not any(_derivable(name, words) for name in group):
                exceptions[" | ".join(group)] = None
        for text in _compared(node):
            if len(text) >= MIN_LITERAL and text not in statement and introduces(fix, text):
                literals[text] = None
    return list(exceptions), list(literals)


def introduces(fix: str, text: str) -> bool:
    """Whether the patch ``fix`` introduces ``text``: an added line holds it, no removed line does."""
    added, removed = _changed(fix)
    return text in added and text not in removed


def _derivable(name: str, words: set[str]) -> bool:
    if name in words:
        return True
    wanted = getattr(builtins, name, None)
    if not (isinstance(wanted, type) and issubclass(wanted, BaseException)):
        return False
    named = (getattr(builtins, w, None) for w in words)
    return any(isinstance(t, type) and issubclass(t, wanted) for t in named)


def _changed(patch: str) -> tuple[str, str]:
    """The patch's added and removed lines, each joined into one text."""
    lines = [line for line in patch.splitlines() if not line.startswith(("+++", "---"))]
    return ("\n".join(x[1:] for x in lines if x.startswith("+")), "\n".join(x[1:] for x in lines if x.startswith("-")))


def _test_functions(modules: Mapping[str, ast.Module], tests: Sequence[str]) -> Iterator[ast.FunctionDef]:
    """The function of each test id found in ``modules`` (``path::[Class::]name[params]``), once each."""
    wanted: dict[str, set[tuple[str, ...]]] = {}
    for test in tests:
        path, _, rest = test.partition("::")
        if rest:
            wanted.setdefault(path, set()).add(tuple(rest.split("[", 1)[0].split("::")))
    for path, names in wanted.items():
        if path in modules:
            yield from _functions(modules[path].body, (), names)


def _functions(body: list[ast.stmt], scope: tuple[str, ...], names: set[tuple[str, ...]]) -> Iterator[ast.FunctionDef]:
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield from _functions(node.body, (*scope, node.name), names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (*scope, node.name) in names:
            yield node  # type: ignore[misc]


def _raised(function: ast.FunctionDef) -> Iterator[tuple[str, ...]]:
    """Each exception requirement: the type names one ``raises`` call accepts."""
    for call in _calls(function, RAISES):
        if call.args:
            target = call.args[0]
            elements = target.elts if isinstance(target, ast.Tuple) else [target]
            names = tuple(n for e in elements if (n := _name(e)))
            if names:
                yield names


def _compared(function: ast.FunctionDef) -> Iterator[str]:
    """The string literals the test compares against, and its ``match=`` patterns that are plain text."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
            yield from _strings([node.test.left, *node.test.comparators])
    for call in _calls(function, COMPARES):
        yield from _strings(call.args)
    for call in _calls(function, RAISES):
        patterns = [k.value for k in call.keywords if k.arg == "match"] + call.args[1:2]
        for text in _strings(patterns):
            if not _REGEX_META.search(text):
                yield re.sub(r"\\(.)", r"\1", text)


def _calls(function: ast.FunctionDef, names: frozenset[str]) -> Iterator[ast.Call]:
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and _name(node.func) in names:
            yield node


def _strings(nodes: Sequence[ast.expr]) -> Iterator[str]:
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""
