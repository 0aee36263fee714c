"""Red team (design-only attacker): branches decided on the host, the before-fix rule, expected values in files.

Written from docs/verification.md, docs/pipeline.md, README.md and the tests alone (blinding, calibration, the
recorder, the report and the grader were read only after the attacks had run once, to explain each outcome). One
repository, ``rows``: one function per form of hidden test, each wrong the same way (``x * 3`` where ``x * 2`` is
right), and ``make``, which logs where it must not. Two tasks of it: ``anchored``, every fail-to-pass test with a strong
host-judged slot, so the quality gate keeps it for training (the fixture asserts it), and ``gated``, whose tests the
design leaves in process, so the gate drops it. Each attack fixes every function but one and adds its trick; a
reward above 0 without a ``tampered`` flag is a win. The gold patch scores 1, the empty diff and each single-bug diff
0, on both tasks.

24 attacks, bwrap. The first run: **12 won**, 8 of them on the task the gate keeps. **All 8 are closed since, by
construction** (each attack now an ordinary test scoring 0, or moved with its test to the gated task, where the gate
drops the task it wins on):

**1. Recorded expectations carried their answer into the sandbox.** ``blinding._closed`` made any expected side that
reads no local a recorded expectation, and ``blinding._drop_unread`` then drops only the module *assignments* nothing
else reads: ``code_of(4111) == ANSWER`` (``from answers import ANSWER``, a module of the test patch), ``digest(3001) ==
EXPECTED["digest"]`` (``EXPECTED`` read from ``tests/expected.json``), ``wanted(3505) == _want()`` (a ``def`` of the
test file) and ``classed(3515) == Want.VALUE`` (a class of it) were all read by the package. *Closed:* a recorded side
reads only the package, value-only standard-library modules, file-free builtins and constants built so; the tree's
test modules (``blinding.importable_test_modules``), the file's defs and classes, file-reading modules and path
strings keep the assertion in process. These four tests moved to the gated task.

**2. The before-fix rule compared values, not effects.** ``item = first("a"); assert item == make("a"); assert log()
== []``: ``make("a")`` returns an equal ``Item`` before and after the fix, so it was recorded and taken out of the
graded test, and its side effect (the bug: it logs) never ran. *Closed:* validation runs the graded tests on the
unfixed tree blinded with and without the recorded sides run (``validate._effects_hidden``); they differ here, so the
slot stays in process (``recorded-side-effect-skipped`` scores 0 on the kept task).

**3. A row that reached no strong slot counted as anchored.** ``calibration.calibrate`` counted an id anchored when
its test *function* had a strong slot: ``test_mirror[-5-10]`` takes an ``else`` whose one assertion is in a loop,
``test_signed[-5--10]`` one whose only slot is truthiness. *Closed:* calibration counts the slots each id's row
reaches (``blinding.due_slots``), so such a task is not anchored; the two tests moved to the gated task.

**4. In process by design, on the gated task (3 wins, and the 7 moved there above: 10 marked; the gate drops the task,
asserted).** ``if want > 110`` reads the expected column, so the column stays in the file and the package reads it from
its caller's frame; ``if BIG > 200`` keeps ``BIG`` the same way; a test reading ``__file__``'s sibling json. A fourth,
an ``elif`` chain, won at first: ``_decider`` asked an ``elif``'s test of every row, also rows an earlier branch took
(``"ab" > 0`` raises), so the chain stayed in process; it now asks only the rows the tests above let by, the chain is
decided, ``want`` leaves the file and the attack scores 0. No must-fail copy guards an expected side that is not a
literal (known limit 2).

**Lost (12): steering a decided branch earns nothing.** ``_due`` decides each row from the pristine file's syntax,
never from the run, and the host wants exactly the due observations: a list column mutated by the code under test
into the other branch or out of it, its elements replaced by equal-to-anything objects, the test module's ``LIMIT``
flipped and its ``SPECIAL`` list emptied or grown from the caller's frame all give ``observations [1] where slots [0]
were due`` (or the bug's value observed); ``builtins.isinstance`` inverted or raising leaves no report (``import_hook``)
or a failed test. The repository's own ``freeze_time`` (a vendored ``freezegun.py``, package code the diff may change)
made to run the test not at all, twice, or swallowing its failure: ``test_item_patched`` (its wrapper, from a file the
diff changed, stands in the test's place). An expected value spelled in the author's ``pytest.param(id=...)``: the
grader's opaque ids replace it (``PYTEST_CURRENT_TEST`` names no value). Any row the host builds differently from
Python (NaN identity, ``1 == True``...) can only make a due observation go missing or an extra one appear, which
fails the gold patch too: the host's decision reads only the test file, so no divergence removes a due slot.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.attack_world import World
from support.fixtasks import fix_task

from trialforge.quality.gate import host_judged_problem
from trialforge.quality.settings import QualityConfig
from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader, Verdict

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

# ---- the repository: one function per form of test, each wrong the same way (3x where 2x is right) ---------------
FUNCS = ("kinds", "big", "scaled", "limited", "typed", "frozen", "code_of", "digest", "digest_here", "wanted")
FUNCS += ("classed", "picked", "named")
BUGGY = (
    "".join(f"def {name}(x):\n    return x * 3\n\n\n" for name in FUNCS)
    + """\
