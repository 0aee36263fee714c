"""Synthetic tasks: every mutation family on a snippet, minimal edits, gold patches, screening, statements, e2e."""

from __future__ import annotations

import base64
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from trialforge.rollout.starts import Setup, start_tree
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.tasks.mutations import (
    FAMILIES,
    Edit,
    Mutant,
    compile_error,
    library_files,
    mutants_of_source,
    sample_mutants,
)
from trialforge.tasks.patches import apply_patch, diff_trees, touched_paths
from trialforge.tasks.statements import Screened, changed_lines, public_names, write_statement
from trialforge.tasks.synthesize import SynthesisConfig, synthesize
from trialforge.tasks.validate import ValidateConfig

REPOS = Path(__file__).resolve().parents[1] / "tasks_src" / "repos"
BUNDLED = ("ledgerlite", "textkit", "schedwise")


def mutate(family: str, source: str) -> list[str]:
    """Every mutant text ``family`` makes of ``source`` (dedented), in enumeration order."""
    text = textwrap.dedent(source)
    return [m.apply(text) for m in mutants_of_source("m.py", text, [family])]


def body(source: str) -> str:
    return textwrap.dedent(source)


# --- one snippet per family ---------------------------------------------------------------------


@pytest.mark.pure
def test_flip_compare_moves_a_boundary_or_reverses_the_order() -> None:
    src = "def f(a, b):\n    return a < b\n"
    assert mutate("flip_compare", src) == ["def f(a, b):\n    return a <= b\n", "def f(a, b):\n    return a > b\n"]
    assert mutate("flip_compare", "def f(x, xs):\n    return x not in xs\n") == ["def f(x, xs):\n    return x in xs\n"]


@pytest.mark.pure
def test_flip_boolean_swaps_and_with_or() -> None:
    assert mutate("flip_boolean", "def f(a, b):\n    return a and (b)\n") == ["def f(a, b):\n    return a or (b)\n"]


@pytest.mark.pure
def test_flip_arith_flips_operators_but_leaves_string_concatenation_alone() -> None:
    assert mutate("flip_arith", "def f(a, b):\n    return a - b\n") == ["def f(a, b):\n    return a + b\n"]
    assert mutate("flip_arith", "def f(n):\n    n += 1\n    return n\n") == ["def f(n):\n    n -= 1\n    return n\n"]
    assert mutate("flip_arith", "def f(a):\n    return 'x' + a\n") == []


@pytest.mark.pure
def test_off_by_one_shifts_bounds_indices_and_range_arguments() -> None:
    assert mutate("off_by_one", "def f(xs, n):\n    return xs[:n]\n") == [
        "def f(xs, n):\n    return xs[:n + 1]\n",
        "def f(xs, n):\n    return xs[:n - 1]\n",
    ]
    assert mutate("off_by_one", "def f(xs):\n    return xs[-1]\n") == [
        "def f(xs):\n    return xs[0]\n",
        "def f(xs):\n    return xs[-2]\n",
    ]
    assert "def f(n):\n    return range(n + 1)\n" in mutate("off_by_one", "def f(n):\n    return range(n)\n")
    assert mutate("off_by_one", "def f(xs):\n    return len(xs) + 1\n") == ["def f(xs):\n    return len(xs)\n"]
    assert mutate("off_by_one", "def f(xs, n):\n    return xs[:n + 1]\n") == [  # an offset moves, never stacks
        "def f(xs, n):\n    return xs[:n]\n",
        "def f(xs, n):\n    return xs[:n + 2]\n",
    ]


@pytest.mark.pure
def test_change_constant_moves_numbers_and_flips_booleans() -> None:
    assert mutate("change_constant", "def f():\n    return 10\n") == [
        "def f():\n    return 11\n",
        "def f():\n    return 9\n",
    ]
    assert mutate("change_constant", "def f():\n    return True\n") == ["def f():\n    return False\n"]
    assert mutate("change_constant", "def f():\n    return 'text'\n") == []


@pytest.mark.pure
def test_swap_args_exchanges_neighbours_except_for_commutative_calls() -> None:
    assert mutate("swap_args", "def f(a, b):\n    return g(a, b)\n") == ["def f(a, b):\n    return g(b, a)\n"]
    assert mutate("swap_args", "def f(a, b):\n    return min(a, b)\n") == []


@pytest.mark.pure
def test_drop_statement_deletes_whole_lines_and_keeps_blocks_valid() -> None:
    src = body("""\
        def f(xs):
            out = []
            for x in xs:
                out.append(x)  # keep
            return out
        """)
    assert mutate("drop_statement", src) == [
        "def f(xs):\n    for x in xs:\n        out.append(x)  # keep\n    return out\n",
        "def f(xs):\n    out = []\n    for x in xs:\n        pass\n    return out\n",
    ]


