"""What a repository's build asks for is installed, and a Cython extension is built (issue #45: wrapt's build failed
on the base image's setuptools, which rejects its PEP 639 license string, and msgpack's Cython extension was never
built, so its pure-Python fallback ran and a fix in the .pyx failed nothing before it).

The fixture has both shapes: a ``pyproject.toml`` whose ``[build-system]`` asks for a setuptools newer than the base
image's (its ``license = "MIT"`` is what setuptools 66 refuses) and Cython, and msgpack's extension: a ``setup.py``
naming a ``.c`` that Cython makes from the ``.pyx`` at release time, absent from the tree. The bug is in the .pyx; the
fallback is right, so only the compiled code fails before the fix."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from support.fixtasks import edited_diff, fix_task, rollout_outputs, validated_and_graded
from support.redteam_repo import write_tree
from support.wheel_index import serving_test_wheels

from trialforge.envspec import EnvSpec
from trialforge.errors import SandboxError
from trialforge.rollout.starts import Setup, start_tree
from trialforge.sandbox.base import Limits
from trialforge.sandbox.images import BASE_NAME
from trialforge.sandbox.pool import SandboxPool
from trialforge.store.objstore import open_store
from trialforge.tasks.envdetect.decide import detect
from trialforge.tasks.envimages import env_image, provide_images, task_image
from trialforge.tasks.patches import diff_trees
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore

PYPROJECT = """[build-system]
requires = ["setuptools>=77", "cython>=3; python_version >= '3.8'", "legacy-helper; python_version < '3'"]
build-backend = "setuptools.build_meta"

[project]
name = "fastpyx"
version = "1.0"
license = "MIT"
"""
PYX = "src/fastpyx/_fast.pyx"
GENERATED = "src/fastpyx/_fast.c"  # what Cython writes from PYX at release time: never in the tree
SETUP = """from setuptools import Extension, setup

setup(
    package_dir={"": "src"},
    packages=["fastpyx"],
    ext_modules=[Extension("fastpyx._fast", ["src/fastpyx/_fast.c"])],
)
"""
# the header beside the .pyx is found from the C that Cython writes outside the tree
PYX_BUGGY = 'cdef extern from "scale.h":\n    long scale(long x)\n\n\ndef twice(long x):\n    return 3 * scale(x)\n'
PYX_FIXED = PYX_BUGGY.replace("3 * scale", "2 * scale")
FILES = {
    "pyproject.toml": PYPROJECT,
    "setup.py": SETUP,
    "src/fastpyx/__init__.py": "try:\n    from fastpyx._fast import twice\nexcept ImportError:\n"
    "    from fastpyx._native import twice\n",
    "src/fastpyx/_native.py": "def twice(x):\n    return 2 * x\n",
    "src/fastpyx/scale.h": "static long scale(long x) { return x; }\n",
    "tests/test_basics.py": "import fastpyx\n\n\ndef test_imports():\n    assert fastpyx.twice\n",
}
TEST = "from fastpyx._fast import twice\n\n\ndef test_twice():\n    assert twice(21) == 42\n"
EXTENSION = {"name": "fastpyx._fast", "sources": [GENERATED]}  # what setup.py's evaluation in a sandbox reports


@pytest.mark.pure
def test_build_requirements_and_the_declared_cython_are_what_an_extension_gets(tmp_path):
    tree = write_tree(tmp_path / "t", {**FILES, PYX: PYX_BUGGY})
    spec = detect(tree, setup_args={"ext_modules": [EXTENSION]})
    assert spec.build is not None and spec.build.extensions == ("fastpyx._fast",)
    # markers judged for the image's Python: the Python 2 helper is left out
    assert spec.build_requirements == ("setuptools>=77", "cython>=3; python_version >= '3.8'")
    assert any("pyproject.toml (build-system requires: setuptools>=77" in line for line in spec.detected_from)
    assert any(f"fastpyx._fast built from Cython sources: {GENERATED}" in line for line in spec.detected_from)
    assert "build_requirements" in spec.image_fields() and not spec.is_base()


@pytest.mark.pure
def test_cython_declared_outside_the_build_system_is_installed_with_it(tmp_path):
    """msgpack's shape: ``[build-system]`` asks for setuptools alone; Cython is in a dependency group."""
    pyproject = '[build-system]\nrequires = ["setuptools >= 78.1.1"]\n\n[dependency-groups]\ndev = ["cython>=3.2"]\n'
    tree = write_tree(tmp_path / "t", {**FILES, "pyproject.toml": pyproject, PYX: PYX_BUGGY})
    spec = detect(tree, setup_args={"ext_modules": [EXTENSION]})
    assert spec.build is not None
    assert spec.build_requirements == ("setuptools >= 78.1.1", "cython>=3.2")
    assert any("pyproject.toml (Cython to build .pyx sources: cython>=3.2)" in line for line in spec.detected_from)