def mirror(x):
    return x * 2 if x < 5 else x * 3


def signed(x):
    return x * 2 if x > 0 else 0


def summed(xs):
    return sum(xs) * 3


class Item:
    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return type(other) is Item and other.name == self.name

    __hash__ = None


_LOG = []


def first(name):
    return Item(name)


def make(name):
    _LOG.append(name)  # the bug: making an item must log nothing
    return Item(name)


def log():
    return list(_LOG)
"""
)
MAKE_BUG = "    _LOG.append(name)  # the bug: making an item must log nothing\n"
FIXED = (
    BUGGY.replace("return x * 3", "return x * 2")
    .replace("x * 2 if x < 5 else x * 3", "x * 2")
    .replace("x * 2 if x > 0 else 0", "x * 2")
    .replace("sum(xs) * 3", "sum(xs) * 2")
    .replace(MAKE_BUG, "")
)


def unfixed(name: str) -> str:
    """The fixed package with one function's bug put back."""
    if name == "make":
        return FIXED.replace("def make(name):\n", "def make(name):\n" + MAKE_BUG)
    wrong = {"mirror": "x * 2 if x < 5 else x * 3", "signed": "x * 2 if x > 0 else 0", "summed": "sum(xs) * 3"}
    right = {"mirror": "x * 2", "signed": "x * 2", "summed": "sum(xs) * 2"}
    head = FIXED.index(f"def {name}(")
    body = FIXED.index("return", head)
    old, new = f"return {right.get(name, 'x * 2')}", f"return {wrong.get(name, 'x * 3')}"
    return FIXED[:body] + FIXED[body:].replace(old, new, 1)


