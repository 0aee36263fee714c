"""Red team (design-only attacker): a synthesized task's hidden fail-to-pass tests, its workspace and its statement.

Written from docs/verification.md, docs/pipeline.md ("Synthetic tasks"), docs/synthesis.md and the tests alone
(``tasks/observed.py`` was read only after the attacks had run once, to explain the statement leaks). One repository,
``glyph``, synthesized once with ``flip_arith`` only: each of four functions holds the repository's only ``+`` sites,
so each mutant breaks exactly one test module and is one task: ``scale`` (its test reads ``tests/data/scale.json``),
``mask`` (eight tests whose failures print the expected value in forms other than the literal), ``fold`` (a skipped
copy of its test stays in ``tests/test_legacy.py``) and ``twist`` (a parametrized table). Every task is one the
quality gate keeps (``host_judged_problem`` is empty for each: asserted), the gold scores 1, the empty diff 0.
Before synthesis every test module is compiled to ``tests/__pycache__`` as a developer's work tree has it.

30 checks (28 attacks and 2 controls), bwrap, about 15 s. **The first run: 10 checks won, 5 holes. All five are
closed since:** 3, 4 and 5 by the statement hiding every judged value of every failing test from every line, test ids
and names included (``observed.redact_names``); 1 and 2 by construction of the anchor: an expected value the policy
can read in its workspace anchors nothing (``tasks/visible.py``), so the gate drops both tasks (asserted). Their two
grading attacks still win on those dropped tasks, kept as non-strict xfails. The first run's wins:

**1. A hidden test's data file stays in the workspace and the graded sandbox** (episode hunt finds 4071 in
``/work/tests/data/scale.json``; a diff that looks the input up in that file scores **1.0** with the bug left in for
every other input). Only test *modules* leave the snapshot; files they read do not. docs/verification.md names the
graded half as an open door; the episode half (the policy reads the values before it writes a line) is new.

**2. A copy of the hidden assertion in a module the mutant did not break stays visible** (a ``@pytest.mark.skip``ped
``test_fold_legacy`` asserts ``fold(9100) == 9190``): the hunt finds it, and ``9190 if n == 9100 else <bug>`` scores
**1.0**. Hiding is by "modules that failed", not by "modules that hold the hidden values".

**3. The statement lists fail-to-pass ids raw, and a parametrized id carries the expected column**
(``test_mask_param[8700-8764]``, ``test_twist[7100-7150]``): the observed section redacts ``assert 8636 == …`` on the
same line that names 8764. On ``twist``, whose every fail-to-pass test is such a row, a diff built from the statement
alone (``{7100: 7150, 7300: 7350}.get(n, <bug>)``) scores **1.0** on a task the gate keeps. (The grader's opaque ids
keep it out of ``PYTEST_CURRENT_TEST`` at grading time; the statement and ``Task.fail_to_pass`` hand it over anyway.)

**4. A test name spelling its expected value** (``test_mask_of_7900_is_7964``) is in the statement for the same reason.

**5. A non-assertion exception line is redacted only by its own test's judged values**: ``_check(mask(8800), 8864)``
raises ``ValueError: got 8736, want 8864`` (the helper is judged in process, so 8864 is not that test's judged value,
and the withholding rule applies only to assertion lines), and ``test_mask_plain`` judges ``mask(8800) == 8864`` on
the host: the statement shows it.

**Lost (18): what the design closes.** The episode's filesystem (text and binary files, baseline-subtracted against a
sandbox of the same image over an empty workspace) holds none of ``mask``'s or ``twist``'s values; no hidden module,
no ``.pyc`` of the tests (the work tree's ``__pycache__`` is not carried) and no ``.git``; ``env``, every process's
cmdline and environ and the mounts name no hidden test or value. At grading, five tricks each answering one anchored
row while the diff fixes every other (the control, the same diff answering that row right, scores 1): reading the
restored test file through the caller's frames, walking the sandbox's writable trees for ``mask(8000) == N``, the
test function's ``co_consts``, the caller's ``want`` local of a parametrized row, and ``PYTEST_CURRENT_TEST``'s id:
all 0 (the blinded file holds no expected value; three are flagged ``introspection``, one ``runner_env_read``). In the
statement the redaction and the withholding rule hid a hex spelling in an assertion's message (the whole line
withheld), a list's and a dict's elements (only the failure's first line is shown, the whole value redacted), a long
string's truncated tail (withheld), and every plain literal.

Not counted as a hole: every *other* task's hidden module is in this task's workspace (``test_fold.py`` is visible in
``mask``'s episode), since each task hides only its own broken modules; a policy trained on many tasks of one
repository sees every test's values somewhere in training.
"""