@pytest.mark.pure
def test_drop_branch_removes_else_elif_and_guard_blocks() -> None:
    src = body("""\
        def f(x):
            if x < 0:
                raise ValueError(x)
            if x == 0:
                y = 1
            elif x == 1:
                y = 2
            else:
                y = 3
            return y
        """)
    out = mutate("drop_branch", src)
    assert src.replace("    if x < 0:\n        raise ValueError(x)\n", "") in out
    assert src.replace("    elif x == 1:\n        y = 2\n", "") in out
    assert src.replace("    else:\n        y = 3\n", "") in out
    assert mutate("drop_branch", "def f(c):\n    return 1 if c else 2\n") == [
        "def f(c):\n    return 1\n",
        "def f(c):\n    return 2\n",
    ]


@pytest.mark.pure
def test_invert_condition_adds_or_removes_not() -> None:
    assert mutate("invert_condition", "def f(x):\n    if x:\n        return 1\n") == [
        "def f(x):\n    if not x:\n        return 1\n"
    ]
    assert mutate("invert_condition", "def f(x):\n    while not (x):\n        x()\n") == [
        "def f(x):\n    while (x):\n        x()\n"
    ]
    assert mutate("invert_condition", "def f(a, b):\n    return [1 for _ in a if a and b]\n") == [
        "def f(a, b):\n    return [1 for _ in a if not (a and b)]\n"
    ]


@pytest.mark.pure
def test_wrong_return_returns_another_local_or_none() -> None:
    src = "def f(x):\n    y = x * 2\n    return y\n"
    assert mutate("wrong_return", src) == [
        "def f(x):\n    y = x * 2\n    return x\n",
        "def f(x):\n    y = x * 2\n    return None\n",
    ]


@pytest.mark.pure
def test_wrong_callee_calls_a_twin_or_a_sibling_function() -> None:
    assert mutate("wrong_callee", "def f(a, b):\n    return max(a, b)\n") == ["def f(a, b):\n    return min(a, b)\n"]
    assert mutate("wrong_callee", "def f(s):\n    return s.lower()\n") == ["def f(s):\n    return s.upper()\n"]
    src = body("""\
        def snake(t):
            return t
        def kebab(t):
            return t
        def g(t):
            return snake(t)
        """)
    assert mutate("wrong_callee", src) == [src.replace("return snake(t)", "return kebab(t)")]


@pytest.mark.pure
def test_drop_argument_drops_the_last_optional_looking_argument() -> None:
    assert mutate("drop_argument", "def f(xs):\n    return sorted(xs, key=len)\n") == [
        "def f(xs):\n    return sorted(xs)\n"
    ]
    assert mutate("drop_argument", "def f(x):\n    return round(x, 2)\n") == ["def f(x):\n    return round(x)\n"]
    assert mutate("drop_argument", "def f(x):\n    return abs(x)\n") == []


@pytest.mark.pure
def test_every_family_has_a_snippet_test() -> None:
    tested = {name.split("_", 1)[1] for name in globals() if name.startswith("test_")}
    assert all(any(t.startswith(family) for t in tested) for family in FAMILIES)


@pytest.mark.pure
def test_docstrings_annotations_and_module_level_code_are_never_mutated() -> None:
    src = body('''\
        LIMIT = 3
        def f(x: list[int] = [1]) -> int:
            """Returns 1 < 2."""
            y: int = 0
            return y
        ''')
    for mutant in mutants_of_source("m.py", src):
        assert mutant.line >= 4, mutant


# --- edits are minimal, mutants compile, gold patches revert ------------------------------------


def _bundled_mutants() -> list[tuple[Mutant, str]]:
    out = []
    for repo in BUNDLED:
        for rel in library_files(REPOS / repo):
            text = (REPOS / repo / rel).read_text()
            out += [(m, text) for m in mutants_of_source(f"{repo}/{rel}", text)]
    return out


@pytest.mark.pure
def test_library_files_exclude_tests_and_config() -> None:
    files = library_files(REPOS / "textkit")
    assert "textkit/slug.py" in files
    assert not [f for f in files if f.startswith("tests/") or f.endswith("conftest.py")]


