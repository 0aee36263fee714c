"""Statements an agent can act on (issue #45): a mined task's statement gains what validation saw fail before the fix,
never the fix; a task whose tests require what the statement never states is marked underspecified (and dropped when
the gate enforces it); a test module that does not import before the fix counts as one fail-to-pass unit."""

from __future__ import annotations

import pytest
from rich.console import Console
from test_validate import _task_from

from trialforge import pyast
from trialforge.funnel import Funnel
from trialforge.observe.metrics import task_metrics
from trialforge.observe.summary import print_tasks
from trialforge.quality.gate import run_quality_gate
from trialforge.quality.settings import QualityConfig
from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.observed import HEADING, observed_section, with_observed
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.statement_record import StatementRecord
from trialforge.tasks.statements import changed_lines, leaks
from trialforge.tasks.underspecified import missing
from trialforge.tasks.validate import ValidateConfig, _judge, record_verdicts, validate_task
from trialforge.testrun.report import TestReport as Report  # not "Test*": pytest would collect it
from trialforge.verify.grader import Grader

LOOKUP = "def find(table, key):\n    for k, v in table:\n        if k == key:\n            return v\n"
WRONG_TYPE = LOOKUP + "    raise ValueError(f'no {key!r} here')\n"  # a type pytest.raises(LookupError) lets through
SILENT = LOOKUP + "    return None\n"  # pytest says DID NOT RAISE <class 'LookupError'>
RIGHT = LOOKUP + "    raise LookupError(key)\n"
FIND_TESTS = (
    "import pytest\n\nfrom store import find\n\n\ndef test_found():\n    assert find([('a', 1)], 'a') == 1\n\n\n"
    "def test_missing_key():\n    with pytest.raises(LookupError):\n        find([('a', 1)], 'b')\n"
)
# The author's message names no exception: only the observed behaviour can.
MESSAGE = (
    "find: fail properly on a missing key\n\n"
    "Looking up a key the table does not hold must fail the way callers expect for missing keys.\n"
)
DOUBLE = "def double(x):\n    return x + x\n"
PIPELINE = DOUBLE + "\n\ndef pipeline(steps, x):\n    for step in steps:\n        x = step(x)\n    return x\n"
DOUBLE_TESTS = "from calc import double\n\n\ndef test_double():\n    assert double(2) == 4\n"
PIPELINE_TESTS = (  # 13 tests in a module that does not import before the fix
    "import pytest\n\nfrom calc import double, pipeline\n\n\n"
    "@pytest.mark.parametrize('x', range(12))\n"
    "def test_doubles_twice(x):\n    assert pipeline([double, double], x) == 4 * x\n"
    "\n\ndef test_no_steps():\n    assert pipeline([], 3) == 3\n"
)


def _mined(task, statement: str):
    return task.model_copy(update={"source": Source(kind="git", ref="0" * 40), "problem_statement": statement})


def _bare(**fields) -> Task:
    return Task(task_id="t", source=Source(kind="git", ref="0" * 40), repo="r", problem_statement=MESSAGE,
                gold_patch="", test_patch="", **fields)  # fmt: skip


@pytest.fixture(scope="module")
def validated(tmp_path_factory, bwrap_backend, base_image):
    """Three mined tasks validated on bwrap (one run per tree): the statement never names LookupError, and the unfixed
    code raises ValueError / returns None; a test module that imports what the fix adds."""
    root = tmp_path_factory.mktemp("statements")
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    trees = {
        "wrong_type": ({"store.py": WRONG_TYPE}, {"store.py": RIGHT, "tests/test_find.py": FIND_TESTS}, MESSAGE),
        "silent": ({"store.py": SILENT}, {"store.py": RIGHT, "tests/test_find.py": FIND_TESTS}, MESSAGE),
        "module": (
            {"calc.py": DOUBLE, "tests/test_double.py": DOUBLE_TESTS},
            {"calc.py": PIPELINE, "tests/test_double.py": DOUBLE_TESTS, "tests/test_pipeline.py": PIPELINE_TESTS},
            "Write pipeline function, with tests\n\nSteps applied in order to a value.\n",
        ),
    }
    found = {}
    for name, (base, fixed, message) in trees.items():
        task = _mined(_task_from(root / name, snapshots, base, fixed), message).model_copy(update={"task_id": name})
        found[name] = validate_task(task, bwrap_backend, base_image.name, snapshots, Limits(), ValidateConfig(runs=1))
        assert found[name].validation.valid, found[name].validation.reason
    grader = Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits(), test_timeout_s=60)
    return found, grader, snapshots


