"""Verdicts the code under test cannot reach, for real on both backends: validation calibrates a task's blinded
assertions, grading keeps every expected value out of the sandbox, and the host decides.

One small repository (``shop``) whose hidden tests (the test patch) expect distinctive values: a constant, a
module constant, a parametrized column, an exception with its message, an object built by the package (a
recorded expectation), and one comparison the host cannot judge the way Python does (the package's own object
equal to a string), which calibration must keep in process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.store.objstore import open_store
from trialforge.tasks.patches import apply_patch, diff_trees
from trialforge.tasks.patches import test_files as files_of_tests
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.testrun.prepare import prepare
from trialforge.testrun.run import report_limits, run_tests
from trialforge.verify.grader import Grader

pytestmark = pytest.mark.sandbox

BUGGY = '''\
from decimal import Decimal


class CodeError(ValueError):
    pass


class Basket:
    def __init__(self, items=()):
        self.items = tuple(items)


class Greeting:
    """Equal to its text: Python says ``Greeting("x") == "x"``; the host cannot rebuild that."""

    def __init__(self, text):
        self.text = text

    def __eq__(self, other):
        return self.text == other


PRICES = {"quokka": Decimal("38.655"), "a": 52364, "b": 65181}  # before tax


def price(code):
    return PRICES.get(code, 0) * 3  # the bug: tax is 100%, not 200%


def label(code):
    return code.upper()[::-1]  # the bug: reversed


def parse_code(code):
    if not code.isalpha():
        raise CodeError("bad code")  # the bug: the message should name the code
    return code


def basket(code):
    return Basket([code])


def greet():
    return Greeting("hello-55117")


def span(code):
    start = len(code) * 27607
    return start, start + 9


def floor(code):
    return span(code)[0] + 1  # the bug: one past the span's start


def tally(code):
    return len(code) * 40993  # the bug: one short
'''
FIXED = (
    BUGGY.replace("PRICES.get(code, 0) * 3", "PRICES.get(code, 0) * 2")
    .replace("code.upper()[::-1]", '"QUOKKA-" + str(7731)')
    .replace('"bad code"', 'f"unknown code {len(code) * 4471}"')
    .replace("Basket([code])", 'Basket(["ZQ-" + str(99881)])')
    .replace("span(code)[0] + 1", "span(code)[0]")
    .replace("len(code) * 40993", "(len(code) + 1) * 40993")
)
HIDDEN = """\
import pytest

from shop import Basket, CodeError, basket, floor, greet, label, parse_code, price, span, tally
from decimal import Decimal

LABEL = "QUOKKA-7731"


def test_price_of_a_quokka():
    assert price("quokka") == Decimal("77.31")


def test_label():
    assert label("zq") == LABEL


@pytest.mark.parametrize(("code", "want"), [("a", 104728), ("b", 130362)])
def test_rows(code, want):
    assert price(code) == want


def test_bad_code():
    with pytest.raises(CodeError, match="unknown code 4471"):
        parse_code("?")


def test_basket():
    assert basket("zq").items == Basket(["ZQ-99881"]).items


def test_greeting():
    assert greet() == "hello-55117"


def test_floor_is_where_the_span_starts():
    start, end = span("zq")
    assert floor("zq") == start
    assert end > start


@pytest.mark.parametrize(("code", "want"), [("ab", 122979), (7, 0)])
def test_tally_of_codes(code, want):
    if isinstance(code, str):
        assert tally(code) == want
"""
SECRETS = ["77.31", "QUOKKA-7731", "104728", "130362", "unknown code 4471", "ZQ-99881", "99881", "122979"]
F2P = [
    "tests/test_hidden.py::test_price_of_a_quokka", "tests/test_hidden.py::test_label",
    "tests/test_hidden.py::test_rows[a-104728]", "tests/test_hidden.py::test_rows[b-130362]",
    "tests/test_hidden.py::test_bad_code", "tests/test_hidden.py::test_basket",
    "tests/test_hidden.py::test_floor_is_where_the_span_starts", "tests/test_hidden.py::test_tally_of_codes[ab-122979]",
]  # fmt: skip
# The code under test's view of its own process, and of every process it can see, written where the host reads it.
SPY = """

