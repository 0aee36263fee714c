"""Blinded tests on the host: which assertions become slots, what the sandbox's file keeps, how the host judges.

Pure tests (no sandbox): the rewrite and the host's checks. The sandbox side (the recorder's observers, a graded
run, calibration at validation) is in test_host_judged.py.
"""

from __future__ import annotations

import ast
import decimal
import math
import random
import textwrap

import pytest

from trialforge.tasks.calibration import calibrate
from trialforge.testrun.blinding import analyse, blind, close_demotions, importable_test_modules, instrument
from trialforge.testrun.expected import OPAQUE, Check, NotConstant, Raised, Scope, Structure, decode, evaluate
from trialforge.testrun.report import TestReport as Report  # not "Test*": pytest would collect it
from trialforge.testrun.report import _host_verdict

pytestmark = pytest.mark.pure

REL = "tests/test_calc.py"
SOURCE = textwrap.dedent(
    '''\
    """Module docstring: the answer is 917."""
    import datetime as dt
    from decimal import Decimal

    import pytest

    from calc import Ledger, add, parse

    TOTAL = 5512  # used only as an expected value: it leaves with the slots
    SEED = 77  # an input too: its slot stays in process

    def helper(x):
        assert x == 3  # a helper's assertion is never a slot

    def test_compare():
        """The expected values 4411 and 0.8125 never reach the sandbox."""
        assert add(2, 3) == 4411  # a comment saying 4411
        assert 0.8125 == add(0.5, 0.25)
        assert "kiwi" in parse("a fruit")
        assert add(1, 1) is None
        assert add(3, 4) == TOTAL
        assert add(SEED, 1) == SEED

    def test_constructors():
        assert parse("x") == Decimal("10.50")
        assert parse("d") == dt.date(2024, 1, 31)
        assert parse("f") == pytest.approx(0.3, abs=1e-3)

    def test_truth_and_classes():
        assert parse("t")
        assert not parse("f")
        assert isinstance(parse("v"), (int, float))

    def test_raises():
        with pytest.raises(ValueError, match="bad input 7"):
            parse("!")
        pytest.raises(KeyError, parse, "?")

    def test_relations_stay_in_process():
        ledger = Ledger()
        assert ledger.total() == ledger.total()
        for value in (1, 2):
            assert add(value, 0) == value
        assert add(1, 2) > 0 and add(2, 1) > 0

    def test_recorded():
        assert parse("l") == Ledger(items=[1, 2])

    @pytest.mark.parametrize(("text", "expected"), [("one", 1001), ("two", 2002)])
    def test_rows(text, expected):
        assert parse(text) == expected

    def test_not_graded():
        assert add(9, 9) == 8888
    '''
)


@pytest.fixture
def analysis():
    found = analyse(SOURCE, REL)
    assert found is not None
    return found


def _slots(analysis, qual):
    return [(s.kind, s.op, s.recorded) for s in analysis.tests[qual].slots]


def test_assertions_the_host_can_evaluate_become_slots_and_relations_stay_in_process(analysis) -> None:
    assert _slots(analysis, "test_compare") == [
        ("compare", "==", False),
        ("compare", "==", False),
        ("compare", "in", False),
        ("compare", "is", False),
        ("compare", "==", False),
    ]  # fmt: skip  (add(SEED, 1) == SEED: SEED is also an input, so its value would stay behind)
    assert [s.kind for s in analysis.tests["test_truth_and_classes"].slots] == ["truth", "truth", "isinstance"]
    assert [s.kind for s in analysis.tests["test_raises"].slots] == ["raises", "raises"]
    assert analysis.tests["test_relations_stay_in_process"].slots == []
    assert analysis.tests["test_relations_stay_in_process"].assertions == 3
    assert _slots(analysis, "test_recorded") == [("compare", "==", True)]
    assert len(analysis.tests["test_rows"].slots) == 1
    assert analysis.tests["test_rows"].parametrize.columns == {"expected"}