@pytest.mark.sandbox
def test_an_exception_the_statement_never_names_marks_the_task_underspecified(validated):
    tasks, _, _ = validated
    task = tasks["wrong_type"]
    assert task.fail_to_pass == ["tests/test_find.py::test_missing_key"]
    author, observed = task.statement.parts
    assert task.problem_statement[author.start : author.end] == MESSAGE  # the author's text, as it was
    assert task.problem_statement[observed.start :].startswith(HEADING)
    assert "`tests/test_find.py::test_missing_key` fails: ValueError: no 'b' here" in task.problem_statement
    assert task.statement.missing_exceptions == ["LookupError"] and task.statement.underspecified


@pytest.mark.sandbox
def test_an_exception_the_observed_behaviour_names_is_specified(validated):
    tasks, _, _ = validated
    task = tasks["silent"]
    assert "DID NOT RAISE <class 'LookupError'>" in task.problem_statement
    assert task.statement.missing_exceptions == [] and not task.statement.underspecified


@pytest.mark.sandbox
def test_a_module_that_does_not_import_before_the_fix_is_one_unit_stated_once(validated):
    tasks, _, _ = validated
    task = tasks["module"]
    assert len(task.fail_to_pass) == 13  # all still graded: each must pass with the fix
    assert task.validation.fail_to_pass_modules_not_importing == ["tests/test_pipeline.py"]
    assert task.validation.fail_to_pass_units == 1
    assert "- `tests/test_pipeline.py` does not import: ImportError: cannot import name 'pipeline'" in (
        task.problem_statement
    )
    assert "test_pipeline.py::" not in task.problem_statement  # not its 13 tests one by one


@pytest.mark.sandbox
def test_no_statement_shows_the_fix_and_the_leak_gate_passes_them(validated):
    """With underspecified enforced, the one task that needs a guess is dropped for it, before any verifier run."""
    tasks, grader, snapshots = validated
    for task in tasks.values():
        assert leaks(task.problem_statement, changed_lines(task.gold_patch)) == [], task.problem_statement
    both = ["leaks", "underspecified"]
    cfg = QualityConfig(gates=both, enforce=both, require_host_judged=False)  # (pytest.raises is judged in process)
    kept, records, funnel = run_quality_gate(list(tasks.values()), grader, snapshots, cfg)
    assert [t.task_id for t in kept] == ["silent", "module"]
    assert all(r.leaks == [] and r.verifier_runs == 0 for r in records.values())
    assert records["wrong_type"].failed_gates == ["underspecified"]
    assert records["wrong_type"].underspecified == ["LookupError"]
    assert funnel.dropped == {"underspecified": 1}
    reported = run_quality_gate(list(tasks.values()), grader, snapshots, cfg.model_copy(update={"enforce": ["leaks"]}))
    assert len(reported[0]) == 3 and reported[1]["wrong_type"].failed_gates == ["underspecified"]  # marked, kept
    validation = Funnel("validate")
    record_verdicts(list(tasks.values()), validation)
    assert validation.noted == {"underspecified": 1}


@pytest.mark.sandbox
def test_a_literal_the_host_judges_is_hidden_from_the_statement(tmp_path, bwrap_backend, base_image):
    """``assert triple(7) == 21``: grading keeps 21 out of the sandbox, so the statement must not show it either (it
    did until 2026-12-07: only recorded expectations were hidden, not literals)."""
    snapshots = SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")
    tests = ("from calc import describe, triple\n\n\ndef test_triple():\n    assert triple(7) == 21\n\n\n"
             "def test_describe():\n    assert describe() == 'three rows'\n")  # fmt: skip
    code = "def triple(x):\n    return x * {}\n\n\ndef describe():\n    return {!r}\n"
    fixed = {"calc.py": code.format(3, "three rows"), "tests/test_triple.py": tests}
    task = _mined(_task_from(tmp_path / "t", snapshots, {"calc.py": code.format(2, "old text")}, fixed),
                  "Triple is off.\n")  # fmt: skip
    task = validate_task(task, bwrap_backend, base_image.name, snapshots, Limits(), ValidateConfig(runs=1))
    assert task.validation.valid and task.validation.host_judged.fail_to_pass_anchored == 2
    # what the code under test computed, with the call that computed it: where an agent starts, not the answer
    line = "- `tests/test_triple.py::test_triple` fails: assert 14 == … (`triple(7)` was `14`)"
    assert line in task.problem_statement
    assert "21" not in task.problem_statement
    # a string the fix itself writes is the specification (no fix without it): stated, and the task is not
    # underspecified for it
    assert "fails: AssertionError: assert 'old text' == 'three rows'" in task.problem_statement
    assert task.statement.missing_literals == []


# --- pure: what the check reads, what the section shows --------------------------------------------------------

TESTS = """
import pytest
import unittest


def test_either():
    with pytest.raises((KeyError, IndexError)):
        pick()


def test_lookup():
    with pytest.raises(LookupError, match="no such row"):
        pick()


def test_message():
    assert describe() == "three rows"
    assert describe() != "old text"


class TestCase(unittest.TestCase):
    def test_value(self):
        self.assertRaises(ValueError, pick)
        self.assertEqual(describe(), "three rows")
"""
FIX = '+    raise LookupError("no such row")\n+    return "three rows"\n-    return "old text"\n'


