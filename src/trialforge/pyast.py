"""``ast.parse`` that threads may call at once.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state. When a garbage collection
inside one thread's parse lets another thread parse, the two interleave there, and a parse of valid code fails
with ``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905). It stopped a demo run:
a rollout's policy and a verifier's canary planting were parsing at the same time. Every parse in trialforge
goes through one lock. It costs no parallelism: a parse holds the GIL from start to end but for those
collections.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str | bytes) -> ast.Module:
    with _LOCK:
        return ast.parse(source)


def check_compiles(source: str, filename: str) -> None:
    """Compile ``source`` as an import would (``SyntaxError`` otherwise): a parse misses what the symbol table finds,
    such as a ``nonlocal`` whose binding an edit took out."""
    with _LOCK:
        compile(source, filename, "exec", dont_inherit=True)


def parse_expression(source: str) -> ast.expr:
    with _LOCK:
        return ast.parse(source, mode="eval").body
