"""The statement's second half: what validation saw fail before the fix, stated as observed behaviour.

A mined commit's message says what its author changed, a synthesized task's statement which hidden tests fail; an
agent also needs what goes wrong. After validation, the statement is the text the task came with (the commit message,
the linked issue, the synthesized report) plus an "Observed behaviour" section
from the runs before the fix: the fail-to-pass tests (a sample) and, per test, its failure's exception line as the
run printed it (``KeyError: 'a'``, ``assert 3 == 4``, ``DID NOT RAISE <class 'LookupError'>``). A test module
that did not import before the fix is one line with its import error, not its tests one by one. Never shown: a
line of the fix's diff, and a value the host judges the fail-to-pass tests by (``calibration.judged_values``: a
literal expected side, a recorded expectation, a ``match=`` pattern; grading keeps them out of the sandbox, and a
statement would hand them back to it), unless the fix itself writes it (a message: the specification).
``Task.statement`` records which part came from where.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from trialforge.tasks.calibration import judged_values, observed_actuals
from trialforge.tasks.schema import Task
from trialforge.tasks.statement_record import StatementPart, StatementRecord
from trialforge.tasks.statements import changed_lines, leaks
from trialforge.tasks.underspecified import introduces, missing
from trialforge.tasks.visible import distinctive
from trialforge.testrun.blinding import FileAnalysis
from trialforge.testrun.report import TestReport

HEADING = "Observed behaviour (the test suite, run before the fix):"
MAX_TESTS = 10  # fail-to-pass tests named, each with its failure
MAX_MODULES = 5  # modules that do not import, each with its error
MAX_LINE = 200
REDACTED = "…"
# Sources whose statement gets the section: a mined commit's author text says what changed, not what goes wrong; a
# synthesized task's says which hidden tests fail (``tasks.statements``); the section adds how, judged values hidden.
OBSERVED_SOURCES = ("git", "github", "jira", "synthetic")
_ASSERTION = re.compile(r"(?:AssertionError\b|assert )")  # a failed assertion's line: it may print the expected value
MIN_BARE = 3  # a judged string this long is hidden unquoted too (``ValueError: abc`` shows it bare)


def observed_section(
    fail_to_pass: Sequence[str],
    before: Sequence[TestReport],
    modules: Collection[str],
    hidden: Mapping[str, Collection[object]] | None = None,
    fix: str = "",
    actuals: Mapping[str, tuple[str, object]] | None = None,
) -> str:
    """The section for ``fail_to_pass`` from the ``before`` runs; ``modules``: the fail-to-pass modules that did not
    import, stated once each; ``hidden``: each test's values never to show; ``fix``: the gold patch (no line of it is
    shown); ``actuals``: each test's failing comparison's actual side and its value (``observed_actuals``)."""
    secret = changed_lines(fix)
    hidden = hidden or {}
    every = [v for values in hidden.values() for v in values]

    def shown(message: str | None, own: Collection[object]) -> str:
        """``message`` as the section may show it: every judged value hidden (another test's too: a helper's
        ``ValueError: got 8736, want 8864``), none if it shows a line of the fix, and an assertion's line withheld
        when its test has judged values and none of them was found in it (pytest may have printed the expected value
        in another form: ``21.0``, a shortened ``'abc...xyz'``)."""
        message = message or ""
        text = _redact(message, every)
        if own and _ASSERTION.match(message) and (_redact(message, own) == message or "..." in text):
            return ""
        text = _trim(text)
        return f": {text}" if text and not leaks(text, secret) else ""

    def computed(test: str) -> str:
        """`` (`ledger.balance('Cash')` was `Decimal('0.00')`)``: what the code under test computed, which names the
        call an agent can start from; nothing if it would show a judged value or a line of the fix."""
        if test not in (actuals or {}):
            return ""
        expression, value = (actuals or {})[test]
        text = _trim(f" (`{expression}` was `{value!r}`)")
        return "" if REDACTED in _redact(text, every) or leaks(text, secret) else text

    errors = {m: e for r in before for m, e in r.collection_errors.items() if m in modules}
    said = {t: m for r in reversed(before) for t, m in r.failures.items()}  # the first run's line wins
    lines = [f"- `{m}` does not import{shown(errors.get(m), every)}" for m in sorted(modules)[:MAX_MODULES]]
    if len(modules) > MAX_MODULES:
        lines.append(f"- ... and {len(modules) - MAX_MODULES} more modules that do not import")
    tests = [t for t in fail_to_pass if t.split("::", 1)[0] not in modules]
    # a test's id or name may spell a value it expects (``test_mask[8700-8764]``, ``test_of_7900_is_7964``)
    lines += [f"- `{redact_names(t, every)}` fails{shown(said.get(t), hidden.get(t, ()))}{computed(t)}"
              for t in tests[:MAX_TESTS]]  # fmt: skip
    if len(tests) > MAX_TESTS:
        lines.append(f"- ... and {len(tests) - MAX_TESTS} more failing tests")
    return "\n".join([HEADING, *lines]) + "\n"


def with_observed(
    task: Task,
    before: Sequence[TestReport],
    hidden: Mapping[str, Collection[object]] | None = None,
    actuals: Mapping[str, tuple[str, object]] | None = None,
) -> Task:
    """``task`` with its statement rewritten: the author's text (kept from a former validation's record) and the
    observed section; ``Task.statement`` says which is which."""
    author = task.statement.author_text(task.problem_statement) if task.statement else task.problem_statement
    author = author.rstrip() + "\n"
    modules = task.validation.fail_to_pass_modules_not_importing
    section = observed_section(task.fail_to_pass, before, modules, hidden, task.gold_patch, actuals)
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


def redact_names(text: str, hidden: Collection[object]) -> str:
    """``text`` (test ids, names) with every distinctive judged value as a test id spells it (a number's digits, a
    string bare) hidden: ``_`` and ``-`` separate words in a name, so a value between them is still a value."""
    for value in (v for v in hidden if distinctive(v)):  # not ``2`` of "2 tests fail", nor every ``0`` of an id
        form = str(value) if isinstance(value, (int, float, str)) else repr(value)
        text = re.sub(rf"(?<![A-Za-z0-9.]){re.escape(form)}(?![A-Za-z0-9])", REDACTED, text)
    return text


def _redacted_part(task: Task, hidden: Collection[object]) -> Task:
    """A synthesized task's statement with the judged values hidden from its first part too (trialforge wrote it from
    the hidden tests: their ids, what they showed); the record's parts follow the new text."""
    assert task.statement is not None
    author, observed = task.statement.parts
    telling = [v for v in hidden if distinctive(v)]
    first = redact_names(_redact(task.problem_statement[: author.end], telling), telling)
    text = first + task.problem_statement[author.end :]
    shift = len(first) - author.end
    parts = [author.model_copy(update={"end": len(first)}),
             observed.model_copy(update={"start": observed.start + shift, "end": observed.end + shift})]  # fmt: skip
    return task.model_copy(update={"problem_statement": text, "statement": StatementRecord(parts=parts)})