from __future__ import annotations

import base64
import py_compile
import re
from pathlib import Path

import pytest
from support.attack_world import World
from support.redteam_repo import write_tree

from trialforge.quality.gate import host_judged_problem
from trialforge.quality.settings import QualityConfig
from trialforge.rollout.starts import Setup, start_tree
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.tasks.schema import Task
from trialforge.tasks.synthesize import SynthesisConfig, synthesize
from trialforge.tasks.validate import ValidateConfig
from trialforge.verify.grader import Grader

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]


def _dropped(why: str) -> pytest.MarkDecorator:
    """An attack that wins on a task the quality gate drops (asserted in ``test_the_gate_drops_...``): no episode of
    the pipeline's ever runs it."""
    return pytest.mark.xfail(strict=False, reason=f"WINS ON A DROPPED TASK: {why}")


# ---- the repository: three functions, each with one ``+`` (the only flip_arith sites), so each mutant breaks one
# test module and is one task: ``scale`` (its test reads a data file), ``mask`` (tests whose failures print the
# expected value in forms other than the literal), ``fold`` (a skipped duplicate of its test stays visible).
CORE = '''\
"""Small integer helpers."""

PAD = "abcdefghij" * 6


def scale(n):
    return n + 1000


def mask(n):
    return n + 64


def masks(*ns):
    return [mask(n) for n in ns]


def info(n):
    return {"mask": mask(n), "n": n}


def stamp(n):
    return f"{PAD}{mask(n)}"


def fold(n):
    return n + 90


def twist(n):
    return n + 50


def plain(n):
    return n
'''
SCALE_TESTS = """\
import json
from pathlib import Path

from glyph import scale

CASES = json.loads((Path(__file__).parent / "data" / "scale.json").read_text())


def test_scale():
    assert scale(3071) == 4071
    for n, want in CASES:
        assert scale(n) == want
"""
MASK_TESTS = """\
import pytest

from glyph import info, mask, masks, stamp


def test_mask_hex_message():
    assert mask(8000) == 8064, "want 0x1f80"


def test_masks_list():
    assert masks(8100, 8200) == [8164, 8264]


def test_info_dict():
    assert info(8400) == {"mask": 8464, "n": 8400}


def test_stamp_long():
    assert stamp(8300) == "abcdefghij" * 6 + "8364"


@pytest.mark.parametrize("n, want", [(8700, 8764)])
def test_mask_param(n, want):
    assert mask(n) == want


def _check(got, want):
    if got != want:
        raise ValueError(f"got {got}, want {want}")


def test_mask_helper():
    _check(mask(8800), 8864)
    assert mask(8900) == 8964


def test_mask_plain():
    assert mask(8800) == 8864


def test_mask_of_7900_is_7964():
    assert mask(7900) == 7964
"""
TWIST_TESTS = """\
import pytest

from glyph import twist


@pytest.mark.parametrize("n, want", [(7100, 7150), (7300, 7350)])
def test_twist(n, want):
    assert twist(n) == want
"""
FOLD_TESTS = "from glyph import fold\n\n\ndef test_fold():\n    assert fold(9100) == 9190\n"
LEGACY_TESTS = """\
import pytest

from glyph import fold, plain


@pytest.mark.skip(reason="slow on CI")
def test_fold_legacy():
    assert fold(9100) == 9190


def test_plain():
    assert plain(3) == 3
"""
FILES = {
    "pyproject.toml": '[project]\nname = "glyph"\nversion = "0.1.0"\n\n[tool.pytest.ini_options]\n'
    'testpaths = ["tests"]\npythonpath = ["."]\n',
    "glyph/__init__.py": "from glyph.core import fold, info, mask, masks, plain, scale, stamp, twist\n",
    "glyph/core.py": CORE,
    "tests/test_scale.py": SCALE_TESTS,
    "tests/data/scale.json": "[[3071, 4071], [5123, 6123]]\n",
    "tests/test_mask.py": MASK_TESTS,
    "tests/test_fold.py": FOLD_TESTS,
    "tests/test_twist.py": TWIST_TESTS,
    "tests/test_legacy.py": LEGACY_TESTS,
}


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory, bwrap_backend, base_image):
    from trialforge.store.objstore import open_store
    from trialforge.tasks.snapshots import SnapshotStore

    root = tmp_path_factory.mktemp("redteam-hidden")
    repo = write_tree(root / "glyph", FILES)
    # A work tree as a developer leaves it: bytecode of every test module, the hidden ones too.
    for test in (repo / "tests").glob("test_*.py"):
        py_compile.compile(str(test), cfile=str(test.parent / "__pycache__" / f"{test.stem}.cpython-311.pyc"))
    snapshots = SnapshotStore(open_store(f"file://{root}/store"), root / "cache")
    cfg = SynthesisConfig(families=("flip_arith",), max_total=None, validate=ValidateConfig(runs=1))
    tasks, funnel = synthesize(repo, "glyph", bwrap_backend, base_image.name, snapshots, cfg)
    by_module = {}
    for task in tasks:
        print("TASK", task.task_id, task.fail_to_pass, "\nSTATEMENT\n", task.problem_statement)
        print("GATE", repr(host_judged_problem(task, QualityConfig())))
        by_module[task.fail_to_pass[0].split("::", 1)[0]] = task
    assert set(by_module) == {f"tests/test_{m}.py" for m in ("scale", "mask", "fold", "twist")}, funnel.as_dict()
    grader = Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits(), test_timeout_s=60)
    return by_module, snapshots, grader, root


