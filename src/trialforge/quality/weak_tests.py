"""Weak-test audit: wrong fixes derived from the gold patch must score 0 with the real verifier.

The wrong fixes (``partial_revert``, the mutation families of ``tasks/mutations.py``, ``const_return``) are whole-file
rewrites of the base tree graded exactly like an agent's diff. One that still scores 1 is a wrong fix the tests
accept: the task is weak, and that candidate's diff is the evidence. docs/pipeline.md, "Quality gates".
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from trialforge import pyast
from trialforge.quality.change import Change, ChangedFile
from trialforge.quality.probe import Probe
from trialforge.quality.shortcuts import enclosing_functions, own_body
from trialforge.tasks.mutations import SourceText, mutants_of_source, sample_mutants
from trialforge.tasks.quality_record import Attempt

CONST_RETURNS = ("0", '""', "True", "[]")  # ``None`` is the ``wrong_return`` family's


@dataclass(frozen=True)
class WrongFix:
    kind: str
    note: str
    texts: dict[str, str | None]  # changed files as whole-file rewrites of the base tree (None: deleted)


def audit_tests(gold: Change, probe: Probe, *, max_mutants: int, seed: int, stop_at_pass: bool) -> list[Attempt]:
    """Grade up to ``max_mutants`` admissible wrong fixes of ``gold``; every graded one is returned.

    ``stop_at_pass``: stop at the first that scores 1 (when the gate is enforced, that one drops the task, and
    it is the evidence; grading more would only count them).
    """
    graded: list[Attempt] = []
    seen: set[tuple[tuple[str, str | None], ...]] = set()
    for fix in wrong_fixes(gold, seed):
        if len(graded) >= max_mutants or (stop_at_pass and graded and graded[-1].scores):
            break
        key = tuple(sorted(fix.texts.items(), key=lambda item: item[0]))
        if key in seen or inadmissible(fix, gold) is not None:
            continue
        seen.add(key)
        graded.append(probe.grade(fix.kind, fix.note, fix.texts))
    return graded


def wrong_fixes(gold: Change, seed: int) -> Iterator[WrongFix]:
    """Every candidate, the kinds taken in turn (unfiltered: see ``inadmissible``)."""
    streams = [partial_reverts(gold), operator_mutants(gold, seed), constant_returns(gold)]
    for round_ in itertools.zip_longest(*streams):
        yield from (fix for fix in round_ if fix is not None)


def inadmissible(fix: WrongFix, gold: Change) -> str | None:
    """Why ``fix`` is not worth a verifier run (None: it is)."""
    by_path = {f.path: f for f in gold.files}
    for path, text in fix.texts.items():
        if text is not None and path.endswith(".py"):
            try:
                compile(text, path, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                return f"does not compile: {exc}"
    if all(text == by_path[path].before for path, text in fix.texts.items()):
        return "is the base code"
    if all(_same_behaviour(path, text, by_path[path].after) for path, text in fix.texts.items()):
        return "equivalent to the gold patch"
    return None


def partial_reverts(gold: Change) -> Iterator[WrongFix]:
    hunks = [(changed, number) for changed in gold.files for number in range(changed.hunks)]
    if len(hunks) < 2:
        return
    everything = set(range(len(hunks)))
    subsets = [everything - {i} for i in range(len(hunks))]
    if len(hunks) > 2:  # with two hunks, "each alone" is "each left out" again
        subsets += [{i} for i in range(len(hunks))]
    for keep in subsets:
        texts = {f.path: f.with_hunks({n for i, (g, n) in enumerate(hunks) if i in keep and g is f})
                 for f in gold.files}  # fmt: skip
        labels = [f"{f.path}:{f.hunk_line(n)}" for i, (f, n) in enumerate(hunks) if i not in keep]
        yield WrongFix("partial_revert", f"hunk(s) left out: {', '.join(labels)}", texts)


def operator_mutants(gold: Change, seed: int) -> Iterator[WrongFix]:
    """Single-site mutants on the lines the patch adds, in a seeded order balanced across families."""
    after = {f.path: f.after or "" for f in gold.python_files()}
    found = []
    for changed in gold.python_files():
        added = changed.added_lines()
        found += [
            m for m in mutants_of_source(changed.path, after[changed.path])
            if any(line in added for line in range(m.line, m.end_line + 1))
        ]  # fmt: skip
    for mutant in sample_mutants(found, max_per_file=None, max_total=None, seed=seed):
        texts = {**gold.texts(), mutant.path: mutant.apply(after[mutant.path])}
        yield WrongFix(mutant.family, f"{mutant.path}:{mutant.line} {mutant.note}", texts)


def constant_returns(gold: Change) -> Iterator[WrongFix]:
    """Each function the patch touches, every ``return`` in it returning a constant instead."""
    for changed in gold.python_files():
        for name, returns in _returns_of_touched(changed):
            for const in CONST_RETURNS:
                text = _replace_spans(changed.after or "", [(start, end, const) for start, end in returns])
                texts = {**gold.texts(), changed.path: text}
                yield WrongFix("const_return", f"{changed.path}:{name} returns {const}", texts)


def _returns_of_touched(changed: ChangedFile) -> list[tuple[str, list[tuple[int, int]]]]:
    """(function name, character spans of its return values) for each touched function that returns a value."""
    text = changed.after or ""
    try:
        tree = pyast.parse(text)
    except SyntaxError:
        return []
    src = SourceText(text)
    found = []
    for fn in enclosing_functions(tree, changed.added_lines()):
        spans = [(src.start(r.value), src.end(r.value)) for r in _own_returns(own_body(fn)) if r.value is not None]
        if spans:
            found.append((fn.name, spans))
    return found


def _own_returns(nodes: Iterable[ast.AST]) -> Iterator[ast.Return]:
    """The ``return`` statements of a function body, not those of functions nested in it."""
    for node in nodes:
        if isinstance(node, ast.Return):
            yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            yield from _own_returns(ast.iter_child_nodes(node))


def _replace_spans(text: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _same_behaviour(path: str, text: str | None, gold_text: str | None) -> bool:
    """True when two versions of a file cannot behave differently: same text, or same Python syntax tree
    once docstrings are set aside (comments and formatting never reach the tree)."""
    if text == gold_text:
        return True
    if text is None or gold_text is None or not path.endswith(".py"):
        return False
    try:
        return _normalised_tree(text) == _normalised_tree(gold_text)
    except SyntaxError:
        return False


def _normalised_tree(text: str) -> str:
    tree = pyast.parse(text)
    for node in ast.walk(tree):
        documented = isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        if documented and ast.get_docstring(node, clean=False) is not None:
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)