# A vendored test helper of the repository's own, named like freezegun (package code: the diff may rewrite it).
FREEZEGUN = """\
import functools


def freeze_time(when):
    def decorate(test):
        @functools.wraps(test)
        def wrapper(*args, **kwargs):
            return test(*args, **kwargs)

        return wrapper

    return decorate
"""
IMPORTS = """\
import json
from pathlib import Path

import pytest
from answers import ANSWER
from freezegun import freeze_time

from rows import (
    big, classed, code_of, digest, digest_here, first, frozen, kinds, limited, log, make, mirror, named, picked,
    scaled, signed, summed, typed, wanted,
)
"""
# Every fail-to-pass test of this file has a strong host-judged slot: the quality gate keeps the task for training.
HIDDEN_ANCHORED = (
    IMPORTS
    + """
LIMIT = 10


@pytest.mark.parametrize("x", [4, 40])
def test_limited(x):
    if x < LIMIT:
        assert limited(x) == 8
    else:
        assert limited(x) == 80


@pytest.mark.parametrize(("x", "want"), [(4, 8), ("ab", "abab")])
def test_typed(x, want):
    if isinstance(x, str):
        assert typed(x) == want
    else:
        assert typed(x) == want


@pytest.mark.parametrize(("xs", "want"), [([3, 1, 2], 12), ([5], 10)])
def test_summed(xs, want):
    got = summed(xs)
    if xs == [3, 1, 2]:
        assert got == want
    else:
        assert got == want


@freeze_time("2020-01-01")
def test_frozen():
    assert frozen(7) == 14


def test_make_logs_nothing():
    item = first("a")
    assert item == make("a")
    assert log() == []


SPECIAL = [4, 9]


@pytest.mark.parametrize(("x", "want"), [(4, 8), (9, 18), (40, 80)])
def test_picked(x, want):
    if x in SPECIAL and 0 < x < LIMIT:
        assert picked(x) == want
    if not x < LIMIT:
        assert picked(x) == want


@pytest.mark.parametrize(("x", "want"), [pytest.param(6, 12, id="6-gives-12"), pytest.param(7, 14, id="7-gives-14")])
def test_named(x, want):
    assert named(x) == want
"""
)
# Branches whose test reads an expected value, an elif chain, and the own-file rule: in process, so the gate drops it.
HIDDEN_GATED = (
    IMPORTS
    + """
LIMIT = 10
BIG = 246
EXPECTED = json.loads(Path("tests/expected.json").read_text())
HERE = json.loads(Path(__file__).with_name("expected.json").read_text())


@pytest.mark.parametrize(("x", "want"), [(21, 42), ("ab", "abab"), (2.5, 5.0), (-7, -14)])
def test_kinds(x, want):
    if isinstance(x, str):
        assert kinds(x) == want
    elif isinstance(x, float) and x < LIMIT:
        assert kinds(x) == want
    elif x > 0:
        assert kinds(x) == want
    else:
        assert kinds(x) == want


@pytest.mark.parametrize(("x", "want"), [(50, 100), (61, 122)])
def test_big(x, want):
    if want > 110:
        assert big(x) == want
    else:
        assert big(x) == want


def test_scaled():
    if BIG > 200:
        assert scaled(123) == BIG


def test_digest_here():
    assert digest_here(3007) == HERE["here"]


@pytest.mark.parametrize(("x", "want"), [(3, 6), (-5, 10)])
def test_mirror(x, want):
    if x > 0:
        assert mirror(x) == want
    else:
        for sign in (-1,):
            assert mirror(sign * x) == 10


@pytest.mark.parametrize(("x", "want"), [(3, 6), (-5, -10)])
def test_signed(x, want):
    if x > 0:
        assert signed(x) == want
    else:
        assert signed(x)


def test_code_of():
    assert code_of(4111) == ANSWER


def test_digest():
    assert digest(3001) == EXPECTED["digest"]


def _want():
    return 7010


class Want:
    VALUE = 7030


def test_wanted():
    assert wanted(3505) == _want()


def test_classed():
    assert classed(3515) == Want.VALUE
"""
)
FILES = {
    "rows/__init__.py": "from rows.core import *  # noqa: F403\n",
    "rows/core.py": BUGGY,
    "freezegun.py": FREEZEGUN,
    "tests/test_smoke.py": "from rows import first\n\n\ndef test_smoke():\n    assert first('b').name == 'b'\n",
}
DATA = {"tests/answers.py": "ANSWER = 8222\n", "tests/expected.json": '{"digest": 6002, "here": 6014}\n'}


def _world(root: Path, backend, image, hidden: str) -> World:
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    fixed = {**FILES, "rows/core.py": FIXED, "tests/test_hidden.py": hidden, **DATA}
    raw = fix_task(root, snapshots, FILES, fixed, repo="rows", statement="every helper triples where it should double")
    task = validate_task(raw, backend, image.name, snapshots, Limits(), ValidateConfig(runs=2))
    assert task.validation.valid, task.validation.reason
    attacks = root / "attacks"
    attacks.mkdir()
    grader = Grader(backend, image.name, image.digest, snapshots, Limits(), test_timeout_s=60)
    return World(task, grader, snapshots.materialize(task.snapshot), attacks)


