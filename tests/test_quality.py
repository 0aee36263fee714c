"""The quality gate on hand-made tasks, graded by the real verifier in bubblewrap sandboxes.

Each task is a tiny repository: a base tree (the bug), a fixed tree (the gold patch is their diff) and
the tests the task adds. Every bad task fails exactly the gate built to catch it; the sound one passes all.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trialforge.quality.change import Change
from trialforge.quality.gate import run_quality_gate
from trialforge.quality.probe import Probe
from trialforge.quality.settings import QualityConfig
from trialforge.quality.shortcuts import PANEL
from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.host_judged import HostJudged
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.quality_record import LEAK_KINDS
from trialforge.tasks.schema import Source, Task, Validation
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.verify.grader import Grader
from trialforge.verify.settings import VerifyConfig

PRICING = '''"""Prices."""


def total(prices):
    return sum(prices)


def discount(price, percent):
    return price - price * percent / 100


def clamp(value, low, high):
    """``value`` limited to ``low..high``."""
    return max(low, min(value, high))
'''
BUGGY_DISCOUNT = PRICING.replace("price - price * percent / 100", "price - percent")
PERCENT_HELPER = PRICING.replace(
    "def discount(price, percent):\n    return price - price * percent / 100",
    "def _percent_of(amount, percent):\n    return amount * percent / 100\n\n\n"
    "def discount(price, percent):\n    return price - _percent_of(price, percent)",
)
DISCOUNT_TESTS = (
    "from shop.pricing import discount\n\n\n"
    "def test_discount_takes_a_share_of_the_price():\n"
    "    assert discount(10, 15) == 8.5\n"
    "    assert discount(200, 10) == 180\n"
)
EXISTING_TESTS = {
    "tests/test_total.py": "from shop.pricing import total\n\n\ndef test_total():\n    assert total([1]) == 1\n"
}


@pytest.fixture(scope="module")
def world(bwrap_backend, base_image, tmp_path_factory):
    root = tmp_path_factory.mktemp("quality")
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    grader = Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits(), test_timeout_s=60)
    return root, snapshots, grader


def make_task(world, name: str, base: dict[str, str], fixed: dict[str, str], tests: dict[str, str],
              statement: str, fail_to_pass: list[str], pass_to_pass: list[str] = ()) -> Task:  # fmt: skip
    """A task whose gold patch turns ``base`` into ``fixed`` and whose test patch adds ``tests``."""
    root, snapshots, _ = world
    trees = {kind: root / name / kind for kind in ("base", "fixed", "tested")}
    for kind, files in (("base", base), ("fixed", {**base, **fixed}), ("tested", {**base, **tests})):
        for rel, text in {"shop/__init__.py": "", **files}.items():
            (trees[kind] / rel).parent.mkdir(parents=True, exist_ok=True)
            (trees[kind] / rel).write_text(text)
    return Task(
        task_id=name,
        source=Source(kind="synthetic", ref="test"),
        repo="shop",
        snapshot=snapshots.put(trees["base"]),
        problem_statement=statement,
        gold_patch=diff_trees(trees["base"], trees["fixed"]),
        test_patch=diff_trees(trees["base"], trees["tested"]),
        fail_to_pass=fail_to_pass,
        pass_to_pass=list(pass_to_pass),
        # as validation leaves a task whose tests compare with constants (the gate reads it: host_judged)
        validation=Validation(
            host_judged=HostJudged(fail_to_pass=len(fail_to_pass), fail_to_pass_anchored=len(fail_to_pass))
        ),
    )


def gate(world, tasks: list[Task], concurrency: int = 1, **cfg):
    _, snapshots, grader = world
    every_leak = {"leak_kinds": list(LEAK_KINDS)}  # expected values too (params.yaml opts into them)
    return run_quality_gate(tasks, grader, snapshots, QualityConfig(**every_leak | cfg), concurrency=concurrency)


@pytest.mark.pure
def test_partial_hunks_apply_only_the_chosen_changes(tmp_path):
    """The building block of partial reverts: a two-hunk fix applied one hunk at a time."""
    base, fixed = tmp_path / "base", tmp_path / "fixed"
    for tree, text in ((base, PRICING.replace("sum(prices)", "sum(prices[1:])").replace("value, high", "value, low")),
                       (fixed, PRICING)):  # fmt: skip
        (tree / "shop").mkdir(parents=True)
        (tree / "shop" / "pricing.py").write_text(text)
    change = Change.apply(base, diff_trees(base, fixed), tmp_path / "gold")
    (changed,) = change.files
    assert changed.hunks == 2
    only_second = changed.with_hunks({1})
    assert "sum(prices[1:])" in only_second and "min(value, high)" in only_second
    assert changed.with_hunks({0, 1}) == PRICING and changed.with_hunks(set()) == changed.before
    assert changed.added_lines() == {5, 14}


@pytest.mark.sandbox
def test_a_wrong_fix_that_passes_weak_tests_is_caught(world):
    """The fix repairs total() and clamp(); the tests cover clamp() only, so leaving total() broken passes."""
    base = PRICING.replace("sum(prices)", "sum(prices[1:])").replace("min(value, high)", "min(value, low)")
    task = make_task(
        world, "weak", {"shop/pricing.py": base}, {"shop/pricing.py": PRICING},
        {"tests/test_clamp.py": "from shop.pricing import clamp\n\n\ndef test_clamp():\n"
                                "    assert clamp(5, 0, 3) == 3\n"},
        "total() skips the first price and clamp() never returns more than its lower bound.",
        ["tests/test_clamp.py::test_clamp"],
    )  # fmt: skip
    kept, records, funnel = gate(world, [task], max_mutants=4)  # every gate, every one enforced
    record = records["weak"]
    assert kept == [] and funnel.dropped == {"weak_tests": 1}
    assert record.weak and record.verdict == "fail" and record.control.scores
    (passing,) = record.passing_mutants
    assert passing.kind == "partial_revert" and "shop/pricing.py:5" in passing.note
    assert "+    return max(low, min(value, high))" in passing.diff and "sum(prices)" not in passing.diff
    # dropped at the first wrong fix that passes: no more of them graded, the shortcuts not run, and why
    assert record.mutants[-1] is passing and record.mutants_tried < 4
    assert record.shortcuts == [] and record.gates_run == ["weak_tests", "leaks", "underspecified"]
    assert record.skipped == {"shortcuts": "the task had already failed weak_tests, which is enforced"}
    assert record.verifier_runs == 1 + record.mutants_tried

    # kept with its record (weak_tests not enforced): every wrong fix is graded, every gate runs
    kept, records, _ = gate(world, [task], max_mutants=4, enforce=("leaks", "shortcuts"))
    record = records["weak"]
    assert kept == [task] and record.weak and record.mutants_tried == 4 and record.skipped == {}
    assert [s.kind for s in record.shortcuts] == list(PANEL) and not record.solving_shortcuts
    assert record.verifier_runs == 1 + 4 + len(PANEL)


@pytest.mark.sandbox
def test_a_statement_that_quotes_the_fix_is_caught_with_spans(world):
    statement = (
        "discount() subtracts the percentage itself: discount(10, 15) gives -5, not 8.5.\n"
        "Any amount is affected. Suggested fix: add a helper `_percent_of` that does\n\n"
        "    return amount * percent / 100\n\nand subtract that from the price."
    )
    task = make_task(
        world, "leaky", {"shop/pricing.py": BUGGY_DISCOUNT}, {"shop/pricing.py": PERCENT_HELPER},
        {"tests/test_discount.py": DISCOUNT_TESTS}, statement,
        ["tests/test_discount.py::test_discount_takes_a_share_of_the_price"],
    )  # fmt: skip
    kept, records, funnel = gate(world, [task], gates=("leaks",))
    record = records["leaky"]
    assert kept == [] and funnel.dropped == {"leaks": 1} and record.verifier_runs == 0
    found = {(s.kind, s.text) for s in record.leaks}
    assert found == {
        ("expected_value", "8.5"),
        ("new_identifier", "_percent_of"),
        ("added_line", "return amount * percent / 100"),
    }  # "amount" is new too, but written as prose it is not code
    assert all(statement[s.start : s.end] == s.text and s.field == "problem_statement" for s in record.leaks)
    # with every gate asked for, nothing a verifier run could find would keep it: none is spent, and why is kept
    _, records, _ = gate(world, [task])
    record = records["leaky"]
    assert record.verdict == "fail" and record.verifier_runs == 0 and record.gates_run == ["leaks", "underspecified"]
    assert record.skipped == dict.fromkeys(
        ["weak_tests", "shortcuts"], "the task had already failed leaks, which is enforced"
    )


@pytest.mark.sandbox
def test_an_expected_value_the_test_also_feeds_in_is_not_a_leak(world):
    """Showing the input "Café Olé" gives nothing away; the output "cafe-ole-2" does."""
    tests = (
        'from shop.slug import slug\n\nTITLE = "Café Olé"\n\n\n'
        "def test_slug():\n"
        '    assert slug(TITLE, taken=False) == "Café Olé"\n'
        '    assert slug(TITLE, taken=True) == "cafe-ole-2"\n'
    )
    task = make_task(
        world, "inputs", {"shop/slug.py": "def slug(title, taken):\n    return title\n"},
        {"shop/slug.py": "def slug(title, taken):\n    return 'cafe-ole-2' if taken else title\n"},
        {"tests/test_slug.py": tests},
        'slug("Café Olé", taken=True) should be "cafe-ole-2" when "Café Olé" is taken.',
        ["tests/test_slug.py::test_slug"],
    )  # fmt: skip
    _, records, _ = gate(world, [task], gates=("leaks",))
    assert [(s.kind, s.text) for s in records["inputs"].leaks] == [("expected_value", "cafe-ole-2")]


@pytest.mark.sandbox
def test_a_task_a_constant_solves_is_caught_and_a_sound_task_passes_every_gate(world):
    shortcut = make_task(
        world, "shortcut",
        {"shop/numbers.py": "def is_even(n):\n    return n % 2 == 1\n"},
        {"shop/numbers.py": "def is_even(n):\n    return n % 2 == 0\n"},
        {"tests/test_numbers.py": "from shop.numbers import is_even\n\n\n"
                                  "def test_even():\n    assert is_even(4)\n    assert is_even(10)\n"},
        "is_even(4) is False.", ["tests/test_numbers.py::test_even"],
    )  # fmt: skip
    sound = make_task(
        world, "sound", {"shop/pricing.py": BUGGY_DISCOUNT, **EXISTING_TESTS}, {"shop/pricing.py": PRICING},
        {"tests/test_discount.py": DISCOUNT_TESTS},
        "discount(10, 15) returns -5: it subtracts the percentage instead of that share of the price.",
        ["tests/test_discount.py::test_discount_takes_a_share_of_the_price"], ["tests/test_total.py::test_total"],
    )  # fmt: skip
    kept, records, funnel = gate(world, [shortcut, sound], max_mutants=2, concurrency=2)
    bad, good = records["shortcut"], records["sound"]
    assert bad.verdict == "fail" and "shortcuts" in bad.failed_gates
    assert [s.kind for s in bad.solving_shortcuts] == ["return_true"]
    assert "+    return True" in bad.solving_shortcuts[0].diff
    (drop,) = funnel.details
    assert drop["ref"] == "shortcut" and drop["reason"] in bad.failed_gates
    assert kept == [sound]
    assert good.verdict == "pass" and good.failed_gates == [] and not good.weak and good.leaks == []
    assert [s.kind for s in good.shortcuts] == list(PANEL) and not good.solving_shortcuts
    assert all(s.status == "ok" for s in good.shortcuts)
    assert good.mutants_tried == 2 and not good.passing_mutants
    assert good.verifier_runs == 1 + 2 + len(PANEL)


@pytest.mark.sandbox
def test_a_wrong_fix_that_loops_forever_is_graded_0_by_its_cpu_budget_not_the_wall_timeout(world):
    """The verifier gives a validated task's test process ``timeout_factor`` x its slowest validated run in
    CPU-seconds (at least ``min_cpu_s``): a loop ends there, however loaded the machine, and the gold patch,
    graded under the same budget, still scores 1. A task never timed has no budget (the wall timeout only)."""
    _, snapshots, grader = world
    task = make_task(
        world, "loops", {"shop/pricing.py": BUGGY_DISCOUNT}, {"shop/pricing.py": PRICING},
        {"tests/test_discount.py": DISCOUNT_TESTS}, "discount() subtracts the percentage.",
        ["tests/test_discount.py::test_discount_takes_a_share_of_the_price"],
    ).model_copy(update={"validation": Validation(valid=True, slowest_run_s=0.05)})  # fmt: skip
    strict = Grader(grader.backend, grader.image, grader.image_digest, snapshots, Limits(), test_timeout_s=60,
                    timing=VerifyConfig(min_timeout_s=60, min_cpu_s=1))  # fmt: skip
    assert strict.cpu_budget_for(task) == 1 and strict.timeout_for(task) == 60
    assert strict.cpu_budget_for(task.model_copy(update={"validation": Validation()})) is None
    loop = BUGGY_DISCOUNT.replace("    return price - percent", "    while price:\n        pass")
    probe = Probe(task, strict, snapshots.materialize(task.snapshot), world[0] / "loops")
    looping = probe.grade("loop", "an endless loop", {"shop/pricing.py": loop})
    assert looping.reward == 0.0 and looping.reason.startswith("cpu_budget_spent"), looping.reason
    assert probe.grade("gold", "the gold patch", {"shop/pricing.py": PRICING}).reward == 1.0


@pytest.mark.sandbox
def test_a_gold_patch_that_does_not_apply_is_an_audit_error(world):
    task = make_task(
        world,
        "broken",
        {"shop/pricing.py": BUGGY_DISCOUNT},
        {"shop/pricing.py": PRICING},
        {"tests/test_discount.py": DISCOUNT_TESTS},
        "discount() is wrong.",
        ["tests/x.py::test"],
    )
    task = task.model_copy(update={"gold_patch": task.gold_patch.replace("price - percent", "price + percent")})
    kept, records, funnel = gate(world, [task], gates=("leaks",))
    assert kept == [] and funnel.dropped == {"audit_error": 1} and records["broken"].verdict == "fail"


@pytest.mark.pure
def test_rewrites_by_the_shortcut_panel_keep_the_file_valid(tmp_path):
    """Every strategy turns a multi-line function (docstring, multi-line string) into code that compiles."""
    from trialforge.quality.shortcuts import rewrite_functions

    source = 'def f(x):\n    """Doc."""\n    text = """a\nb"""\n    if x:\n        return text\n    return None\n'
    for name, rewrite in PANEL.items():
        if rewrite is None:
            continue
        result = rewrite_functions(source, [5], rewrite)
        assert result is not None and result[1] == ["f"], name
        compile(result[0], name, "exec")
        assert '"""Doc."""' in result[0]
    swallowed, _ = rewrite_functions(source, [5], PANEL["swallow_exceptions"])
    assert '        text = """a\nb"""\n' in swallowed and "    except Exception:\n        pass\n" in swallowed


@pytest.mark.sandbox
def test_a_task_whose_verdict_the_test_process_decides_too_much_of_is_dropped_before_any_verifier_run(world):
    """``quality.min_host_judged``: the share of fail-to-pass tests judged entirely on the host (validation's record);
    below it the task goes, with why, and no wrong fix or shortcut is graded for it."""
    half = make_task(
        world, "half-judged", {"shop/pricing.py": BUGGY_DISCOUNT}, {"shop/pricing.py": PRICING},
        {"tests/test_discount.py": DISCOUNT_TESTS}, "discount(10, 15) returns -5.",
        ["tests/test_discount.py::test_discount_takes_a_share_of_the_price", "tests/test_discount.py::test_other"],
    )  # fmt: skip
    # both tests anchored, one of them judged entirely on the host
    half.validation.host_judged = HostJudged(fail_to_pass=2, fail_to_pass_host_judged=1, fail_to_pass_anchored=2)
    uncalibrated = half.model_copy(update={"task_id": "uncalibrated", "validation": Validation()})
    unanchored = half.model_copy(update={"task_id": "unanchored", "validation": Validation(
        host_judged=HostJudged(fail_to_pass=2, fail_to_pass_host_judged=2, weak=2))})  # fmt: skip
    kept, records, funnel = gate(world, [half, uncalibrated, unanchored], max_mutants=2, min_host_judged=0.9)
    assert kept == []
    assert records["half-judged"].failed_gates == ["host_judged"] and records["half-judged"].verifier_runs == 0
    assert "50% of the fail-to-pass tests are judged on the host" in records["half-judged"].reasons[0]
    assert "not calibrated" in records["uncalibrated"].reasons[0]
    # only guessable checks on the host (truthiness, >=, ...): a forged report of it would need no right value
    assert "no fail-to-pass test has an assertion the host judges" in records["unanchored"].reasons[0]
    assert records["half-judged"].host_judged == half.validation.host_judged  # the figures travel with the record
    assert {d["reason"] for d in funnel.details} == {"host_judged"}
    _, records, _ = gate(world, [unanchored], max_mutants=0, require_host_judged=False)
    assert records["unanchored"].failed_gates != ["host_judged"]
    # one test anchored, the other judged in process: its verdict could be forged beside an honest fix of the first
    one_anchor = half.model_copy(update={"task_id": "one-anchor", "validation": Validation(
        host_judged=HostJudged(fail_to_pass=2, fail_to_pass_host_judged=1, fail_to_pass_anchored=1))})  # fmt: skip
    _, records, _ = gate(world, [one_anchor, half], max_mutants=0)
    assert records["one-anchor"].failed_gates == ["host_judged"] and records["one-anchor"].verifier_runs == 0
    assert "1 of 2 fail-to-pass tests have no assertion the host judges" in records["one-anchor"].reasons[0]
    assert records["half-judged"].failed_gates != ["host_judged"]  # every test anchored: kept by this rule
    with pytest.raises(ValidationError, match="min_host_judged"):
        QualityConfig(min_host_judged=1.5)