import os as _os
_seen = []
for _pid in [p for p in _os.listdir("/proc") if p.isdigit()]:
    for _what in ("cmdline", "environ"):
        try:
            with open(f"/proc/{_pid}/{_what}", "rb") as _fh:
                _seen.append(_fh.read().replace(b"\\0", b" ").decode(errors="replace"))
        except OSError:
            pass
with open("/work/.seen.txt", "w") as _fh:
    _fh.write("\\n".join(_seen))
"""


def _write(tree: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)


@pytest.fixture(scope="module", params=["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
def shop(request, tmp_path_factory):
    """The task, validated for real on the backend, with its grader."""
    backend = request.getfixturevalue(f"{request.param}_backend")
    image = request.getfixturevalue("base_image")
    root = tmp_path_factory.mktemp(f"shop-{request.param}")
    base, fixed, hidden = root / "base", root / "fixed", root / "hidden"
    package = "from shop.core import *  # noqa\nfrom shop.core import CodeError\n"
    smoke = "def test_smoke():\n    assert 1 + 1 == 2\n"
    _write(base, {"shop/__init__.py": package, "shop/core.py": BUGGY, "tests/test_smoke.py": smoke})
    shutil.copytree(base, fixed)
    (fixed / "shop/core.py").write_text(FIXED)
    shutil.copytree(base, hidden)
    (hidden / "tests/test_hidden.py").write_text(HIDDEN)
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    task = Task(
        task_id="shop-1", source=Source(kind="synthetic", ref="test"), repo="shop", snapshot=snapshots.put(base),
        problem_statement="prices, labels and baskets are wrong", gold_patch=diff_trees(base, fixed),
        test_patch=diff_trees(base, hidden),
    )  # fmt: skip
    validated = validate_task(task, backend, image.name, snapshots, Limits(), ValidateConfig(runs=2))
    assert validated.validation.valid, validated.validation.reason
    grader = Grader(backend, image.name, image.digest, snapshots, Limits(), test_timeout_s=60)
    return validated, grader, backend, image, base, root


def _diff(shop, name: str, core: str, extra: str = "") -> str:
    *_, base, root = shop
    tree = root / name
    shutil.copytree(base, tree)
    (tree / "shop/core.py").write_text(core + extra)
    return diff_trees(base, tree)


def test_validation_calibrates_which_assertions_the_host_judges(shop) -> None:
    task = shop[0]
    assert sorted(task.fail_to_pass) == sorted(F2P)
    record = task.validation.host_judged
    assert record is not None
    # the Greeting equals its string in Python, not on the host: kept in process, everything else judged there
    # floor("zq") == start: the closed side floor("zq") would be recorded and taken out, but it computed another value
    # before the fix (it runs the code the fix changes), so it stays in process, run as written; so does end > start
    floor_slot = "tests/test_hidden.py::test_floor_is_where_the_span_starts#0"
    assert record.in_process == [floor_slot, "tests/test_hidden.py::test_greeting#0"]
    assert (record.fail_to_pass, record.fail_to_pass_host_judged, record.fail_to_pass_anchored) == (8, 7, 7)
    assert list(record.unanchored) == [floor_slot.split("#")[0]]  # end > start is no slot: a relation, in process
    assert record.unanchored[floor_slot.split("#")[0]].startswith("every assertion the host could judge stays in")
    # the greeting, 1 + 1 == 2, and the tally row whose branch does not run: no slot of its own, so in process
    assert (record.pass_to_pass, record.pass_to_pass_host_judged) == (3, 0)
    assert record.param_rows == {"tests/test_hidden.py::test_rows[a-104728]": 0,
                                 "tests/test_hidden.py::test_rows[b-130362]": 1,
                                 "tests/test_hidden.py::test_tally_of_codes[ab-122979]": 0,
                                 "tests/test_hidden.py::test_tally_of_codes[7-0]": 1}  # fmt: skip
    assert record.recorded["tests/test_hidden.py::test_basket#0"][0] == "t"  # the gold code's Basket items
    # two values the package computes: what the gold code's span started at, for floor and span alike
    assert floor_slot not in record.recorded
    assert (record.assertions, record.assertions_host_judged) == (12, 7)


def test_the_gold_patch_scores_one_and_the_bug_scores_zero_on_the_hosts_checks(shop) -> None:
    task, grader, *_ = shop
    gold = grader.grade(task, task.gold_patch)
    assert (gold.reward, gold.status, gold.flags) == (1.0, "ok", []), gold.reason
    unfixed = grader.grade(task, "")
    assert unfixed.reward == 0.0 and "host checks" in unfixed.reason, unfixed.reason


def test_an_object_that_equals_anything_earns_nothing(shop) -> None:
    """Python's ``==`` would call its ``__eq__``; the host compares what it rebuilt and the value it kept."""
    task, grader, *_ = shop
    anything = "\n\nclass _Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n\n"
    hack = anything + "price = label = basket = (lambda *a, **k: _Yes())\n"
    verdict = grader.grade(task, _diff(shop, "anything", FIXED.replace('"QUOKKA-"', '"X-"') + hack))
    assert verdict.reward == 0.0 and "host checks" in verdict.reason, verdict.reason