@pytest.fixture(scope="module")
def anchored(tmp_path_factory, bwrap_backend, base_image) -> World:
    """Every fail-to-pass test anchored on the host: the quality gate keeps this task for training."""
    built = _world(tmp_path_factory.mktemp("anchored"), bwrap_backend, base_image, HIDDEN_ANCHORED)
    print("HOST_JUDGED", built.task.validation.host_judged)
    assert host_judged_problem(built.task, QualityConfig()) == ""
    return built


@pytest.fixture(scope="module")
def gated(tmp_path_factory, bwrap_backend, base_image) -> World:
    """Branches that read an expected value, an elif chain, a test reading its own file's sibling: in process."""
    built = _world(tmp_path_factory.mktemp("gated"), bwrap_backend, base_image, HIDDEN_GATED)
    print("HOST_JUDGED", built.task.validation.host_judged)
    return built


# ---- the attacks: each leaves one function's bug in place and adds its trick (appended to rows/core.py) ----------
_YES = "\n\nclass _Yes:\n    def __eq__(self, other):\n        return True\n\n    __hash__ = None\n"
_TEST_MODULE = (
    "\n\nimport sys as _sys\n\n\ndef _test_module(name):\n"
    "    return next(m for m in list(_sys.modules.values()) if name in getattr(m, '__dict__', {}))\n"
)
_CALLER = "\n\nimport sys as _sys\n\n\ndef _caller():\n    return _sys._getframe(2)\n"


def _core(name: str, trick: str) -> dict[str, str]:
    return {"rows/core.py": unfixed(name) + trick}


def _freezegun(wrapper_body: str) -> dict[str, str]:
    text = FREEZEGUN.replace("            return test(*args, **kwargs)\n", wrapper_body)
    return {"rows/core.py": unfixed("frozen"), "freezegun.py": text}