def test_a_graded_file_keeps_no_expected_value_comment_docstring_or_test_name(analysis) -> None:
    graded = [f"{REL}::test_compare", f"{REL}::test_constructors", f"{REL}::test_raises", f"{REL}::test_rows[one-1001]",
              f"{REL}::test_rows[two-2002]", f"{REL}::test_recorded"]  # fmt: skip
    recorded = {f"{REL}::test_recorded#0": ["u", "calc.Ledger", [["items", ["l", []]]], False]}
    rows = {graded[3]: 0, graded[4]: 1}
    text, blinding = blind(analysis, graded, param_rows=rows, rng=random.Random(1), recorded=recorded)
    for secret in ("4411", "0.8125", "kiwi", "5512", "10.50", "2024", "bad input 7", "KeyError", "ValueError", "917",
                   "1001", "2002", "Ledger(items", "test_compare", "test_rows", "test_not_graded", "8888"):  # fmt: skip
        assert secret not in text, secret
    assert "77" in text  # SEED is an input: it stays, and so does the slot reading it (in process)
    module = ast.parse(text)
    assert ast.get_docstring(module) is None
    assert set(blinding.original.values()) == set(graded)
    # every observation that replaced an assertion has its checks on the host: a blinded test never passes unchecked
    functions = [f for f in module.body if isinstance(f, ast.FunctionDef)]
    observing = {
        f.name for f in functions if any(isinstance(n, ast.Name) and n.id.startswith("__tf_") for n in ast.walk(f))
    }
    checked = {sandbox_id.split("::")[1].split("[")[0] for sandbox_id in blinding.checks}
    assert observing == checked and len(observing) == 5, (observing, checked)
    assert len(blinding.checks[blinding.sandbox_ids([graded[0]])[0]]) == 5
    ids = [blinding.sandbox_ids([g])[0] for g in graded[3:5]]
    assert [c.expected for _, c in blinding.checks[ids[0]]] == [1001]
    assert [c.expected for _, c in blinding.checks[ids[1]]] == [2002]
    assert all("[" in r and "1001" not in r for r in ids)  # opaque ids: pytest's would spell the values


def test_a_graded_file_keeps_every_line_at_its_number(analysis) -> None:
    # code sees where it stands (typeguard: `warning.lineno == test.__code__.co_firstlineno + 3`): lines the rewrite
    # does not touch keep their number and text, and an observed actual side keeps its line
    graded = [f"{REL}::test_compare", f"{REL}::test_raises", f"{REL}::test_rows[one-1001]", f"{REL}::test_recorded"]
    text, _ = blind(analysis, graded, param_rows={graded[2]: 0}, rng=random.Random(5), recorded={})
    before, after = SOURCE.splitlines(), text.splitlines()
    assert len(after) == len(before)
    kept = [
        n for n, line in enumerate(before) if line.strip() in ("def helper(x):", "from calc import Ledger, add, parse")
    ]
    assert kept and all(after[n] == before[n] for n in kept)
    for n, line in enumerate(before):
        if "add(0.5, 0.25)" in line:  # a reflected slot: the expected side goes, the actual stays on its line
            assert "add(0.5, 0.25)" in after[n] and "0.8125" not in after[n]
    module = ast.parse(text)
    assert {f.lineno for f in module.body if isinstance(f, ast.FunctionDef)} <= {
        f.lineno for f in analysis.module.body if isinstance(f, ast.FunctionDef)
    }


def test_a_test_ending_in_a_block_with_no_blank_line_below_gets_its_end_on_a_line_of_its_own() -> None:
    # the one edit that adds a line: the tests below it still lose their expected values
    source = (
        "from kit import f\nclass TestX:\n    def test_a(self):\n        assert f(1) == 2\n        for i in range(2):\n"
        "            f(i)\n    def test_b(self):\n        expected = 91234\n        assert f(3) == expected\n"
    )
    found = analyse(source, REL)
    assert found is not None
    text, _ = blind(found, [f"{REL}::TestX::test_a", f"{REL}::TestX::test_b"], rng=random.Random(6))
    assert "91234" not in text and "== 2" not in text
    assert len(text.splitlines()) == len(source.splitlines()) + 1
    ends = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name) and n.id == "__tf_end__"]
    assert len(ends) == 2


def test_a_parametrized_test_whose_rows_validation_did_not_record_keeps_its_expected_column(analysis) -> None:
    text, blinding = blind(analysis, [f"{REL}::test_rows[one-1001]"], rng=random.Random(2))
    assert "1001" in text and not blinding.checks  # nothing blinded in it: judged in process, not unchecked