@pytest.mark.pure
def test_bundled_mutants_compile_and_touch_only_their_span() -> None:
    mutants = _bundled_mutants()
    assert len({m.family for m, _ in mutants}) == len(FAMILIES) >= 8
    for mutant, text in mutants:
        assert compile_error(mutant, text) is None, mutant
        old, new = text.splitlines(), mutant.apply(text).splitlines()
        assert old[: mutant.line - 1] == new[: mutant.line - 1]  # nothing above the span changes
        removed = len(old) - len(new)
        assert old[mutant.end_line :] == new[mutant.end_line - removed :]  # nor anything below it


@pytest.mark.pure
def test_compile_error_reports_broken_and_equivalent_mutants() -> None:
    text = "def f(a):\n    return a\n"
    broken = Mutant("flip_compare", "m.py", 2, 2, (), "")
    assert compile_error(broken, text) is not None  # no edits: compiles to the same code
    bad = Mutant("drop_statement", "m.py", 2, 2, (Edit(text.index("return"), len(text), "return (\n"),), "")
    assert compile_error(bad, text).startswith("SyntaxError")


@pytest.mark.pure
def test_gold_patch_reverts_the_mutant_exactly(tmp_path: Path) -> None:
    original = tmp_path / "orig"
    shutil.copytree(REPOS / "schedwise", original, ignore=shutil.ignore_patterns("__pycache__"))
    sources = {rel: (original / rel).read_text() for rel in library_files(original)}
    mutants = [m for rel, text in sources.items() for m in mutants_of_source(rel, text)]
    for mutant in sample_mutants(mutants, max_per_file=None, max_total=24, seed=1):
        tree = tmp_path / mutant.digest
        shutil.copytree(original, tree)
        (tree / mutant.path).write_text(mutant.apply(sources[mutant.path]))
        gold = diff_trees(tree, original)
        assert gold.count("\n+++ ") == 1 and len(changed_lines(gold)) <= 2 * (mutant.end_line - mutant.line + 1)
        apply_patch(tree, gold)
        assert (tree / mutant.path).read_text() == sources[mutant.path]
        assert diff_trees(tree, original) == ""


@pytest.mark.pure
def test_sampling_is_seeded_capped_and_family_balanced() -> None:
    mutants = [m for m, _ in _bundled_mutants()]
    first = sample_mutants(mutants, max_per_file=30, max_total=60, seed=7)
    assert first == sample_mutants(mutants, max_per_file=30, max_total=60, seed=7)
    assert first != sample_mutants(mutants, max_per_file=30, max_total=60, seed=8)
    assert len(first) == 60 and len(set(first)) == 60
    per_family = {f: sum(m.family == f for m in first) for f in FAMILIES}
    assert min(per_family.values()) >= 3  # round-robin: no family is crowded out
    per_file = [m for m in sample_mutants(mutants, max_per_file=2, max_total=None, seed=0)]
    assert max(sum(m.path == p for m in per_file) for p in {m.path for m in per_file}) == 2


# --- statements ----------------------------------------------------------------------------------

PYTEST_LOG = """\
=================================== FAILURES ===================================
_____________________________ test_slugify_basics ______________________________
tests/test_slug.py:7: in test_slugify_basics
    assert slugify("Hello, World!") == "hello-world"
textkit/slug.py:23: in slugify
    if max_length is None and len(slug) > max_length:
E   TypeError: '>' not supported between instances of 'int' and 'NoneType'
_______________________________ test_unique_slug _______________________________
tests/test_slug.py:29: in test_unique_slug
    assert unique_slug("Report", taken) == "report-3"
E   AssertionError: assert 'report-1' == 'report-3'
=========================== short test summary info ============================
"""
SECRET_OLD = "if max_length is not None and len(slug) > max_length:"
SECRET_NEW = "if max_length is None and len(slug) > max_length:"


def _screened(log: str = PYTEST_LOG) -> Screened:
    mutant = Mutant("flip_compare", "textkit/slug.py", 23, 23, (), "")
    return Screened(mutant, ("tests/test_slug.py::test_slugify_basics", "tests/test_slug.py::test_unique_slug"), log)


def _public() -> dict[str, str]:
    sources = {rel: (REPOS / "textkit" / rel).read_text() for rel in library_files(REPOS / "textkit")}
    return public_names(sources)


@pytest.mark.pure
def test_statement_reports_behaviour_without_the_changed_code_or_its_position() -> None:
    statement = write_statement("textkit", _screened(), _public(), [SECRET_NEW, SECRET_OLD])
    assert statement is not None
    assert "`slugify` fails with TypeError" in statement
    assert "tests/test_slug.py::test_unique_slug" in statement
    assert "`unique_slug(\"Report\", taken)` returns `'report-1'`, which is wrong." in statement
    # the failing tests are hidden from the policy: neither their code nor a value they expect is in the statement
    assert "report-3" not in statement and "hello-world" not in statement and "assert " not in statement
    assert SECRET_NEW not in statement and SECRET_OLD not in statement
    assert "slug.py:23" not in statement and "flip_compare" not in statement