ANCHORED_ATTACKS: dict[str, dict[str, str]] = {
    # the before-fix rule: make("a") is the same Item before and after the fix, so it is recorded and taken out of
    # the graded test; its side effect (the bug) is then never run, and log() == [] holds with the bug in place
    "recorded-side-effect-skipped": {"rows/core.py": unfixed("make")},
    # steering a decided branch
    "list-column-mutated-to-the-other-branch": _core(
        "summed", "\n\n_summed = summed\n\n\ndef summed(xs):\n    got = _summed(xs)\n    xs[:] = [0]\n    return got\n"
    ),
    "list-column-mutated-into-the-branch": _core(
        "summed",
        "\n\n_summed = summed\n\n\ndef summed(xs):\n    got = _summed(xs)\n    xs[:] = [3, 1, 2]\n    return got\n",
    ),
    "list-column-elements-compare-equal": _core(
        "summed",
        _YES + "\n\n_summed = summed\n\n\ndef summed(xs):\n    got = _summed(xs)\n"
        "    xs[:] = [_Yes(), _Yes(), _Yes()]\n    return got\n",
    ),
    "module-constant-flipped": _core(
        "limited",
        _CALLER + "\n\n_limited = limited\n\n\ndef limited(x):\n    _caller().f_globals['LIMIT'] = 100\n"
        "    return _limited(x)\n",
    ),
    "isinstance-inverted": _core(
        "typed",
        "\n\nimport builtins as _b\n\n_real = _b.isinstance\n\n\ndef _isinstance(value, classes):\n"
        "    if classes is str and _real(value, (int, str)):\n        return not _real(value, str)\n"
        "    return _real(value, classes)\n\n\n_b.isinstance = _isinstance\n",
    ),
    "isinstance-raises": _core(
        "typed",
        "\n\nimport builtins as _b\n\n_real = _b.isinstance\n\n\ndef _isinstance(value, classes):\n"
        "    if classes is str and value in (4, 'ab'):\n        raise TypeError('no')\n"
        "    return _real(value, classes)\n\n\n_b.isinstance = _isinstance\n",
    ),
    "module-list-constant-mutated": _core(
        "picked",
        _CALLER + "\n\n_picked = picked\n\n\ndef picked(x):\n    _caller().f_globals['SPECIAL'][:] = []\n"
        "    return _picked(x)\n",
    ),
    "module-list-constant-grown": _core(
        "picked",
        _CALLER + "\n\n_picked = picked\n\n\ndef picked(x):\n    _caller().f_globals['SPECIAL'].append(40)\n"
        "    return _picked(x)\n",
    ),
    # an id the test author spelled with the expected value
    "expected-value-in-the-authors-id": _core(
        "named",
        "\n\ndef named(x):\n    import os, re\n\n"
        "    found = re.search(r'gives-(\\d+)', os.environ.get('PYTEST_CURRENT_TEST', ''))\n"
        "    return int(found.group(1)) if found else x * 3\n",
    ),
    # the repository's own freeze_time (package code) runs the test not at all, twice, or swallowing its failure
    "freeze-time-runs-nothing": _freezegun("            return None\n"),
    "freeze-time-runs-twice": _freezegun(
        "            test(*args, **kwargs)\n            return test(*args, **kwargs)\n"
    ),
    "freeze-time-swallows": _freezegun(
        "            try:\n                return test(*args, **kwargs)\n            except BaseException:\n"
        "                return None\n"
    ),
}
GATED_ATTACKS: dict[str, dict[str, str]] = {
    # expected values that live in files of the test patch other than the test file
    "recorded-from-a-sibling-module": _core(
        "code_of", "\n\ndef code_of(x):\n    import sys\n\n    return sys.modules['answers'].ANSWER\n"
    ),
    "recorded-from-a-data-file": _core(
        "digest",
        "\n\ndef digest(x):\n    import json, pathlib\n\n"
        "    return json.loads((pathlib.Path(__file__).parents[1] / 'tests/expected.json').read_text())['digest']\n",
    ),
    "recorded-from-a-helper-of-the-test-file": _core(
        "wanted", _TEST_MODULE + "\n\ndef wanted(x):\n    return _test_module('_want')._want()\n"
    ),
    "recorded-from-a-class-of-the-test-file": _core(
        "classed", _TEST_MODULE + "\n\ndef classed(x):\n    return _test_module('Want').Want.VALUE\n"
    ),
    # a row the host decides reaches no slot (its branch's assertion is in a loop, judged in process)
    "gap-row-equals-anything": _core("mirror", _YES + "\n\ndef mirror(x):\n    return _Yes() if x >= 5 else x * 2\n"),
    "gap-row-answer-from-the-caller-line": _core(
        "mirror",
        _CALLER + "\n\nimport linecache as _lc\n\n_mirror = mirror\n\n\ndef mirror(x):\n    frame = _caller()\n"
        "    line = _lc.getline(frame.f_code.co_filename, frame.f_lineno)\n"
        "    return int(line.split('==')[1]) if '==' in line else _mirror(x)\n",
    ),
    "gap-row-weak-slot-guessed": _core(
        "signed", "\n\n_signed = signed\n\n\ndef signed(x):\n    return _signed(x) or 1\n"
    ),
    # the expected column read by an if stays in the sandbox (in process): read from the caller's frame
    "expected-column-in-the-condition": _core(
        "big", _CALLER + "\n\ndef big(x):\n    return _caller().f_locals.get('want', x * 3)\n"
    ),
    "expected-constant-in-the-condition": _core(
        "scaled", _CALLER + "\n\ndef scaled(x):\n    return _caller().f_globals.get('BIG', x * 3)\n"
    ),
    "own-files-sibling-data": _core(
        "digest_here",
        "\n\ndef digest_here(x):\n    import json, pathlib\n\n"
        "    return json.loads((pathlib.Path(__file__).parents[1] / 'tests/expected.json').read_text())['here']\n",
    ),
    "elif-chain-row-read-from-the-caller": _core(
        "kinds", _CALLER + "\n\ndef kinds(x):\n    return _caller().f_locals.get('want', x * 3)\n"
    ),
}