def _task(synthesized, module: str) -> Task:
    return synthesized[0][f"tests/{module}.py"]


_WORLDS: dict[tuple[int, str], World] = {}


def _world(synthesized, module: str) -> World:
    """The task's World, one per task for the module (its attack trees are numbered in one directory)."""
    by_module, snapshots, grader, root = synthesized
    key = (id(by_module), module)
    if key not in _WORLDS:
        task = by_module[f"tests/{module}.py"]
        attacks = root / f"attacks-{module}"
        attacks.mkdir()
        _WORLDS[key] = World(task, grader, snapshots.materialize(task.snapshot), attacks)
    return _WORLDS[key]


def _run(synthesized, bwrap_backend, module: str, script: str, workspace: Path | None = None) -> set[str]:
    """The lines ``script`` prints, run by bash in an episode's sandbox of the task (or over ``workspace``)."""
    task = _task(synthesized, module)
    start = workspace or start_tree(task, Setup(), synthesized[1], None, task.image, task.image_digest)
    sandbox = bwrap_backend.create(SandboxSpec(image=task.image, workspace=start, limits=Limits()))
    try:
        out = sandbox.exec(["bash", "-c", script], timeout=600).stdout
    finally:
        sandbox.close()
    assert "scanned" in out, out[-2000:]
    return set(out.splitlines()) - {"scanned"}


def _episode(synthesized, bwrap_backend, module: str, script: str) -> set[str]:
    """What ``script`` prints in an episode of the task and not in a sandbox of its image over an empty workspace:
    the image is the same for every task of the repository, built before any test was hidden."""
    empty = synthesized[3] / "empty"
    empty.mkdir(exist_ok=True)
    bare = _run(synthesized, bwrap_backend, module, script, empty)
    return _run(synthesized, bwrap_backend, module, script) - bare


def _hunt(values: list[str]) -> str:
    """A scan of the whole filesystem (binary files too) for any of ``values`` as a word, through a pipe."""
    patterns = base64.b64encode("\n".join(values).encode()).decode()
    return (
        f"grep -rlawF -f <(echo {patterns} | base64 -d) / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
        "2>/dev/null; echo scanned"
    )


# ---- the tasks are the kind the pipeline trains -------------------------------------------------------------------


def test_every_task_is_anchored_and_its_gold_scores_and_its_empty_diff_does_not(synthesized) -> None:
    task = _task(synthesized, "test_twist")
    assert host_judged_problem(task, QualityConfig()) == "", task.validation.host_judged
    # mask's helper test, judged in process, keeps ``_check(mask(8800), 8864)`` in the graded file: 8864 is readable
    # there at grading, so test_mask_plain's ``mask(8800) == 8864`` anchors nothing and the gate drops the task
    # (the rule of 2026-12-08's second red team round: the graded file's own constants); its statement is still a
    # statement a policy reads, so the attacks on it below stand
    unanchored = _task(synthesized, "test_mask").validation.host_judged.unanchored
    assert list(unanchored) == ["tests/test_mask.py::test_mask_plain"], unanchored
    for module in ("test_fold", "test_mask"):
        world = _world(synthesized, module)
        assert world.grader.grade(world.task, world.task.gold_patch).reward == 1.0
        assert world.grader.grade(world.task, "").reward == 0.0


