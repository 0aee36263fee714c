"""The statement's second half: what validation saw fail before the fix, stated as observed behaviour.

A mined commit's message says what its author changed; an agent also needs what goes wrong. After validation,
the statement is the author's text (the commit message, the linked issue) plus an "Observed behaviour" section
from the runs before the fix: the fail-to-pass tests (a sample) and, per test, its failure's exception line as the
run printed it (``KeyError: 'a'``, ``assert 3 == 4``, ``DID NOT RAISE <class 'LookupError'>``). A test module
that did not import before the fix is one line with its import error, not its tests one by one. Never shown: a
line of the fix's diff, and a value the host judges (``HostJudged.recorded``: the expected values grading keeps out
of the sandbox, which a statement would hand back to it). ``Task.statement`` records which part came from where.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Mapping, Sequence

from trialforge.tasks.schema import Task
from trialforge.tasks.statement_record import StatementPart, StatementRecord
from trialforge.tasks.statements import changed_lines, leaks
from trialforge.tasks.underspecified import missing
from trialforge.testrun.report import TestReport

HEADING = "Observed behaviour (the test suite, run before the fix):"
MAX_TESTS = 10  # fail-to-pass tests named, each with its failure
MAX_MODULES = 5  # modules that do not import, each with its error
MAX_LINE = 200
REDACTED = "…"
MINED = ("git", "github", "jira")  # sources whose statement is an author's text (synthetic ones are written from runs)
MIN_BARE = 3  # a judged string this long is hidden unquoted too (``ValueError: abc`` shows it bare)


def observed_section(
    fail_to_pass: Sequence[str],
    before: Sequence[TestReport],
    modules: Collection[str],
    hidden: Collection[object] = (),
    fix: str = "",
) -> str:
    """The section for ``fail_to_pass`` from the ``before`` runs; ``modules``: the fail-to-pass modules that did not
    import, stated once each; ``hidden``: values never to show; ``fix``: the gold patch (no line of it is shown)."""
    secret = changed_lines(fix)

    def shown(message: str | None) -> str:
        """``message`` as the section may show it: judged values hidden, none if it shows a line of the fix."""
        text = _trim(_redact(message or "", hidden))
        return f": {text}" if text and not leaks(text, secret) else ""

    errors = {m: e for r in before for m, e in r.collection_errors.items() if m in modules}
    said = {t: m for r in reversed(before) for t, m in r.failures.items()}  # the first run's line wins
    lines = [f"- `{m}` does not import{shown(errors.get(m))}" for m in sorted(modules)[:MAX_MODULES]]
    if len(modules) > MAX_MODULES:
        lines.append(f"- ... and {len(modules) - MAX_MODULES} more modules that do not import")
    tests = [t for t in fail_to_pass if t.split("::", 1)[0] not in modules]
    lines += [f"- `{t}` fails{shown(said.get(t))}" for t in tests[:MAX_TESTS]]
    if len(tests) > MAX_TESTS:
        lines.append(f"- ... and {len(tests) - MAX_TESTS} more failing tests")
    return "\n".join([HEADING, *lines]) + "\n"


def with_observed(task: Task, before: Sequence[TestReport], hidden: Collection[object] = ()) -> Task:
    """``task`` with its statement rewritten: the author's text (kept from a former validation's record) and the
    observed section; ``Task.statement`` says which is which."""
    author = task.statement.author_text(task.problem_statement) if task.statement else task.problem_statement
    author = author.rstrip() + "\n"
    modules = task.validation.fail_to_pass_modules_not_importing
    section = observed_section(task.fail_to_pass, before, modules, hidden, task.gold_patch)
    text = f"{author}\n{section}"
    parts = [StatementPart(source="author", start=0, end=len(author)),
             StatementPart(source="observed", start=len(author) + 1, end=len(text))]  # fmt: skip
    record = StatementRecord(parts=parts)
    return task.model_copy(update={"problem_statement": text, "statement": record})


def _redact(line: str, hidden: Collection[object]) -> str:
    for value in hidden:
        forms = {repr(value)} | ({value} if isinstance(value, str) and len(value) >= MIN_BARE else set())
        for form in forms:
            line = re.sub(rf"(?<![\w.]){re.escape(form)}(?![\w.])", REDACTED, line)
    return line


def _trim(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + REDACTED


def settle_statement(task: Task, before: Sequence[TestReport], modules: Mapping[str, ast.Module]) -> Task:
    """A validated task's statement and its record: a mined task's gets the observed section (``with_observed``),
    every task's is checked for what its fail-to-pass tests require (``underspecified.missing``; ``modules``: the
    test modules' trees with the test patch applied)."""
    if task.source.kind in MINED:
        judged = task.validation.host_judged
        task = with_observed(task, before, judged.recorded.values() if judged else ())
    exceptions, literals = missing(task.problem_statement, modules, task.fail_to_pass, task.gold_patch)
    record = task.statement or StatementRecord(parts=[StatementPart(source="author", start=0,
                                                                    end=len(task.problem_statement))])  # fmt: skip
    marked = record.model_copy(update={"missing_exceptions": exceptions, "missing_literals": literals})
    return task.model_copy(update={"statement": marked})
