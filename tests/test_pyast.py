"""Parsing from several threads at once never fails on valid code (CPython 3.11's AST constructor keeps its
recursion depth in state the threads share: python/cpython#106905)."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import pytest

from trialforge import pyast

pytestmark = pytest.mark.pure

SOURCE = Path(pyast.__file__).parent.joinpath("rollout", "repair.py").read_text()


class _Cycle:
    """Cyclic garbage whose finalizer lets another thread run: a collection inside one thread's parse then
    hands the interpreter to a thread that starts parsing too."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        os.sched_yield()  # releases the GIL: another thread runs mid-collection


def _parse_while_collecting(errors: list[str], depth: int) -> None:
    if depth:  # each thread parses from another stack depth, as the pipeline's threads do
        return _parse_while_collecting(errors, depth - 1)
    for _ in range(60):
        for _ in range(20):
            _Cycle()
        try:
            pyast.parse(SOURCE)
            pyast.parse_expression("(a if b else c)")
        except SystemError as error:
            errors.append(str(error))


def test_threads_that_parse_while_the_collector_runs_all_succeed() -> None:
    errors: list[str] = []
    threshold = gc.get_threshold()
    gc.set_threshold(50)  # collections often, inside the parses
    try:
        threads = [threading.Thread(target=_parse_while_collecting, args=(errors, 7 * i)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*threshold)
    assert errors == []