def test_slots_validation_kept_in_process_stay_as_written(analysis) -> None:
    key = f"{REL}::test_constructors#1"
    text, blinding = blind(analysis, [f"{REL}::test_constructors"], in_process=[key], rng=random.Random(3))
    assert "2024" in text and "10.50" not in text
    [(_, checks)] = blinding.checks.items()
    assert [index for index, _ in checks] == [0, 2]


def test_a_demoted_slot_keeps_every_slot_reading_the_same_constant_in_process() -> None:
    source = (
        "from calc import f\nWANT = 42\n\n"
        "def test_a():\n    assert f(1) == WANT\n\ndef test_b():\n    assert f(2) == WANT\n"
    )
    found = analyse(source, REL)
    assert found is not None
    assert close_demotions(found, {f"{REL}::test_a#0"}) == {f"{REL}::test_a#0", f"{REL}::test_b#0"}


def test_the_instrumented_file_runs_each_test_as_written(analysis) -> None:
    text = instrument(analysis)
    assert text is not None
    assert "assert __tf_observe__(0, add(2, 3)) == 4411" in text
    assert 'with pytest.raises(ValueError, match="bad input 7"), __tf_raises__(0, False):' in text
    assert "assert __tf_observe__(0, parse('l')) == __tf_expect__(0, Ledger(items=[1, 2]))" in text.replace('"', "'")
    assert len(text.splitlines()) == len(SOURCE.splitlines())  # line numbers of failures still point at the test


def test_a_decorator_that_may_run_the_test_many_times_makes_no_slots() -> None:
    source = "from hypothesis import given\nfrom calc import f\n\n@given(1)\ndef test_h(x):\n    assert f(x) == 3\n"
    assert analyse(source, REL).tests["test_h"].slots == []


def test_a_class_marked_with_fixtures_keeps_its_slots_and_a_class_wide_parametrize_or_wrapper_has_none() -> None:
    # arrow marks most of its test classes ``@pytest.mark.usefixtures(...)``: they were left wholly in process
    head = "import pytest\nfrom unittest import mock\nfrom calc import f\n\n"
    body = "class TestF:\n    def test_f(self):\n        assert f(2) == 'two'\n"
    marked = {
        "@pytest.mark.usefixtures('locale')\n": 1,
        "@pytest.mark.skipif(False, reason='no')\n@mock.patch('calc.g')\n": 1,
        "@pytest.mark.parametrize('x', [1, 2])\n": 0,  # each method runs once per row
        "@retry(3)\n": 0,  # may run each test many times
    }
    for decorators, slots in marked.items():
        tests = analyse(head + decorators + body, REL).tests
        assert len(tests["TestF::test_f"].slots if "TestF::test_f" in tests else []) == slots, decorators


def test_a_file_the_host_cannot_parse_is_left_alone() -> None:
    assert analyse("def test_x(:\n    pass\n", REL) is None


# --- evaluating expected sides --------------------------------------------------------------------------------


def _eval(text: str, **imports: str) -> object:
    return evaluate(ast.parse(text, mode="eval").body, Scope(imports))


def test_expected_sides_evaluate_from_syntax_and_refuse_what_is_not_constant() -> None:
    assert _eval("Decimal('1.50')", Decimal="decimal.Decimal") == decimal.Decimal("1.50")
    assert _eval("[1, -2.5, (None, 'x')] + [2 ** 10]") == [1, -2.5, (None, "x"), 1024]
    assert math.isinf(_eval("float('inf')"))
    for refused in (
        "open('x')",
        "f(1)",
        "x",
        "__import__('os')",
        "10 ** 10 ** 9",
        "'x' * 10 ** 9",
        "[*a]",
        "Decimal('1')",
    ):  # fmt: skip  (the last: Decimal not imported, so not the stdlib's)
        with pytest.raises(NotConstant):
            _eval(refused)