@pytest.mark.pure
def test_statement_for_a_missing_exception_names_the_function_from_the_test_name() -> None:
    log = PYTEST_LOG.replace("test_slugify_basics", "test_slugify_rejects_empty_separator").replace(
        '    assert slugify("Hello, World!") == "hello-world"', "    with pytest.raises(ValueError):"
    )
    log = log.replace("E   TypeError: '>' not supported between instances of 'int' and 'NoneType'",
                      "E   Failed: DID NOT RAISE <class 'ValueError'>")  # fmt: skip
    item = _screened(log)
    item = Screened(item.mutant, ("tests/test_slug.py::test_slugify_rejects_empty_separator",), log)
    statement = write_statement("textkit", item, _public(), [SECRET_NEW, SECRET_OLD])
    assert statement is not None and statement.startswith("`slugify` no longer raises ValueError")
    assert "one test" in statement and "pytest.raises" not in statement  # what went wrong, not the hidden test


@pytest.mark.pure
def test_a_failure_the_log_tail_lost_is_stated_from_its_exception_line_and_its_name() -> None:
    """A long run's log keeps only its last failures: the others give the title their exception type, and the
    function their name is about, never what they expect."""
    item = _screened("")  # nothing of the log is left
    said = {"tests/test_slug.py::test_unique_slug": "AssertionError: assert 'report-1' == 'report-3'",
            "tests/test_slug.py::test_slugify_basics": "TypeError: '>' not supported"}  # fmt: skip
    statement = write_statement("textkit", Screened(item.mutant, item.broke, "", said), _public(), [SECRET_NEW])
    assert statement is not None and statement.startswith("`slugify` fails with TypeError")
    assert "report-3" not in statement


@pytest.mark.pure
def test_a_method_the_test_called_is_stated_by_name_not_by_its_objects_address() -> None:
    log = PYTEST_LOG.replace(
        "E   AssertionError: assert 'report-1' == 'report-3'",
        "E   AssertionError: assert 'report-1' == 'report-3'\n"
        "E    +  where 'report-1' = <bound method Slugs.unique of <textkit.slug.Slugs object at 0x7f47de2d790>>('R')",
    )
    statement = write_statement("textkit", _screened(log), _public(), [SECRET_NEW])
    assert statement is not None and "`Slugs.unique('R')` returns `'report-1'`, which is wrong." in statement
    assert "0x7f" not in statement  # the same task states the same text on every run


@pytest.mark.pure
def test_statement_is_refused_when_the_evidence_itself_shows_the_change() -> None:
    leaky = PYTEST_LOG.replace("E   AssertionError: assert 'report-1' == 'report-3'", f"E   {SECRET_NEW}")
    statement = write_statement("textkit", _screened(leaky), _public(), [SECRET_NEW])
    assert statement is None or SECRET_NEW not in statement  # the line is filtered out, never shown
    # What cannot be filtered out (the repository's name, the failing tests' names) refuses the statement.
    assert write_statement("textkit", _screened(), _public(), ["test_unique_slug"]) is None


# --- screening and end to end (real bubblewrap sandboxes) ----------------------------------------


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    from trialforge.store.objstore import open_store
    from trialforge.tasks.snapshots import SnapshotStore

    root = tmp_path_factory.mktemp("synth-store")
    return SnapshotStore(open_store(f"file://{root}/store"), root / "cache")


@pytest.mark.sandbox
def test_a_candidate_that_breaks_no_test_is_dropped(tmp_path, bwrap_backend, base_image, snapshots) -> None:
    repo = tmp_path / "tiny"
    (repo / "tiny").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "tiny" / "__init__.py").write_text("def used(a):\n    return a\n\n\ndef unused(a):\n    return a + 2\n")
    (repo / "tests" / "test_tiny.py").write_text(
        "from tiny import used\n\n\ndef test_used():\n    assert used(3) == 3\n"
    )
    cfg = SynthesisConfig(families=("flip_arith",), max_total=None, validate=ValidateConfig(runs=1))
    tasks, funnel = synthesize(repo, "tiny", bwrap_backend, base_image.name, snapshots, cfg)
    assert tasks == []
    assert funnel.as_dict()["by_family"]["flip_arith"]["candidates"] == 1
    assert funnel.dropped == {"no_test_broke": 1}
    assert funnel.details[0]["ref"] == "flip_arith:tiny/__init__.py:6"