@pytest.mark.pure
def test_a_cython_extension_without_a_declared_cython_and_a_tree_without_one_get_no_build_requirements(tmp_path):
    undeclared = write_tree(tmp_path / "u", {**FILES, "pyproject.toml": "[build-system]\nrequires = ['setuptools']\n"})
    (undeclared / PYX).write_text(PYX_BUGGY)
    spec = detect(undeclared, setup_args={"ext_modules": [EXTENSION]})
    assert spec.build is None and spec.build_requirements == ()
    assert any(f"not built: {GENERATED}: Cython, which is not declared" in line for line in spec.detected_from)
    # no extension at all: [build-system] is pip's business when it installs the project, not the tests' image
    plain = detect(write_tree(tmp_path / "p", {"pyproject.toml": PYPROJECT, "calc.py": "X = 1\n"}))
    assert plain.build_requirements == () and plain.is_base()
    assert "build_requirements" not in plain.model_dump() and "build_requirements" not in plain.image_fields()


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory) -> SnapshotStore:
    """One store for the module: the task and its image are made once."""
    root = tmp_path_factory.mktemp("snapshots")
    return SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Iterator[str]:
    """The real setuptools and Cython releases `make test` fetched, on 127.0.0.1."""
    with serving_test_wheels(tmp_path_factory.mktemp("index")) as url:
        yield url


@pytest.fixture(scope="module")
def task(tmp_path_factory, snapshots, index) -> Iterator[Task]:
    """The fix commit: the .pyx alone changes, with a new test that imports the compiled module. Its image (the
    spec names this run's index) is removed after the module's tests."""
    base, fixed = {**FILES, PYX: PYX_BUGGY}, {**FILES, PYX: PYX_FIXED, "tests/test_twice.py": TEST}
    root = tmp_path_factory.mktemp("fastpyx")
    raw = fix_task(root, snapshots, base, fixed, repo="fastpyx", statement="twice(21) returns 63")
    overrides = {"fastpyx": {"pip_args": ["--no-index", "--find-links", index]}}
    (provided,), funnel, built = provide_images([raw], snapshots, overrides)
    try:
        assert funnel.kept == 1, funnel.details
        lock = built[0].build_lock.splitlines()  # apart from the tests' setuptools, bookworm's 66
        assert "setuptools==80.9.0" in lock and "Cython==3.2.4" in lock, lock
        yield provided
    finally:
        for image in built:
            shutil.rmtree(image.image.rootfs.parent, ignore_errors=True)


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_fix_in_a_pyx_validates_and_grades_by_the_code_cython_compiled(task, snapshots, tmp_path, bwrap_backend):
    syntax_error = edited_diff(task, snapshots, tmp_path / "e", {PYX: PYX_FIXED + "def (:\n"})
    checked, (gold, empty, broken) = validated_and_graded(task, bwrap_backend, snapshots, syntax_error)
    assert checked.fail_to_pass == ["tests/test_twice.py::test_twice"]
    assert (gold.reward, empty.reward) == (1.0, 0.0)
    assert (broken.reward, broken.reason.split(":")[0]) == (0.0, "build_failed"), broken.reason
    assert "Cython did not compile" in broken.reason
    # a rollout starts with the module built, and neither the C that Cython wrote nor the module is in its diff
    pool = SandboxPool(bwrap_backend, Limits())
    try:
        start = start_tree(task, Setup(), snapshots, pool, task.image, task.image_digest)
    finally:
        pool.close()
    assert [p.name for p in (start / "src" / "fastpyx").glob("_fast*.so")] == ["_fast.cpython-311-x86_64-linux-gnu.so"]
    assert not (start / GENERATED).exists() and not (start / "build").exists()
    assert diff_trees(snapshots.materialize(task.snapshot), start) == ""


@pytest.mark.sandbox
@pytest.mark.slow
def test_an_edit_to_the_pyx_takes_effect_in_the_rollout_workspace(task, snapshots, bwrap_backend):
    image = task_image(task, bwrap_backend, BASE_NAME).name
    command = "PYTHONPATH=src python3 -c 'import fastpyx; print(fastpyx.twice(21))'; ls src/fastpyx"
    before, fixed = rollout_outputs(bwrap_backend, image, task, snapshots, command, [(PYX, "3 * scale", "2 * scale")])
    assert "63" in before.splitlines() and "42" in fixed.splitlines(), fixed
    assert "_fast.c" not in fixed.splitlines()  # what Cython wrote is not in the workspace


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_build_requirement_that_does_not_install_fails_the_image_with_the_reason(index):
    spec = EnvSpec(build_requirements=("setuptools>=999",), pip_args=("--no-index", "--find-links", index))
    with pytest.raises(SandboxError, match=r"setuptools>=999.*\(what building the extensions requires, on Python 3.11"):
        env_image(spec)