# --- the host's checks on decoded observations --------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "observed", "passes"),
    [
        (Check("compare", expected=1), ["f", (1.0).hex()], True),  # 1.0 == 1, as Python says
        (Check("compare", expected=1), ["b", 1], True),  # True == 1
        (Check("compare", expected="1"), ["i", "1"], False),
        (Check("compare", expected=float("nan")), ["f", "nan"], False),  # NaN equals nothing, as in Python
        (Check("compare", op="!=", expected=3), ["o", "calc.Weird"], False),  # opaque: never accepted, not even !=
        (Check("compare", expected={"a": [1, 2]}), ["d", [[["s", "a"], ["l", [["i", "1"], ["i", "2"]]]]]], True),
        (Check("compare", expected=decimal.Decimal("0.13")), ["D", "0.130"], True),
        (Check("compare", op="in", expected="kiwi", reflected=True), ["s", "a kiwi"], True),
        (Check("truth"), ["b", 1], True),
        (Check("truth", negated=True), ["b", 1], False),
        (
            Check("unittest", method="assertAlmostEqual", expected=(0.3,), options={"places": 3}),
            ["f", (0.30001).hex()],
            True,
        ),
        (
            Check("raises", classes=(("calc", "ParseError"),)),
            ["x", ["calc.errors.ParseError", "builtins.object"], None, []],
            True,
        ),
        (Check("raises", classes=(("calc", "ParseError"),)), ["x", ["evil.ParseError"], None, []], False),
        (
            Check("raises", classes=(("builtins", "ValueError"),), match="bad input \\d"),
            ["x", ["builtins.ValueError"], "builtins.BaseException", [["s", "bad input 7"]]],
            True,
        ),
        (
            Check("raises", classes=(("builtins", "ValueError"),), match="bad"),
            ["x", ["builtins.ValueError"], None, []],
            False,
        ),
        (Check("raises", classes=(("builtins", "ValueError"),)), ["none"], False),
        (Check("isinstance", classes=(("builtins", "int"),)), ["x", ["builtins.bool", "builtins.int"], None, []], True),
        (
            Check("compare", expected=Structure("calc.Ledger", (("items", (1,)),))),
            ["u", "calc.Ledger", [["items", ["t", [["i", "1"]]]]], False],
            True,
        ),
        (
            Check("compare", expected=Structure("calc.Ledger", (("items", (1,)),))),
            ["u", "evil.Ledger", [["items", ["t", [["i", "1"]]]]], False],
            False,
        ),
    ],
)
def test_the_host_judges_with_pythons_semantics_on_values_it_rebuilt(check: Check, observed, passes: bool) -> None:
    assert check.passes(observed) is passes


def test_a_malformed_or_hostile_observation_decodes_to_nothing_acceptable() -> None:
    deep: list = ["l", []]
    for _ in range(500):
        deep = ["l", [deep]]
    for encoded in (
        deep,
        ["i", "zz"],
        ["f", 3],
        ["d", [["s", "a"]]],
        "not a list",
        [],
        ["x", 1, 2],
        ["dt", "zi", ["../../etc/passwd"]],
    ):
        assert decode(encoded) is OPAQUE, encoded
    assert isinstance(decode(["x", ["builtins.KeyError"], "builtins.KeyError", [["s", "k"]]]), Raised)
    assert decode(["x", ["builtins.KeyError"], "builtins.KeyError", [["s", "k"]]]).message == "'k'"


def test_a_pattern_that_backtracks_forever_is_stopped_not_waited_for() -> None:
    check = Check("raises", classes=(("builtins", "ValueError"),), match="(a+)+$")
    observed = ["x", ["builtins.ValueError"], "builtins.BaseException", [["s", "a" * 40 + "!"]]]
    assert check.passes(observed) is False


@pytest.mark.parametrize(
    ("observed", "ended", "why"),
    [
        ([(0, ["i", "5"]), (1, ["i", "6"])], True, ""),
        ([(0, ["i", "5"])], True, "observations [0]"),  # one missing
        ([(0, ["i", "5"]), (1, ["i", "6"]), (1, ["i", "6"])], True, "observations [0, 1, 1]"),  # repeated
        ([(1, ["i", "6"]), (0, ["i", "5"])], True, "observations [1, 0]"),  # out of order
        ([(0, ["i", "5"]), (1, ["i", "7"])], True, "slot 1"),  # wrong
        ([(0, ["i", "5"]), (1, ["i", "6"])], False, "did not run to its end"),
    ],
)
def test_a_blinded_test_passes_only_with_every_slot_in_order_right_and_its_end(observed, ended, why) -> None:
    checks = ((0, Check("compare", expected=5)), (1, Check("compare", expected=6)))
    verdict = _host_verdict(checks, observed, ended)
    assert (verdict == "") if not why else why in verdict