@pytest.mark.pure
@pytest.mark.parametrize(
    ("statement", "exceptions", "literals"),
    [
        ("pick fails", ["KeyError | IndexError", "LookupError", "ValueError"], ["no such row", "three rows"]),
        # a builtin subclass named satisfies its base; either type of a tuple; quoted literals
        ("pick raises KeyError: 'no such row'; ValueError; describe: 'three rows'", [], []),
    ],
)
def test_what_the_tests_require_and_the_statement_never_states(statement, exceptions, literals):
    module = pyast.parse(TESTS)
    tests = ["t.py::test_either", "t.py::test_lookup", "t.py::test_message", "t.py::TestCase::test_value"]
    assert missing(statement, {"t.py": module}, tests, FIX) == (exceptions, literals)
    # a literal the fix does not add ("old text" is removed) is the code's to show; a test not fail-to-pass is not read
    assert missing("", {"t.py": module}, ["t.py::test_message"], FIX) == ([], ["three rows"])


@pytest.mark.pure
def test_the_section_hides_judged_values_and_fix_lines_and_caps_the_tests():
    failures = {"t.py::test_a": "assert 3 == 4", "t.py::test_b": "NameError: x = 1",
                "t.py::test_c[0]": "assert 3.0 == 4.0", "t.py::test_c[1]": "AssertionError: 'abc...xyz' != 'abc'",
                "t.py::test_c[2]": "assert 3.0 == 4.0"}  # fmt: skip
    f2p = ["t.py::test_a", "t.py::test_b", "t.py::test_d[7-4071]", *(f"t.py::test_c[{i}]" for i in range(11))]
    hidden = {
        "t.py::test_a": [4],
        "t.py::test_c[0]": [4],
        "t.py::test_c[1]": ["abcdefxyz"],
        "t.py::test_d[7-4071]": [4071],
    }
    section = observed_section(f2p, [Report(exit_code=1, failures=failures)], [], hidden=hidden, fix="+x = 1\n")
    assert "- `t.py::test_a` fails: assert 3 == …" in section  # the host's expected value stays off the statement
    assert "- `t.py::test_b` fails\n" in section and "x = 1" not in section  # its line shows the fix's line
    # an assertion's line that shows none of the test's judged values as written (4.0 for 4, a shortened string)
    # may show them otherwise: withheld; a test the host judges by no value keeps its line
    assert "- `t.py::test_c[0]` fails\n" in section and "- `t.py::test_c[1]` fails\n" in section
    assert "- `t.py::test_c[2]` fails: assert 3.0 == 4.0" in section
    assert "- `t.py::test_c[5]` fails\n" in section and "- ... and 4 more failing tests" in section
    # an id that spells a judged value spells it no more, unless the value is too common to tell (4: test_c[4])
    assert "- `t.py::test_d[7-…]` fails\n" in section and "- `t.py::test_c[4]` fails\n" in section


@pytest.mark.pure
def test_a_second_validation_rewrites_the_section_from_the_authors_text():
    task = _bare(fail_to_pass=["tests/t.py::test_a"])
    once = with_observed(task, [Report(exit_code=1, failures={"tests/t.py::test_a": "KeyError: 'a'"})])
    twice = with_observed(once, [Report(exit_code=1, failures={"tests/t.py::test_a": "KeyError: 'b'"})])
    assert twice.problem_statement == f"{MESSAGE}\n{HEADING}\n- `tests/t.py::test_a` fails: KeyError: 'b'\n"
    assert twice.statement.author_text(twice.problem_statement) == MESSAGE


@pytest.mark.pure
def test_a_module_that_imports_only_with_the_fix_counts_once():
    mod = "tests/test_p.py"
    before = [Report(exit_code=2, outcomes={"<collection>:" + mod: "error", "tests/test_q.py::test_q": "failed"},
                     collection_errors={mod: "ImportError: cannot import name 'p'"})]  # fmt: skip
    after = [Report(exit_code=0, outcomes={**{f"{mod}::test_{i}": "passed" for i in range(48)},
                                           "tests/test_q.py::test_q": "passed"})]  # fmt: skip
    task = _judge(_bare(), before, after, 0.0, [mod])
    assert task.validation.valid, task.validation.reason
    assert len(task.fail_to_pass) == 49
    assert task.validation.fail_to_pass_modules_not_importing == [mod]
    assert task.validation.fail_to_pass_units == 2


@pytest.mark.pure
def test_the_funnel_print_shows_how_many_tasks_are_marked():
    funnel = Funnel("validate")
    record_verdicts([_bare(statement=StatementRecord(missing_exceptions=["LookupError"]))], funnel)
    console = Console(record=True, width=120)
    print_tasks(task_metrics([funnel.as_dict()]), console)
    assert "validate noted: underspecified: 1" in console.export_text()