@pytest.fixture(scope="module")
def synthesized(bwrap_backend, base_image, snapshots):
    cfg = SynthesisConfig(max_total=5, seed=3, validate=ValidateConfig(runs=1))
    return synthesize(REPOS / "textkit", "textkit", bwrap_backend, base_image.name, snapshots, cfg)


@pytest.mark.sandbox
def test_end_to_end_tasks_are_validated_and_reproducible(synthesized, snapshots, tmp_path) -> None:
    tasks, funnel = synthesized
    assert tasks, funnel.as_dict()
    stages = funnel.as_dict()["stages"]
    assert stages["candidates"] == funnel.seen == 5 and stages["validated"] == funnel.kept == len(tasks)
    assert funnel.seen == funnel.kept + sum(funnel.dropped.values())
    timings = funnel.timings
    assert timings.tests_s > 0 and timings.sandbox_s > 0 and timings.wall_s >= timings.tests_s
    for task in tasks:
        assert task.validation.valid and task.fail_to_pass and task.pass_to_pass
        assert re.fullmatch(r"textkit-syn-[0-9a-f]{10}", task.task_id) and task.source.kind == "synthetic"
        family, path, line = task.source.ref.split(":")
        assert family in FAMILIES and path.startswith("textkit/") and int(line) > 0
        assert task.image
        tree = tmp_path / task.task_id
        shutil.copytree(snapshots.materialize(task.snapshot), tree)
        # the broken tests are hidden as a mined task's are: every module of a fail-to-pass test is out of the
        # snapshot (the policy's workspace) and comes back with the test patch
        hidden = {t.split("::", 1)[0] for t in task.fail_to_pass}
        assert hidden and not any((tree / rel).exists() for rel in hidden)
        assert sorted(touched_paths(task.test_patch)) == sorted(hidden)
        apply_patch(tree, task.test_patch)
        apply_patch(tree, task.gold_patch)
        assert diff_trees(tree, REPOS / "textkit") == ""  # the two patches restore the working repository


@pytest.mark.sandbox
def test_no_line_of_a_hidden_test_is_anywhere_an_episode_can_read(synthesized, snapshots, bwrap_backend) -> None:
    """What the policy's code can see, it will use: the hidden tests' assertions (their inputs and expected values)
    must be nowhere in an episode's sandbox, workspace, image or temp dirs alike, as the episode starts it."""
    tasks, _ = synthesized
    for task in tasks:
        lines = {line[1:].strip() for line in task.test_patch.splitlines() if line.startswith("+") and "assert" in line}
        wanted = sorted(line for line in lines if not line.startswith("+++") and len(line) > 12)
        assert wanted, task.task_id
        start = start_tree(task, Setup(), snapshots, None, task.image, task.image_digest)  # no setup: no pool
        sandbox = bwrap_backend.create(SandboxSpec(image=task.image, workspace=start, limits=Limits()))
        try:
            patterns = base64.b64encode("\n".join(wanted).encode()).decode()  # a pipe, never a file it could find
            scan = (f"grep -rIlF -f <(echo {patterns} | base64 -d) / --exclude-dir=proc --exclude-dir=sys "
                    f"--exclude-dir=dev 2>/dev/null; echo scanned")  # fmt: skip
            result = sandbox.exec(["bash", "-c", scan], timeout=600)
        finally:
            sandbox.close()
        assert result.stdout.strip().splitlines() == ["scanned"], (task.task_id, result.stdout[-2000:])


@pytest.mark.sandbox
def test_statements_never_show_the_changed_lines(synthesized) -> None:
    tasks, _ = synthesized
    for task in tasks:
        family, path, line = task.source.ref.split(":")
        statement = task.problem_statement
        for code in changed_lines(task.gold_patch):  # the original and the mutated line text
            assert not re.search(rf"(?<!\w){re.escape(code)}(?!\w)", statement), (task.task_id, code)
        assert family not in statement and f"{Path(path).name}:{line}" not in statement
        assert all(test in statement for test in task.fail_to_pass[:10])
        # validation added what the runs before the fix showed, every value the host judges left out: those are
        # what the hidden tests expect, the statement would hand them back to the policy
        assert "Observed behaviour" in statement and task.statement and task.statement.parts[-1].source == "observed"
        judged = task.validation.host_judged.recorded.values() if task.validation.host_judged else ()
        for value in (v for v in judged if isinstance(v, str) and len(v) >= 4):
            assert repr(value) not in statement and value not in statement, (task.task_id, value)