def test_a_local_assigned_once_and_read_only_as_an_expected_side_leaves_with_it() -> None:
    source = (
        "from calc import Version, f\n\n"
        "def test_local():\n    expected = '3.5.0'\n    want = Version.parse('3.5.1')\n    seen = [1]\n"
        "    f(seen)\n    assert f(1) == expected\n    assert f(2) == want\n    assert seen == [1]\n"
    )
    found = analyse(source, REL)
    slots = found.tests["test_local"].slots
    assert [(s.kind, s.recorded) for s in slots] == [("compare", False), ("compare", True), ("compare", False)]
    recorded = {f"{REL}::test_local#1": ["u", "calc.Version", [], False]}
    text, blinding = blind(found, [f"{REL}::test_local"], recorded=recorded, rng=random.Random(4))
    assert "3.5.0" not in text and "3.5.1" not in text  # both definitions went with their only readers
    assert "seen = [1]" in text  # read as an input too: it stays, observed as the actual side
    [(_, checks)] = blinding.checks.items()
    expected = [c.expected for _, c in checks]
    assert expected[0] == "3.5.0" and expected[2] == [1]


@pytest.mark.parametrize(("value", "anchored"), [(["i", "2a"], 1), (["b", True], 0), (["n"], 0)])
def test_a_recorded_expectation_that_came_out_a_bool_or_none_is_no_anchor(value, anchored: int) -> None:
    """``door(1).opened == Door(1).opened`` reads like a value check, but the gold code made True of its expected side:
    a forger answers one of two. Calibration counts such a slot weak, whatever its form."""
    source = "from calc import Door, door\n\ndef test_door():\n    assert door(1).opened == Door(1).opened\n"
    found = analyse(source, REL)
    assert found is not None and [s.recorded for s in found.tests["test_door"].slots] == [True]
    test_id = f"{REL}::test_door"
    runs = [Report(0, {test_id: "passed"}, observations={test_id: [(0, value)]}, expectations={test_id: [(0, value)]})]
    record = calibrate({REL: found}, runs, [test_id], [], proof=runs, before=runs)  # the same value before the fix
    assert record.in_process == [] and record.fail_to_pass_host_judged == 1
    assert (record.fail_to_pass_anchored, record.weak) == (anchored, 1 - anchored)
    # computed otherwise before the fix, or never reached there: it runs the code the fix changes, so it stays in the
    # test (in process) rather than leave it as a recorded answer
    moved = [Report(1, {test_id: "failed"}, expectations={test_id: [(0, ["i", "2b"])]}), Report(1, {test_id: "failed"})]
    for before in ([moved[0]], [moved[1]]):
        record = calibrate({REL: found}, runs, [test_id], [], proof=runs, before=before)
        assert record.in_process == [f"{REL}::test_door#0"] and record.fail_to_pass_host_judged == 0


def test_a_local_a_nested_function_rebinds_stays_and_the_graded_file_compiles() -> None:
    """more-itertools: ``result = 0`` at a test's top, read by the assertion alone, counted a constant that leaves with
    its slot; but the nested ``consumer`` declares ``nonlocal result``, and the graded file failed to import
    (``no binding for nonlocal 'result'``: every test of the module failed, gold patches scored 0)."""
    source = textwrap.dedent(
        """\
        from unittest import TestCase

        from calc import run


        class TestRun(TestCase):
            def test_total(self):
                result = 0

                def consumer(xs):
                    nonlocal result
                    result += len(xs)

                items = run(consumer)
                items = list(items)
                self.assertEqual(result, len(items))
        """
    )
    found = analyse(source, REL, "unittest")
    assert found is not None
    recorded = {f"{REL}::TestRun::test_total#0": ["i", "3"]}  # what validation made of ``result``
    text, _ = blind(found, [f"{REL}::TestRun::test_total"], rng=random.Random(2), recorded=recorded)
    assert "result = 0" in text
    compile(text, REL, "exec")