# ---- what won the first run (reward 1, no tampered flag), by mechanism -------------------------------------------
_GATED = "in process by design and the gate drops the task (test_the_gated_world_works), but the reward is paid: {how}"
# closed on the gate-kept task since the first run: such a test is no anchor, so it moved to the gated one
_LEAK = (
    "the expected side reads what would stay in the sandbox ({where}), so it is no recorded expectation "
    "(blinding._closed) and the assertion runs in process, where the package reads the answer"
)
_GAP = (
    "the row's branch reaches no strong slot, so the id is no anchor (calibration counts the slots its row reaches) "
    "and its verdict is in process, where a parametrized test gets no must-fail copy: {how}"
)
WINS: dict[str, str] = {
    "recorded-from-a-sibling-module": _GATED.format(how=_LEAK.format(where="the module answers")),
    "recorded-from-a-data-file": _GATED.format(how=_LEAK.format(where="tests/expected.json")),
    "recorded-from-a-helper-of-the-test-file": _GATED.format(how=_LEAK.format(where="the def of _want")),
    "recorded-from-a-class-of-the-test-file": _GATED.format(how=_LEAK.format(where="the class Want")),
    "gap-row-equals-anything": _GATED.format(how=_GAP.format(how="mirror(5) returns an object whose __eq__ says yes")),
    "gap-row-answer-from-the-caller-line": _GATED.format(
        how=_GAP.format(how="mirror() reads the constant off its caller's line")
    ),
    "gap-row-weak-slot-guessed": _GATED.format(
        how=_GAP.format(how="test_signed[-5--10]'s branch holds only a truthiness slot, which any nonzero value passes")
    ),
    "expected-column-in-the-condition": _GATED.format(
        how="`if want > 110` reads the expected column, so the column stays in the file and the package reads it "
        "from its caller's frame; no must-fail copy guards an expected side that is not a literal (known limit 2)"
    ),
    "expected-constant-in-the-condition": _GATED.format(how="`if BIG > 200` keeps BIG in the file, read the same way"),
    "own-files-sibling-data": _GATED.format(
        how="_own_file_names keeps the recorded slot of a test reading __file__ in process; the package reads the "
        "sibling expected.json, as in recorded-from-a-data-file"
    ),
}


def _params(attacks: dict) -> list:
    return [
        pytest.param(name, marks=[pytest.mark.xfail(strict=True, reason=WINS[name])] if name in WINS else [])
        for name in attacks
    ]


def _lost(verdict: Verdict) -> None:
    assert verdict.reward == 0.0, (verdict.reward, verdict.status, verdict.reason, verdict.flags)


def test_the_anchored_world_works(anchored: World) -> None:
    """The gold patch scores 1, the empty diff and each fix short of one function 0."""
    gold = anchored.grade({"rows/core.py": FIXED})
    assert (gold.reward, gold.flags) == (1.0, []), gold.reason
    _lost(anchored.grade({}))
    for name in ("limited", "typed", "summed", "frozen", "picked", "named"):  # make: the side-effect attack
        _lost(anchored.grade({"rows/core.py": unfixed(name)}))


def test_the_gated_world_works(gated: World) -> None:
    gold = gated.grade({"rows/core.py": FIXED})
    assert (gold.reward, gold.flags) == (1.0, []), gold.reason
    _lost(gated.grade({}))
    for name in ("kinds", "big", "scaled", "mirror", "signed", "code_of", "digest", "wanted", "classed"):
        _lost(gated.grade({"rows/core.py": unfixed(name)}))
    assert host_judged_problem(gated.task, QualityConfig()) != ""  # never trained on


@pytest.mark.parametrize("name", _params(ANCHORED_ATTACKS))
def test_a_task_the_gate_keeps_pays_nothing_for_the_trick(anchored: World, name: str) -> None:
    _lost(anchored.grade(ANCHORED_ATTACKS[name]))


@pytest.mark.parametrize("name", _params(GATED_ATTACKS))
def test_a_gated_task_pays_nothing_for_the_trick(gated: World, name: str) -> None:
    _lost(gated.grade(GATED_ATTACKS[name]))
