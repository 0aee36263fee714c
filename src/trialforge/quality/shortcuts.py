"""Shortcut audit: a fixed panel of trivial strategies must score 0 on every task.

Each strategy rewrites the *base* code (what an agent starts from) without understanding the bug:
submit nothing, delete the body of every function the gold patch touches, make those functions return
a constant, or wrap their bodies in ``try/except Exception: pass``. The real verifier grades each one;
a strategy that scores 1 means the task rewards a trick, whatever its tests look like.

A strategy that has nothing to rewrite (the fix touches only module-level code) is recorded as
not applicable rather than skipped silently.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable

from trialforge import pyast
from trialforge.quality.change import Change
from trialforge.quality.probe import Probe
from trialforge.tasks.quality_record import Attempt

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
# A body rewrite: (the body's lines, their indentation, lines not to re-indent) -> the new body's lines.
BodyRewrite = Callable[[list[str], str, set[int]], list[str]]


def _replace_with(statement: str) -> BodyRewrite:
    return lambda body, indent, _: [f"{indent}{statement}\n"]


def _swallow(body: list[str], indent: str, keep: set[int]) -> list[str]:
    """``try: <body> except Exception: pass``: lines inside multi-line strings keep their indentation."""
    inner = [line if i in keep or not line.strip() else "    " + line for i, line in enumerate(body)]
    return [f"{indent}try:\n", *_terminated(inner), f"{indent}except Exception:\n", f"{indent}    pass\n"]


# The panel, in the order it runs. ``None``: submit nothing (the empty diff).
PANEL: dict[str, BodyRewrite | None] = {
    "noop": None,
    "delete_body": _replace_with("pass"),
    "return_zero": _replace_with("return 0"),
    "return_empty_string": _replace_with('return ""'),
    "return_true": _replace_with("return True"),
    "return_empty_list": _replace_with("return []"),
    "swallow_exceptions": _swallow,
}


def audit_shortcuts(gold: Change, probe: Probe) -> list[Attempt]:
    """One attempt per strategy of the panel, graded by the real verifier (or not applicable)."""
    attempts = []
    for name, rewrite in PANEL.items():
        if rewrite is None:
            attempts.append(probe.grade(name, "the empty diff", {}))
            continue
        texts, rewritten = _rewrite_touched(gold, rewrite)
        if not texts:
            attempts.append(Attempt(kind=name, note="the gold patch touches no function body in the base code"))
            continue
        attempts.append(probe.grade(name, f"rewrote {', '.join(rewritten)}", texts))
    return attempts


def _rewrite_touched(gold: Change, rewrite: BodyRewrite) -> tuple[dict[str, str], list[str]]:
    """Base texts of the changed files with every touched function's body rewritten, and what was rewritten."""
    texts: dict[str, str] = {}
    rewritten: list[str] = []
    for changed in gold.files:
        if changed.before is None or not changed.path.endswith(".py"):
            continue
        result = rewrite_functions(changed.before, changed.touched_lines(), rewrite)
        if result is not None:
            texts[changed.path], names = result
            rewritten += [f"{changed.path}:{name}" for name in names]
    return texts, rewritten


def rewrite_functions(source: str, lines: Iterable[int], rewrite: BodyRewrite) -> tuple[str, list[str]] | None:
    """``source`` with the body of each function enclosing ``lines`` rewritten; None when there is none.

    The docstring stays; one-line functions (body on the ``def`` line) are left alone.
    """
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return None
    text = source.splitlines(keepends=True)
    names = []
    for fn in sorted(enclosing_functions(tree, lines), key=lambda f: f.lineno, reverse=True):
        body = own_body(fn)
        if not body or body[0].lineno == fn.lineno:
            continue
        first, last = body[0].lineno, body[-1].end_lineno or body[-1].lineno
        indent = text[first - 1][: len(text[first - 1]) - len(text[first - 1].lstrip())]
        keep = {n - first for n in string_continuation_lines(body) if first <= n <= last}
        text[first - 1 : last] = rewrite(_terminated(text[first - 1 : last]), indent, keep)
        names.append(fn.name)
    return ("".join(text), sorted(names)) if names else None


def enclosing_functions(tree: ast.Module, lines: Iterable[int]) -> list[FunctionNode]:
    """The innermost function around each line, minus those nested in another one found (file order)."""
    functions = [n for n in ast.walk(tree) if isinstance(n, FunctionNode)]
    found: dict[int, FunctionNode] = {}
    for line in lines:
        around = [f for f in functions if f.lineno <= line <= (f.end_lineno or f.lineno)]
        if around:
            inner = max(around, key=lambda f: f.lineno)
            found[id(inner)] = inner
    chosen = list(found.values())
    outermost = [f for f in chosen if not any(g is not f and _contains(g, f) for g in chosen)]
    return sorted(outermost, key=lambda f: f.lineno)


def own_body(fn: FunctionNode) -> list[ast.stmt]:
    """The function's statements after its docstring."""
    return fn.body[1:] if ast.get_docstring(fn, clean=False) is not None else fn.body


def string_continuation_lines(nodes: Iterable[ast.AST]) -> set[int]:
    """Lines that sit inside a multi-line string literal: re-indenting them would change the string."""
    lines: set[int] = set()
    for node in nodes:
        for sub in ast.walk(node):
            stringy = isinstance(sub, ast.JoinedStr) or (isinstance(sub, ast.Constant) and isinstance(sub.value, str))
            if stringy and (sub.end_lineno or sub.lineno) > sub.lineno:
                lines.update(range(sub.lineno + 1, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _contains(outer: FunctionNode, inner: FunctionNode) -> bool:
    return outer.lineno < inner.lineno and (inner.end_lineno or 0) <= (outer.end_lineno or 0)


def _terminated(lines: list[str]) -> list[str]:
    return [line if line.endswith("\n") else line + "\n" for line in lines]