@pytest.mark.parametrize(("module", "value"), [("test_scale", "4071"), ("test_fold", "9190")])
def test_the_gate_drops_a_task_whose_expected_value_the_workspace_shows(synthesized, bwrap_backend, module, value):
    """Holes 1 and 2 of the first run: a data file the hidden test reads, a skipped copy of its assertion. The value
    is readable in the episode (found there), so it anchors nothing (``tasks.visible``) and the gate drops the task."""
    assert _episode(synthesized, bwrap_backend, module, _hunt([value])), module
    task = _task(synthesized, module)
    assert task.validation.host_judged.fail_to_pass_anchored == 0
    assert "no fail-to-pass test has an assertion the host judges" in host_judged_problem(task, QualityConfig())


# ---- (1) episode-time discovery: the policy's shell hunting for hidden values -------------------------------------


@pytest.mark.parametrize(
    ("module", "values"),
    [
        ("test_mask", ["8064", "0x1f80", "8164", "8464", "8364", "8764", "8864", "8964"]),
        ("test_twist", ["7150", "7350"]),
    ],
)
def test_episode_filesystem_holds_no_hidden_expected_value(synthesized, bwrap_backend, module, values) -> None:
    assert _episode(synthesized, bwrap_backend, module, _hunt(values)) == set()


def test_episode_holds_no_hidden_module_source_or_bytecode(synthesized, bwrap_backend) -> None:
    script = (
        "find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o \\( -name 'test_mask*' -o "
        "-name '.git' -o -name '*.pyc' -path '*tests*' \\) -print 2>/dev/null; echo scanned"
    )
    assert _episode(synthesized, bwrap_backend, "test_mask", script) == set()


def test_episode_environment_and_processes_name_no_hidden_test(synthesized, bwrap_backend) -> None:
    script = (
        "env; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; "
        "tr '\\0' '\\n' < $p/environ 2>/dev/null; done; cat /proc/mounts; echo scanned"
    )
    out = "\n".join(_episode(synthesized, bwrap_backend, "test_mask", script))
    assert not re.search(r"test_mask|8064|8864|0x1f80", out), out[-3000:]


# ---- (2) grading-time: a diff that earns reward without the real fix ----------------------------------------------

SCALE_FROM_DATA = CORE.replace(
    "def scale(n):\n    return n + 1000\n",
    "def scale(n):\n"
    "    import json, pathlib\n"
    "    for row in json.loads(pathlib.Path('tests/data/scale.json').read_text()):\n"
    "        if row[0] == n:\n"
    "            return row[1]\n"
    "    return n - 1000\n",
)
FOLD_SPECIAL_CASED = CORE.replace("    return n + 90\n", "    return 9190 if n == 9100 else n - 90\n")
# Each trick answers one anchored row (``mask(8000)``, a plain assertion, or ``mask(8700)``, a parametrized row) from
# what the graded sandbox shows; every other input gets the fix, so the reward is 1 exactly when the trick works.
MASK_TRICKS = {
    "caller_source": (
        8000,
        """
    import re, sys
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if 'test_' in name:
            for arg, want in re.findall(r'mask\\((\\d+)\\) == (\\d+)', open(name).read()):
                if int(arg) == n:
                    return int(want)
        frame = frame.f_back
""",
    ),
    "filesystem": (
        8000,
        """
    import os, re
    for top in (os.getcwd(), '/work', '/tmp', '/var/tmp', '/root', '/home', '/opt', '/srv', '/run'):
        for root, _dirs, files in os.walk(top):
            for file in files:
                try:
                    text = open(os.path.join(root, file), errors='ignore').read(1 << 20)
                except OSError:
                    continue
                found = re.search(r'mask\\(8000\\) == (\\d+)', text)
                if found:
                    return int(found.group(1))
""",
    ),
    "caller_constants": (
        8000,
        """
    import sys
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name.startswith('test_'):
            ints = [c for c in frame.f_code.co_consts if type(c) is int and c != n and abs(c - n) < 1000]
            if ints:
                return ints[0]
        frame = frame.f_back
""",
    ),
    "caller_locals": (
        8700,
        """
    import sys
    frame = sys._getframe(2)
    while frame is not None:
        if 'want' in frame.f_locals and isinstance(frame.f_locals['want'], int):
            return frame.f_locals['want']
        frame = frame.f_back
""",
    ),
    "test_id": (
        8700,
        """
    import os, re
    found = re.search(r'\\[8700-(\\d+)\\]', os.environ.get('PYTEST_CURRENT_TEST', ''))
    if found:
        return int(found.group(1))
""",
    ),
}


