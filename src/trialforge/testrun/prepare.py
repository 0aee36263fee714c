"""Preparing a tree for a test run, on the host before the sandbox exists: the ``Guard`` the run is checked against.

``prepare`` rewrites the tree's test files: in a graded run the expected values of the assertions the host can
judge leave the sandbox (``blinding.blind``: the sandbox only observes, the host compares), and in a validation
run every such assertion is observed as it runs (``blinding.instrument``, to calibrate); then it plants canary
tests (``canaries``) and hashes the pristine test files. ``analyse_tests`` finds the tests of a tree's files
as instrumenting them would.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trialforge import pyast
from trialforge.envspec import TestRunner
from trialforge.testrun.blinding import (
    Blinding,
    FileAnalysis,
    analyse,
    blind,
    importable_test_modules,
    instrument,
    referenced_names,
)
from trialforge.testrun.canaries import Canary, TestNames, plant

Observe = Literal["off", "instrument", "blind"]


@dataclass(frozen=True)
class Guard:
    """What the host planted in a tree and what it knows of it: the run is checked against this."""

    canaries: tuple[Canary, ...] = ()
    # relative path -> sha256 of every Python file the diff under test did not change (None: the host
    # vouches for the whole tree): plugins registered during the run must come from one of them
    pristine: dict[str, str] | None = None
    test_files: tuple[str, ...] = ()  # the pristine test files: the audit hook lets their calls be
    extra_ids: tuple[str, ...] = field(default=())  # canary ids to add to an explicit test selection
    runner: TestRunner = "pytest"  # the runner the canaries were written for
    blinding: Blinding | None = None  # a graded run's: the host's checks and each renamed test's original id
    analyses: Mapping[str, FileAnalysis] = field(default_factory=dict)  # a validation run's instrumented files

    @property
    def must_fail(self) -> int:
        return sum(c.must == "fail" for c in self.canaries)


def prepare(
    tree: Path,
    test_ids: list[str],
    test_files: Iterable[str],
    *,
    changed: Iterable[str] = (),
    plant_in: list[str] | None = None,
    copy_from: list[str] | None = None,
    rng: random.Random | None = None,
    runner: TestRunner = "pytest",
    observe: Observe = "off",
    in_process: Iterable[str] = (),
    param_rows: Mapping[str, int] | None = None,
    recorded: Mapping[str, object] | None = None,
    run_recorded: bool = False,
) -> Guard:
    """Rewrite and plant canaries in ``tree`` (the files of ``test_ids``, or ``plant_in``); hash what the diff
    left alone.

    ``test_files``: the tree's test files (relative paths; the diff's test-path edits were dropped).
    ``changed``: the files the diff under test changed (the agent's, or a gold patch being validated).
    ``copy_from``: the tests to make must-fail copies of (canaries.plant); a random one per file when None.
    ``runner``: the runner the tree's tests will run under (its loader decides what a canary must look like).
    ``observe``: ``blind`` the files of ``test_ids`` (grading: ``in_process``, ``param_rows`` and ``recorded`` come
    from the task's validation), ``instrument`` every test file (validation), or neither. ``run_recorded``: blinded
    files still run recorded expected sides (``blinding.blind``; validation only).
    """
    rng = rng or random.Random(secrets.randbits(64))
    files = list(test_files)
    names: dict[str, TestNames] = {}
    blinding: Blinding | None = None
    analyses: dict[str, FileAnalysis] = {}
    modules = importable_test_modules(files)
    if observe == "blind":
        read = _names_read(tree, files)
        for rel, ids in _by_file(test_ids).items():
            analysis = _analysis(tree, rel, runner, modules)
            if analysis is None:
                continue
            names[rel] = TestNames(analysis.module, rng)
            blinded = blind(analysis, ids, in_process, param_rows, names[rel].new, rng, recorded, read, run_recorded)
            if blinded is not None:
                (tree / rel).write_text(blinded[0], encoding="utf-8")
                blinding = blinded[1] if blinding is None else blinding.merged(blinded[1])
    elif observe == "instrument":
        for rel in files:
            analysis = _analysis(tree, rel, runner, modules)
            rewritten = instrument(analysis) if analysis is not None else None
            if analysis is not None and rewritten is not None:
                (tree / rel).write_text(rewritten, encoding="utf-8")
                analyses[rel] = analysis
    sandbox_ids = blinding.sandbox_ids(test_ids) if blinding else list(test_ids)
    copies = None if copy_from is None else (blinding.sandbox_ids(copy_from) if blinding else copy_from)
    canaries = plant(tree, sandbox_ids, rng, files=plant_in, copy_from=copies, runner=runner, names=names)
    skip = set(changed) - {c.file for c in canaries}
    hashes = {
        rel: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(tree.rglob("*.py"))
        if (rel := path.relative_to(tree).as_posix()) not in skip and path.is_file() and not path.is_symlink()
    }
    tests = tuple(sorted(rel for rel in {*files, *(c.file for c in canaries)} if rel in hashes))
    extra = tuple(c.node_id for c in canaries)
    return Guard(tuple(canaries), hashes, tests, extra, runner, blinding, analyses)


def analyse_tests(tree: Path, files: Iterable[str], runner: TestRunner = "pytest") -> dict[str, FileAnalysis]:
    """The tests of each of ``files`` (relative to ``tree``), as ``prepare(observe="instrument")`` finds them."""
    found = {}
    files = list(files)
    modules = importable_test_modules(files)
    for rel in files:
        analysis = _analysis(tree, rel, runner, modules)
        if analysis is not None and analysis.tests:
            found[rel] = analysis
    return found


def _by_file(test_ids: Iterable[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for test_id in test_ids:
        if "::" in test_id:
            found.setdefault(test_id.split("::", 1)[0], []).append(test_id)
    return found


def _names_read(tree: Path, files: list[str]) -> frozenset[str]:
    """Every name the test files read (``blinding.referenced_names``): a test another file calls keeps its name."""
    read: set[str] = set()
    for rel in files:
        path = tree / rel
        if rel.endswith(".py") and path.is_file() and not path.is_symlink():
            try:
                read.update(referenced_names(pyast.parse(path.read_text(encoding="utf-8"))))
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
                continue  # not analysed: its tests are not blinded either
    return frozenset(read)


def _analysis(tree: Path, rel: str, runner: TestRunner, test_modules: frozenset[str]) -> FileAnalysis | None:
    path = tree / rel
    if not rel.endswith(".py") or not path.is_file() or path.is_symlink():
        return None
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return analyse(source, rel, runner, test_modules)