def test_a_test_that_reads_its_own_file_records_nothing() -> None:
    """bottle: an upload of ``__file__`` compared with what was saved, and a file served from ``basename`` compared with
    the file read again. Validation's instrumented file and grading's blinded one differ, so a value recorded from
    the one is never the other's (gold patches scored 0): such slots stay in process; a constant check stays a slot."""
    source = textwrap.dedent(
        """\
        import os

        from calc import save, serve, size

        basename = os.path.basename(__file__)

        def test_save():
            upload = save(open(__file__, "rb"))
            again = save(open(__file__, "rb"))
            assert upload.read() == again.read()

        def test_serve():
            assert serve(basename) == serve(basename + "")
            assert size(3) == 9
        """
    )
    found = analyse(source, REL)
    assert found is not None
    assert found.tests["test_save"].slots == []
    assert [(s.kind, s.recorded) for s in found.tests["test_serve"].slots] == [("compare", False)]


GUARDED = textwrap.dedent(
    """\
    import pytest
    from freezegun import freeze_time

    from calc import naturaldelta, total


    @freeze_time("2010-02-02")
    @pytest.mark.parametrize(("delta", "expected"), [(90, "2 minutes"), ("NaN", "NaN"), (-3.5, "3 seconds")])
    def test_delta(delta, expected):
        assert naturaldelta(delta) == expected
        if not isinstance(delta, str) and delta > 0:
            assert naturaldelta(-delta) == expected
        else:
            assert naturaldelta(delta, strict=True) == expected


    def test_local_branch():
        found = total([1, 2])
        if found:
            assert total([3]) == 3771
    """
)


def test_an_if_the_host_decides_per_row_makes_slots_of_both_branches_due_by_row() -> None:
    """humanize: ``if not isinstance(test_input, str): assert naturaldelta(-test_input) == expected`` kept the whole
    test in process (the column stayed behind for the branch's assertion). The host decides such a test per row from
    the row's values, so each row's checks name the slots its run reaches, and a run that skips a due branch, or takes
    the other, misses a due observation. An ``if`` on what the code under test computed is not decided: in process."""
    found = analyse(GUARDED, REL)
    assert found is not None
    slots = found.tests["test_delta"].slots
    assert [len(s.guards) for s in slots] == [0, 1, 1]  # freeze_time calls the test once: its slots are kept
    assert found.tests["test_local_branch"].slots == []  # ``if found:`` reads a value the code computed
    ids = [f"{REL}::test_delta[90-2 minutes]", f"{REL}::test_delta[NaN-NaN]", f"{REL}::test_delta[-3.5-3 seconds]"]
    text, blinding = blind(found, ids, param_rows={t: i for i, t in enumerate(ids)}, rng=random.Random(5))
    assert "2 minutes" not in text and "3 seconds" not in text  # the expected column left with all three slots
    assert "isinstance(delta, str) and delta > 0" in text  # the branch itself stays: the sandbox runs it
    due = {blinding.original[s]: [i for i, _ in checks] for s, checks in blinding.checks.items()}
    assert due == {ids[0]: [0, 1], ids[1]: [0, 2], ids[2]: [0, 2]}
    checks = next(c for s, c in blinding.checks.items() if blinding.original[s] == ids[0])
    right = [(0, ["s", "2 minutes"]), (1, ["s", "2 minutes"])]
    assert _host_verdict(checks, right, True) == ""
    assert "where slots [0, 1] were due" in _host_verdict(checks, right[:1], True)  # the branch skipped
    assert "where slots [0, 1] were due" in _host_verdict(checks, [right[0], (2, right[1][1])], True)  # the other one


def test_a_guard_the_host_cannot_decide_for_every_row_keeps_its_branch_in_process() -> None:
    source = GUARDED.replace('("NaN", "NaN")', '(make("NaN"), "NaN")').replace(
        "from calc import", "from calc import make,"
    )
    found = analyse(source, REL)
    # a row whose ``delta`` the host cannot build: the branches' assertions stay as written, reading ``expected``, so
    # the column stays in the file and the first assertion, reading it too, stays in process with them
    assert found.tests["test_delta"].slots == []