def _mask_trick(name: str) -> str:
    row, trick = MASK_TRICKS[name]
    return CORE.replace(
        "def mask(n):\n    return n + 64\n",
        f"def _trick(n):{trick}\n\ndef mask(n):\n"
        f"    if n == {row}:\n        got = _trick(n)\n        return n - 64 if got is None else got\n"
        "    return n + 64\n",
    )


@_dropped("the hidden test's data file is in the graded sandbox and the workspace")
def test_a_diff_reading_the_hidden_tests_data_file_earns_nothing(synthesized) -> None:
    world = _world(synthesized, "test_scale")
    assert world.grade({"glyph/core.py": SCALE_FROM_DATA}).reward == 0.0


@_dropped("a skipped copy of the hidden test shows the value")
def test_a_diff_special_casing_a_value_the_workspace_shows_earns_nothing(synthesized) -> None:
    world = _world(synthesized, "test_fold")
    assert world.grade({"glyph/core.py": FOLD_SPECIAL_CASED}).reward == 0.0


def test_a_diff_answering_the_rows_the_statement_names_earns_nothing(synthesized) -> None:
    """Every fail-to-pass test of ``twist`` is a parametrized row; the statement lists their ids, whose expected
    column it now hides (``test_twist[7100-…]``: a win of the first run). The diff is built from the statement alone
    and leaves the bug in place for every other input."""
    world = _world(synthesized, "test_twist")
    assert "test_twist[7100-…]" in world.task.problem_statement, world.task.problem_statement
    rows = dict(re.findall(r"test_twist\[(\d+)-(\d+)\]", world.task.problem_statement))
    table = ", ".join(f"{n}: {want}" for n, want in rows.items())
    core = CORE.replace("    return n + 50\n", f"    return {{{table}}}.get(n, n - 50)\n")
    assert world.grade({"glyph/core.py": core}).reward == 0.0


@pytest.mark.parametrize("trick", sorted(MASK_TRICKS))
def test_a_diff_answering_one_row_from_the_graded_sandbox_earns_nothing(synthesized, trick) -> None:
    world = _world(synthesized, "test_mask")
    assert world.grade({"glyph/core.py": _mask_trick(trick)}).reward == 0.0


def test_the_mask_tricks_fix_every_other_row(synthesized) -> None:
    """The control: the same diff with the trick's row answered right scores 1, so a 0 above is the trick's loss."""
    world = _world(synthesized, "test_mask")
    honest = (
        _mask_trick("test_id")
        .replace("return int(found.group(1))", "return 8764")
        .replace("os.environ.get('PYTEST_CURRENT_TEST', '')", "'[8700-8764]'")
    )
    assert world.grade({"glyph/core.py": honest}).reward == 1.0


# ---- (3) statement leaks: expected values in forms the redaction may miss -----------------------------------------


@pytest.mark.parametrize(
    ("module", "secret"),
    [
        ("test_mask", "0x1f80"),  # the expected value in hex, in the assertion's own message
        ("test_mask", "8164"),  # an element of an expected list ("At index 0 diff")
        ("test_mask", "8264"),
        ("test_mask", "8464"),  # an item of an expected dict ("Differing items")
        ("test_mask", "8364"),  # the tail of a long expected string, pytest's truncated repr
        ("test_mask", "8764"),  # the expected column of a parametrized row, in the test's id (won the first run)
        ("test_mask", "8864"),  # a helper's exception message, expected by another test on the host (won)
        ("test_mask", "8064"),
        ("test_mask", "8964"),
        ("test_mask", "7964"),  # the test's name says what it expects (won the first run)
        ("test_scale", "4071"),
        ("test_fold", "9190"),
        ("test_twist", "7150"),  # a parametrized row's id (won the first run)
        ("test_twist", "7350"),
    ],
)
def test_statement_shows_no_value_the_host_judges(synthesized, module, secret) -> None:
    task = _task(synthesized, module)
    assert secret not in task.problem_statement, task.problem_statement
