"""A repository's own C extension is built wherever its tree changes (issue #45: markupsafe's and simplejson's fixes in
their C code were rejected as fixing nothing, because their pure-Python fallback ran instead).

The fixture is the shape those repositories have: a ``src/`` package whose ``setup.py`` declares an extension, catches a
failed compile to install the pure-Python fallback anyway, and a fix in the C code alone. Detected in a sandbox, built
with the toolchain its image gets, it validates (the compiled code fails before the fix), the gold patch scores 1, an
empty diff 0, a diff that breaks the C build 0 as ``build_failed``, a diff that fixes only the fallback 0 and a diff
carrying a compiled object gets it put back; in a rollout's workspace an edit to the .c file takes effect."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fastcalc import C_BUGGY, C_FIXED, INIT, SETUP, SPEEDUPS
from support.fixtasks import edited_diff, fix_task, rollout_outputs, validated_and_graded
from support.redteam_repo import write_tree

from trialforge.envspec import BUILD_PACKAGES, Build
from trialforge.rollout.starts import Setup, start_tree
from trialforge.sandbox.base import Limits
from trialforge.sandbox.images import BASE_NAME
from trialforge.sandbox.pool import SandboxPool
from trialforge.store.objstore import open_store
from trialforge.tasks.envdetect.resolve import resolve_env
from trialforge.tasks.envimages import provide_images, task_image
from trialforge.tasks.extbuild import BuildFailed, build_tree
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Task
from trialforge.tasks.setupeval import setup_arguments
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader

FILES = {
    "setup.py": SETUP,
    "src/fastcalc/__init__.py": INIT,
    "src/fastcalc/_native.py": "def twice(x):\n    return 2 * x\n",
    "tests/test_basics.py": "import fastcalc\n\n\ndef test_imports():\n    assert fastcalc.twice\n",
}
# The hidden test imports the compiled module by name (as markupsafe's speedups tests do): a test that reached the
# C code only through a right fallback would never validate (fail_to_pass_without_extension).
TEST = "from fastcalc._speedups import twice\n\n\ndef test_twice():\n    assert twice(21) == 42\n"


@pytest.fixture
def snapshots(tmp_path):
    return SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")


@pytest.fixture
def task(tmp_path, snapshots) -> Task:
    """The fix commit: the C code alone changes, with a new test; its image has a compiler (built once a machine)."""
    return _fix_task(tmp_path, snapshots, C_BUGGY, C_FIXED, {"tests/test_twice.py": TEST})


def _fix_task(tmp_path: Path, snapshots: SnapshotStore, buggy: str, fixed_c: str, tests: dict[str, str]) -> Task:
    base, fixed = {**FILES, SPEEDUPS: buggy}, {**FILES, SPEEDUPS: fixed_c, **tests}
    raw = fix_task(tmp_path, snapshots, base, fixed, repo="fastcalc", statement="twice(21) returns 63")
    (provided,), funnel, _ = provide_images([raw], snapshots)
    assert funnel.kept == 1, funnel.details
    return provided


def _new_file(path: str, line: str) -> str:
    """A diff that adds ``path`` holding ``line`` (written by hand: ``diff_trees`` never carries a compiled object)."""
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+{line}\n"


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_extension_is_detected_in_a_sandbox_with_its_toolchain(task):
    env = task.env
    assert env is not None
    assert env.build == Build(extensions=("fastcalc._speedups",), sources=(SPEEDUPS,))
    assert set(BUILD_PACKAGES) <= set(env.system_packages)
    assert env.env.get("PYTHONPATH") == "/work/src"


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["bwrap", "docker"])
def test_a_fix_in_c_code_validates_and_grades_by_the_compiled_code(task, snapshots, tmp_path, backend_name, request):
    backend = request.getfixturevalue(f"{backend_name}_backend")
    typo = edited_diff(task, snapshots, tmp_path / "e", {SPEEDUPS: C_FIXED.replace("return", "retrun")})
    checked, (gold, empty, broken) = validated_and_graded(task, backend, snapshots, typo)
    assert checked.fail_to_pass == ["tests/test_twice.py::test_twice"]
    assert (gold.reward, empty.reward) == (1.0, 0.0)
    assert (broken.reward, broken.reason.split(":")[0]) == (0.0, "build_failed"), broken.reason
    assert "build_failed" in broken.flags and "retrun" in broken.reason


@pytest.mark.sandbox
@pytest.mark.slow
def test_fixing_only_the_fallback_or_carrying_a_compiled_object_scores_0(task, snapshots, tmp_path, bwrap_backend):
    image = task_image(task, bwrap_backend, BASE_NAME).name
    checked = validate_task(task, bwrap_backend, image, snapshots, Limits(), ValidateConfig(runs=1))
    grader = Grader(bwrap_backend, BASE_NAME, "", snapshots, Limits(), test_timeout_s=60)
    native = {"src/fastcalc/_native.py": "def twice(x):\n    return x + x\n"}
    fallback = grader.grade(checked, edited_diff(task, snapshots, tmp_path / "e", native))
    assert fallback.reward == 0.0, fallback.reason
    # a compiled module the diff carries is put back as pristine has it (none): the build makes the one tests import
    planted = "src/fastcalc/_speedups.cpython-311-x86_64-linux-gnu.so"
    carried = grader.grade(checked, _new_file(planted, "not an ELF file"))
    assert carried.reward == 0.0 and planted in carried.provenance["dropped_paths"].split(","), carried
    assert grader._pristine_builds.hits == 1  # neither diff touched a build input: the pristine build, made once
    # a setup.py that writes beside the modules as it builds (here: a package that would pass): the build works on a
    # copy, and nothing but the declared modules comes back to the tree the tests run on
    forge = "open('src/fastcalc/__init__.py', 'w').write('def twice(x):\\n    return 2 * x\\n')\n"
    forged = grader.grade(checked, edited_diff(task, snapshots, tmp_path / "f", {"setup.py": forge + SETUP}))
    assert forged.reward == 0.0 and "build_failed" not in forged.flags, forged.reason


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_base_tree_that_does_not_build_is_an_environment_rejection(task, snapshots, tmp_path, bwrap_backend):
    image = task_image(task, bwrap_backend, BASE_NAME).name
    tree = tmp_path / "broken"
    write_tree(tree, {**FILES, SPEEDUPS: C_BUGGY + "#error the base tree does not compile\n"})
    assert task.env is not None and task.env.build is not None
    with pytest.raises(BuildFailed, match=r"BuildFailed: .*error"):
        build_tree(bwrap_backend, image, tree, task.env.build, Limits(), "test")
    bare = task.model_copy(update={"snapshot": snapshots.put(tree)})
    checked = validate_task(bare, bwrap_backend, image, snapshots, Limits(), ValidateConfig(runs=1))
    assert checked.validation.reason.startswith("build_failed_before_fix: "), checked.validation.reason


@pytest.mark.sandbox
@pytest.mark.slow
def test_an_edit_to_the_c_file_takes_effect_in_the_rollout_workspace(task, snapshots, bwrap_backend):
    image = task_image(task, bwrap_backend, BASE_NAME).name
    command = "PYTHONPATH=src python3 -c 'import fastcalc; print(fastcalc.twice(21))'"
    edits = [(SPEEDUPS, "3 * x", "2 * x"), (SPEEDUPS, "return PyLong", "retrun PyLong")]
    before, fixed, failed = rollout_outputs(bwrap_backend, image, task, snapshots, command, edits)
    assert (before.splitlines()[-1], fixed.splitlines()[-1]) == ("63", "42")
    assert failed.startswith("[the extension modules did not build: ") and failed.splitlines()[-1] == "42"


# markupsafe's eb9c1d434ba7: the unfixed C code crashes the interpreter on the new test (a NULL dereference)
C_CRASHING = C_FIXED.replace(
    "return PyLong_FromLong(2 * x);",
    "if (x < 0) { PyObject *none = NULL; Py_INCREF(none); }\n    return PyLong_FromLong(2 * x);",
)
NEGATIVE = "from fastcalc._speedups import twice\n\n\ndef test_negative():\n    assert twice(-1) == -2\n"


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_test_that_crashes_the_interpreter_before_the_fix_is_fail_to_pass(tmp_path, snapshots, bwrap_backend):
    task = _fix_task(tmp_path, snapshots, C_CRASHING, C_FIXED, {"tests/test_negative.py": NEGATIVE})
    image = task_image(task, bwrap_backend, BASE_NAME).name
    checked = validate_task(task, bwrap_backend, image, snapshots, Limits(), ValidateConfig(runs=1))
    assert checked.validation.valid, checked.validation.reason
    assert checked.fail_to_pass == ["tests/test_negative.py::test_negative"]
    assert checked.pass_to_pass == ["tests/test_basics.py::test_imports"]
    grader = Grader(bwrap_backend, BASE_NAME, "", snapshots, Limits(), test_timeout_s=60)
    assert (grader.grade(checked, checked.gold_patch).reward, grader.grade(checked, "").reward) == (1.0, 0.0)


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_rollout_starts_from_its_tree_with_the_extension_built_and_its_diff_carries_no_object(
    task, snapshots, bwrap_backend
):
    image = task_image(task, bwrap_backend, BASE_NAME)
    pool = SandboxPool(bwrap_backend, Limits())
    try:
        start = start_tree(task, Setup(), snapshots, pool, image.name, image.digest)
    finally:
        pool.close()
    built = sorted(p.name for p in (start / "src" / "fastcalc").iterdir() if p.name.endswith(".so"))
    assert built == ["_speedups.cpython-311-x86_64-linux-gnu.so"] and not (start / "build").exists()
    assert diff_trees(snapshots.materialize(task.snapshot), start) == ""  # compiled objects never enter a diff


@pytest.mark.sandbox
@pytest.mark.slow
def test_an_extension_the_tree_cannot_compile_as_it_is_is_left_to_its_fallback_and_said_so(tmp_path):
    """msgpack's shape: the C file is generated from Cython at release time, so a commit's tree has only the .pyx."""
    tree = write_tree(tmp_path / "tree", {**FILES, "setup.py": SETUP.replace("_speedups.c", "_speedups.pyx")})
    (tree / "src" / "fastcalc" / "_speedups.pyx").write_text("def twice(x):\n    return 3 * x\n")
    spec = resolve_env(tree, "fastcalc", evaluate=setup_arguments)
    assert spec.build is None and spec.system_packages == ()
    assert any("extension fastcalc._speedups not built: src/fastcalc/_speedups.pyx" in s for s in spec.detected_from)