def test_a_row_whose_branch_holds_no_slot_is_no_anchor() -> None:
    """A fail-to-pass row that reaches no slot (its branch is not taken) has nothing the host judges, however many
    slots its test has for other rows: counted in process, so the gate never trains on a row a forger passes free."""
    source = (
        "import pytest\nfrom calc import tally\n\n"
        "@pytest.mark.parametrize(('code', 'want'), [('ab', 122979), (7, 0)])\n"
        "def test_tally(code, want):\n    if isinstance(code, str):\n        assert tally(code) == want\n"
    )
    found = analyse(source, REL)
    ids = [f"{REL}::test_tally[ab-122979]", f"{REL}::test_tally[7-0]"]
    rows = {ids[0]: {"code": 0, "want": 0}, ids[1]: {"code": 1, "want": 1}}
    run = Report(0, dict.fromkeys(ids, "passed"), observations={ids[0]: [(0, ["i", "1e063"])]}, rows=rows)
    record = calibrate({REL: found}, [run], ids, [])
    assert record.in_process == [] and record.param_rows == {ids[0]: 0, ids[1]: 1}
    assert (record.fail_to_pass, record.fail_to_pass_host_judged, record.fail_to_pass_anchored) == (2, 1, 1)
    # observed where the host says the branch is not taken: the host's decision is not the run's, so in process
    wrong = Report(0, dict.fromkeys(ids, "passed"), observations={t: [(0, ["i", "1e063"])] for t in ids}, rows=rows)
    assert calibrate({REL: found}, [wrong], ids, []).in_process == [f"{REL}::test_tally#0"]


def test_a_recorded_expectation_never_reads_what_would_stay_in_the_sandbox() -> None:
    """The branches red team read four answers that outlived their expected sides: a constant of a test module, a
    file's contents, a helper ``def`` and a class of the test file. Such a side is no recorded expectation (the
    assertion stays in process); code of the package, the value modules of the standard library and constants built
    from them are, their definitions going with their last reader."""
    source = textwrap.dedent(
        """\
        import json
        from pathlib import Path

        from answers import ANSWER
        from calc import Point, f
        from decimal import Decimal

        EXPECTED = json.loads(Path("tests/expected.json").read_text())
        ORIGIN = Point(Decimal("0.5"), 0)


        def _want():
            return 7010


        class Want:
            VALUE = 7030


        def test_leaks():
            assert f(1) == ANSWER
            assert f(2) == EXPECTED["digest"]
            assert f(3) == _want()
            assert f(4) == Want.VALUE
            assert f(5) == json.loads(open("tests/expected.json").read())
            assert f(6) == Point(json.loads("[1]"), 2)


        def test_kept():
            assert f(7) == ORIGIN
            assert f(8) == Point(Decimal("1.5"), 2)
        """
    )
    modules = importable_test_modules(["tests/test_calc.py", "tests/answers.py"])
    assert {"answers", "tests.answers", "test_calc"} <= modules
    found = analyse(source, REL, test_modules=modules)
    slots = found.tests["test_leaks"].slots
    assert [ast.unparse(s.expected[0]) for s in slots] == ["Point(json.loads('[1]'), 2)"]  # a package class
    assert [s.recorded for s in found.tests["test_kept"].slots] == [True, True]
    text, _ = blind(found, [f"{REL}::test_kept"], recorded={f"{REL}::test_kept#{i}": ["n"] for i in (0, 1)})
    assert "ORIGIN" not in text and "0.5" not in text and "1.5" not in text


def test_an_elif_is_decided_for_the_rows_the_if_above_let_by() -> None:
    """``elif x > 0`` is asked only of rows that are not strings (``"ab" > 0`` would raise): the chain is decided."""
    source = (
        "import pytest\nfrom calc import kinds\n\n"
        "@pytest.mark.parametrize(('x', 'want'), [(21, 42), ('ab', 'abab'), (-7, -14)])\n"
        "def test_kinds(x, want):\n    if isinstance(x, str):\n        assert kinds(x) == want\n"
        "    elif x > 0:\n        assert kinds(x) == want\n    else:\n        assert kinds(x) == want\n"
    )
    found = analyse(source, REL)
    assert [len(s.guards) for s in found.tests["test_kinds"].slots] == [1, 2, 2]
    ids = [f"{REL}::test_kinds[21-42]", f"{REL}::test_kinds[ab-abab]", f"{REL}::test_kinds[-7--14]"]
    _, blinding = blind(found, ids, param_rows={t: i for i, t in enumerate(ids)}, rng=random.Random(6))
    due = {blinding.original[s]: [i for i, _ in checks] for s, checks in blinding.checks.items()}
    assert due == {ids[0]: [1], ids[1]: [0], ids[2]: [2]}