def _trim(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + REDACTED


def settle_statement(task: Task, before: Sequence[TestReport], analyses: Mapping[str, FileAnalysis]) -> Task:
    """A validated task's statement and its record: a mined or synthesized task's gets the observed section
    (``with_observed``), every value the host judges its fail-to-pass tests by hidden (``judged_values``); every
    task's is checked for what its fail-to-pass tests require (``underspecified.missing``; ``analyses``: the test
    modules with the test patch applied)."""
    if task.source.kind in OBSERVED_SOURCES:
        judged = task.validation.host_judged
        values = judged_values(analyses, task.fail_to_pass, judged) if judged else {}
        # a string the fix itself writes (a message, a name) is the specification, not an answer to copy: the fix
        # cannot be written without it, so stating it gives nothing away
        hidden = {t: [v for v in vs if not (isinstance(v, str) and introduces(task.gold_patch, v))]
                  for t, vs in values.items()}  # fmt: skip
        actuals = observed_actuals(analyses, task.fail_to_pass, judged, before) if judged else {}
        task = with_observed(task, before, hidden, actuals)
        if task.source.kind == "synthetic":  # its first part is ours, written from the hidden tests: redacted too
            task = _redacted_part(task, [v for vs in hidden.values() for v in vs])
    modules = {rel: analysis.module for rel, analysis in analyses.items()}
    exceptions, literals = missing(task.problem_statement, modules, task.fail_to_pass, task.gold_patch)
    record = task.statement or StatementRecord(parts=[StatementPart(source="author", start=0,
                                                                    end=len(task.problem_statement))])  # fmt: skip
    marked = record.model_copy(update={"missing_exceptions": exceptions, "missing_literals": literals})
    return task.model_copy(update={"statement": marked})