def test_an_unfixed_function_a_recorded_expectation_would_have_hidden_earns_nothing(shop) -> None:
    """``start == floor("zq")``: recorded, ``floor("zq")`` was taken out of the graded test and never run, so a diff
    fixing everything but floor scored 1; its value moved with the fix, so it stays in the test, in process."""
    task, grader, *_ = shop
    verdict = grader.grade(task, _diff(shop, "floor_unfixed", FIXED.replace("span(code)[0]", "span(code)[0] + 1")))
    assert verdict.reward == 0.0, verdict.reason
    assert "test_floor_is_where_the_span_starts" in verdict.reason


SKIP_BRANCH = """

import builtins as _builtins
_real_isinstance = _builtins.isinstance


def _isinstance(value, classes):
    if classes is str and type(value) is str and value == "ab":
        return False  # the graded row's branch is not taken: its assertion never runs
    return _real_isinstance(value, classes)


_builtins.isinstance = _isinstance
"""


def test_code_that_steers_a_test_past_its_branch_earns_nothing(shop) -> None:
    """``if isinstance(code, str): assert tally(code) == want``: the host decides from the row that the branch runs,
    so the code under test, leaving tally unfixed and making ``isinstance`` say no for that row, misses a due check."""
    task, grader, *_ = shop
    unfixed = FIXED.replace("(len(code) + 1) * 40993", "len(code) * 40993")
    verdict = grader.grade(task, _diff(shop, "skip_branch", unfixed, SKIP_BRANCH))
    assert verdict.reward == 0.0, verdict.reason
    assert "test_tally_of_codes[ab-122979]: observations [] where slots [0] were due" in verdict.reason


def test_a_graded_runs_sandbox_holds_no_expected_value_and_no_graded_test_id(shop) -> None:
    """The graded run as the grader prepares it, with code under test that records every process's command line
    and environment it can see; then the whole filesystem is searched for the answers and the graded ids."""
    task, _, backend, image, base, root = shop
    tree = root / "graded"
    shutil.copytree(base, tree)
    apply_patch(tree, _diff(shop, "spy", BUGGY, SPY))
    apply_patch(tree, task.test_patch)
    known = task.validation.host_judged
    tests = task.fail_to_pass + task.pass_to_pass
    guard = prepare(tree, tests, files_of_tests(tree), changed=["shop/core.py"], copy_from=task.fail_to_pass,
                    observe="blind", in_process=known.in_process, param_rows=known.param_rows,
                    recorded=known.recorded)  # fmt: skip
    sandbox = backend.create(SandboxSpec(image=image.name, workspace=tree, limits=report_limits(Limits())))
    try:
        report = run_tests(sandbox, tests, timeout=60, guard=guard, stop_early=True)
        assert report.reported and not report.all_passed(task.fail_to_pass)
        seen = sandbox.read_file(".seen.txt").decode()
        assert "tests/test_hidden.py" in seen or "python3" in seen  # the spy ran and saw the test process
        hidden_names = {t.split("::", 1)[1].split("[")[0] for t in task.fail_to_pass}  # renamed: found nowhere
        needles = [*SECRETS, *tests, *sorted(hidden_names)]
        sandbox.write_file(".needles", "\n".join(needles).encode())  # written after the run, then excluded
        search = (
            "grep -rowF -f /work/.needles / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null"
            " | grep -v '^/work/.needles:' || true"
        )
        found = sandbox.exec(["sh", "-c", search])
    finally:
        sandbox.close()
    assert [n for n in needles if n in seen] == [], "a process's arguments or environment named an answer"
    assert found.stdout.strip() == "", f"files that name an answer or a graded test: {found.stdout}"
