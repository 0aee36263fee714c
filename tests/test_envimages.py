"""Environment images: a real repository's shape (src/ layout, a dependency from a package index, a compiled
dependency from a wheel) gets its own image, built once per spec with the network, and its task validates and
grades in that image on both backends; a build that fails drops only its tasks; the sandbox has no network."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from support.fastcalc import twice_module
from support.wheel_index import TEST_WHEELS, copy_test_wheels, serving

from trialforge.envspec import EnvSpec
from trialforge.errors import SandboxError
from trialforge.sandbox import images
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.images import BASE_NAME, ENV_REPO, base_key, find_image
from trialforge.store.objstore import open_store
from trialforge.tasks.envdetect.resolve import resolve_env
from trialforge.tasks.envimages import (
    env_image,
    env_key,
    image_key,
    obtain_images,
    provide_images,
    publish_image,
    task_image,
)
from trialforge.tasks.patches import diff_trees, filter_patch, is_test_path
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.setupeval import setup_arguments
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader

PURE = {"tfpure/__init__.py": "def scale(x, k):\n    return x * k\n"}
CEXT = twice_module("tfcext", 2)
BUGGY = "import tfcext\nfrom tfpure import scale\n\n\ndef quad(x):\n    return scale(tfcext.twice(x), 3)\n"
FIXED = "import tfcext\nfrom tfpure import scale\n\n\ndef quad(x):\n    return scale(tfcext.twice(x), 2)\n"
TESTS = (
    "from calc import quad\n\n\ndef test_quad():\n    assert quad(3) == 12\n\n\n"
    "def test_zero():\n    assert quad(1) == 4\n"
)
PYPROJECT = """[project]
name = "calc"
version = "0.1"
requires-python = ">=3.9"
dependencies = ["tfpure==1.0", "tfcext==1.0"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""


def _pure_wheel(dest: Path) -> None:
    """A pure-Python wheel written directly (the format is a zip with three metadata files)."""
    name = "tfpure-1.0.dist-info"
    files = {
        **PURE,
        f"{name}/METADATA": "Metadata-Version: 2.1\nName: tfpure\nVersion: 1.0\n",
        f"{name}/WHEEL": "Wheel-Version: 1.0\nGenerator: trialforge-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    with zipfile.ZipFile(dest / "tfpure-1.0-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)
        whl.writestr(f"{name}/RECORD", "\n".join([*record, f"{name}/RECORD,,"]) + "\n")


def _compiled_wheel(dest: Path, work: Path) -> None:
    """A wheel with a C extension, compiled here as a real binary dependency would be on an index."""
    src = work / "tfcext"
    src.mkdir()
    (src / "tfcext.c").write_text(CEXT)
    (src / "setup.py").write_text(
        "from setuptools import Extension, setup\n"
        "setup(name='tfcext', version='1.0', ext_modules=[Extension('tfcext', ['tfcext.c'])])\n"
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(dest), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Iterator[str]:
    """A package index on 127.0.0.1 (a flat wheel directory served over HTTP, as ``--find-links`` reads it)."""
    root = tmp_path_factory.mktemp("index")
    wheels = root / "wheels"
    wheels.mkdir()
    _pure_wheel(wheels)
    _compiled_wheel(wheels, root)
    copy_test_wheels(wheels)  # real old releases (pytest 6.2.4 and what it needs beyond the image)
    with serving(wheels) as url:
        yield url


@pytest.fixture(scope="module")
def built_images() -> Iterator[list[Path]]:
    """Environment image directories the tests made: removed afterwards (the specs name a port of this run)."""
    homes: list[Path] = []
    yield homes
    for home in homes:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def snapshots(tmp_path):
    return SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")


def _calc_task(
    tmp_path: Path,
    snapshots: SnapshotStore,
    task_id: str = "calc-1",
    deps: str = PYPROJECT,
    files: dict[str, str] | None = None,
) -> Task:
    """``calc`` with its dependencies declared in ``deps`` (a pyproject.toml), or in ``files`` instead."""
    trees = {}
    for state, code in (("base", BUGGY), ("fixed", FIXED)):
        tree = tmp_path / task_id / state
        (tree / "src" / "calc").mkdir(parents=True)
        (tree / "src" / "calc" / "__init__.py").write_text(code)
        for name, text in (files or {"pyproject.toml": deps}).items():
            (tree / name).write_text(text)
        trees[state] = tree
    (trees["fixed"] / "tests").mkdir()
    (trees["fixed"] / "tests" / "test_calc.py").write_text(TESTS)
    diff = diff_trees(trees["base"], trees["fixed"])
    return Task(
        task_id=task_id,
        source=Source(kind="git", ref=f"calc@{task_id}"),
        repo="calc",
        snapshot=snapshots.put(trees["base"]),
        problem_statement="quad(3) returns 18 instead of 12",
        gold_patch=filter_patch(diff, lambda p: not is_test_path(p))[0],
        test_patch=filter_patch(diff, is_test_path)[0],
    )


def _provide(tasks: list[Task], snapshots: SnapshotStore, index: str, built_images: list[Path]):
    overrides = {"calc": {"pip_args": ["--no-index", "--find-links", index]}}
    provided, funnel, built = provide_images(tasks, snapshots, overrides)
    built_images += [b.image.rootfs.parent for b in built if b.image.name.startswith(ENV_REPO)]
    return provided, funnel, built


@pytest.fixture
def provided(tmp_path, snapshots, index, built_images) -> Task:
    (task,), funnel, _ = _provide([_calc_task(tmp_path, snapshots)], snapshots, index, built_images)
    assert funnel.kept == 1, funnel.details
    return task


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_task_gets_an_image_with_its_detected_dependencies_pinned_and_its_src_on_the_path(provided, base_image):
    env = provided.env
    assert env is not None and env.env.get("PYTHONPATH") == "/work/src"
    assert set(env.requirements) == {"tfpure==1.0", "tfcext==1.0"}
    assert provided.image.startswith(ENV_REPO + ":") and provided.image_digest.startswith("sha256:")
    assert provided.image_digest != base_image.digest
    home = Path(env_image(env).image.rootfs).parent
    lock = (home / "lock.txt").read_text().split()
    assert {"tfpure==1.0", "tfcext==1.0"} <= set(lock)  # what pip resolved is recorded with the image


@pytest.mark.sandbox
@pytest.mark.slow
def test_python_is_the_images_python3_in_the_base_and_in_an_environment_image(provided, bwrap_backend):
    where = "import os, sys; print(os.path.realpath(sys.executable), sys.version_info[:2])"
    for image in (BASE_NAME, provided.image):
        with bwrap_backend.create(SandboxSpec(image=image, limits=Limits())) as sandbox:
            python, python3 = (sandbox.exec([name, "-c", where], timeout=30) for name in ("python", "python3"))
        assert python.exit_code == 0, (image, python.stderr)
        assert python.stdout == python3.stdout and python.stdout.startswith("/usr/bin/python3."), image


@pytest.mark.pure
def test_a_new_base_image_gets_a_new_key_and_so_does_every_environment_image_on_it(monkeypatch):
    spec = EnvSpec(requirements=("tfpure==1.0",))
    before = (base_key(), env_key(spec))
    monkeypatch.setattr(images, "BASE_PACKAGES", (*images.BASE_PACKAGES, "git"))
    assert base_key() != before[0] and env_key(spec) != before[1]  # nothing built on the old base is reused


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_same_spec_is_built_once(provided):
    again = env_image(provided.env)
    assert not again.built and again.image.name == provided.image and again.image.digest == provided.image_digest


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["bwrap", "docker"])
def test_the_task_validates_and_grades_gold_1_and_empty_0_in_its_image(provided, snapshots, backend_name, request):
    backend = request.getfixturevalue(f"{backend_name}_backend")
    image = task_image(provided, backend, BASE_NAME).name
    checked = validate_task(provided, backend, image, snapshots, Limits(), ValidateConfig(runs=2))
    assert checked.validation.valid, checked.validation.reason
    assert checked.fail_to_pass == ["tests/test_calc.py::test_quad", "tests/test_calc.py::test_zero"]
    grader = Grader(backend, BASE_NAME, "", snapshots, Limits(), test_timeout_s=60)
    gold, empty = grader.grade(checked, checked.gold_patch), grader.grade(checked, "")
    assert (gold.reward, empty.reward) == (1.0, 0.0), (gold.reason, empty.reason)
    assert gold.provenance["image_digest"] == provided.image_digest


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_same_task_in_the_base_image_is_rejected_for_its_missing_dependency(provided, snapshots, bwrap_backend):
    bare = provided.model_copy(update={"image": "", "image_digest": ""})
    checked = validate_task(bare, bwrap_backend, BASE_NAME, snapshots, Limits(), ValidateConfig(runs=1))
    assert not checked.validation.valid
    assert "ModuleNotFoundError" in checked.validation.reason or "No module named" in checked.validation.reason


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_sandbox_of_an_environment_image_has_no_network(provided, bwrap_backend, index):
    probe = f"import urllib.request; urllib.request.urlopen({index!r}, timeout=5); print('reached')"
    spec = SandboxSpec(image=provided.image, limits=Limits())
    with bwrap_backend.create(spec) as sandbox:
        result = sandbox.exec(["python3", "-c", probe], timeout=30)
        deps = sandbox.exec(["python3", "-c", "import tfcext, tfpure; print(tfcext.twice(21))"], timeout=30)
    assert "reached" not in result.stdout and result.exit_code != 0
    assert deps.stdout.strip() == "42"  # what the build installed is there; only the network is gone


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_failed_build_drops_only_its_tasks_with_the_pip_error(tmp_path, snapshots, index, built_images):
    good = _calc_task(tmp_path, snapshots)
    broken = _calc_task(tmp_path, snapshots, "calc-2", PYPROJECT.replace("tfpure==1.0", "tfmissing==1.0"))
    provided, funnel, _ = _provide([good, broken], snapshots, index, built_images)
    assert [t.task_id for t in provided] == ["calc-1"]
    assert funnel.dropped == {"image_build_failed": 1}
    (detail,) = funnel.details
    assert detail["ref"] == "calc-2" and "tfmissing" in detail["detail"]


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_task_validated_in_another_build_of_its_image_is_refused(provided, bwrap_backend):
    stale = provided.model_copy(update={"image_digest": "sha256:" + "0" * 64})
    with pytest.raises(SandboxError, match="validate the task set again"):
        task_image(stale, bwrap_backend, BASE_NAME)


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_bundled_repository_runs_in_the_base_image(snapshots, base_image):
    repo = Path(__file__).resolve().parents[1] / "tasks_src" / "repos" / "textkit"
    task = Task(
        task_id="textkit-1", source=Source(kind="git", ref="x"), repo="textkit", snapshot=snapshots.put(repo),
        problem_statement="p", gold_patch="", test_patch="",
    )  # fmt: skip
    (provided,), _, _ = provide_images([task], snapshots)
    assert (provided.image, provided.image_digest) == (BASE_NAME, base_image.digest)


@pytest.mark.pure
def test_a_python_no_image_exists_for_is_refused_with_the_versions_there_are():
    with pytest.raises(ValidationError, match=r"no image for Python 2\.7: images exist for 3\.9 \(bullseye\)"):
        EnvSpec(python="2.7")


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_image_commands_show_and_build_a_checkouts_environment(tmp_path, snapshots, index, built_images):
    from support.cli_runner import invoke

    _calc_task(tmp_path, snapshots)
    checkout = tmp_path / "calc-1" / "fixed"
    params = tmp_path / "params.yaml"
    params.write_text(f"env:\n  repos:\n    calc:\n      pip_args: [--no-index, --find-links, '{index}']\n")
    shown = invoke("image", "spec", f"calc={checkout}", "--params", str(params))
    assert shown.exit_code == 0, shown.output
    spec = json.loads(shown.output)
    assert spec["env"] == {"PYTHONPATH": "/work/src"} and spec["python"] == "3.11"
    built = invoke("image", "build", "--repo", f"calc={checkout}", "--params", str(params))
    assert built.exit_code == 0, built.output
    base, env = (json.loads(line) for line in built.output.strip().splitlines())
    assert base["name"] == BASE_NAME and env["name"] == f"{ENV_REPO}:{spec['image_key']}"
    assert "tfcext==1.0" in env["lock"]
    del spec["image_key"]
    built_images.append(env_image(EnvSpec.model_validate(spec)).image.rootfs.parent)


def _git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=Ada Lim", "-c", "user.email=ada@example.com"]
    return subprocess.run(["git", *ident, *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_src_layout_repository_goes_from_its_git_history_through_its_image_to_a_valid_task(
    tmp_path, index, built_images
):
    """The user's story of issue #20: a src/-layout library with index and compiled dependencies, given by path."""
    from trialforge import pipeline
    from trialforge.config import load_params
    from trialforge.runtime import open_runtime

    repo = tmp_path / "calc"
    (repo / "src" / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / "src" / "calc" / "__init__.py").write_text(BUGGY)
    (repo / "tests" / "test_calc.py").write_text("from calc import quad\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "Add quad")
    (repo / "src" / "calc" / "__init__.py").write_text(FIXED)
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    _git(repo, "commit", "-q", "-am", "Scale by two\n\nA quad of three came out as eighteen when it should be twelve.")
    (tmp_path / "none.jsonl").write_text("")
    (tmp_path / "repos").mkdir()
    params = load_params(None, {
        "run.store": f"file://{tmp_path / 'store'}", "validate.runs": 1,
        "sources": {"tickets": str(tmp_path / "none.jsonl"), "repos": str(tmp_path / "repos"),
                    "extra": [{"kind": "gitlog", "repo": str(repo)}]},
        "env.repos": {"calc": {"pip_args": ["--no-index", "--find-links", index]}},
    })  # fmt: skip
    with open_runtime(params) as rt:
        ingested, _ = pipeline.ingest(rt)
        provided, images = pipeline.environments(rt, ingested)
        valid, _ = pipeline.validate(rt, provided)
    built_images += [Path(env_image(t.env).image.rootfs).parent for t in provided if t.env is not None]
    assert [t.repo for t in ingested] == ["calc"] and images.kept == 1
    (task,) = valid
    assert task.image.startswith(ENV_REPO + ":") and task.env is not None
    assert task.env.env == {"PYTHONPATH": "/work/src"}
    assert task.fail_to_pass == ["tests/test_calc.py::test_quad", "tests/test_calc.py::test_zero"]


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_machine_that_did_not_build_an_image_takes_it_from_the_store_by_its_digest(provided, tmp_path):
    store = open_store(f"file://{tmp_path / 'store-images'}")
    publish_image(store, env_image(provided.env).image)
    obtain_images(store, [provided], cache_dir=tmp_path / "another-machine")
    fetched = find_image(provided.image, tmp_path / "another-machine")
    assert fetched.digest == provided.image_digest
    assert (fetched.rootfs / "usr" / "bin" / "python3").exists()
    store.put_bytes(image_key(provided.image_digest), b"not the image the task was validated in")
    with pytest.raises(SandboxError, match=f"is sha256:[0-9a-f]{{64}}, not {provided.image_digest}"):
        obtain_images(store, [provided], cache_dir=tmp_path / "a-third-machine")
    assert not (tmp_path / "a-third-machine" / "envs" / provided.image.rpartition(":")[2] / "digest").exists()


# An older setup.py (issue #45): its requirements are computed, so no literal reading finds them, and its
# conftest imports a test dependency. Evaluated in a sandbox, both the runtime and the test extra are installed.
COMPUTED_SETUP = {
    "setup.py": (
        "from setuptools import setup\n"
        "runtime = ['tfpure==1.0']\n"
        "tests_require = ['tfcext==1.0']\n"
        "extras = {'test': tests_require}\n"
        "setup(name='calc', install_requires=runtime + [], extras_require=extras, package_dir={'': 'src'})\n"
    ),
    "conftest.py": "import tfcext  # noqa: F401\n",
}


def _provided_and_validated(task, snapshots, index, built_images, backend) -> tuple[Task, Task]:
    """``task`` given its image, and validated there: it must validate."""
    (provided,), funnel, _ = _provide([task], snapshots, index, built_images)
    assert funnel.kept == 1, funnel.details
    image = task_image(provided, backend, BASE_NAME).name
    checked = validate_task(provided, backend, image, snapshots, Limits(), ValidateConfig(runs=1))
    assert checked.validation.valid, checked.validation.reason
    return provided, checked


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_setup_py_that_computes_its_test_extras_gets_them_installed_and_its_conftest_imports(
    tmp_path, snapshots, index, built_images, bwrap_backend
):
    task = _calc_task(tmp_path, snapshots, "calc-setup", files=COMPUTED_SETUP)
    provided, checked = _provided_and_validated(task, snapshots, index, built_images, bwrap_backend)
    env = provided.env
    assert env is not None and set(env.requirements) == {"tfpure==1.0", "tfcext==1.0"}
    assert "setup.py (setup() arguments evaluated in a sandbox)" in env.detected_from
    assert checked.fail_to_pass == ["tests/test_calc.py::test_quad", "tests/test_calc.py::test_zero"]


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_setup_py_that_fails_in_the_sandbox_falls_back_to_its_literal_arguments(tmp_path):
    failing = "import nowhere_to_be_found\nfrom setuptools import setup\nsetup(install_requires=['x' + 'y'])\n"
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text(failing)
    spec = resolve_env(tree, "calc", evaluate=setup_arguments)
    assert spec.requirements == ()
    assert spec.detected_from[-1].startswith("setup.py (evaluation failed, literal arguments read: setup.py failed: ")
    assert "No module named 'nowhere_to_be_found'" in spec.detected_from[-1]


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_evaluated_setup_py_has_no_network_and_cannot_write_outside_its_copy(tmp_path, index):
    probe = (
        "import pathlib, urllib.request\n"
        "from setuptools import setup\n"
        "reached = []\n"
        "try:\n"
        f"    urllib.request.urlopen({index!r}, timeout=5)\n"
        "    reached.append('network')\n"
        "except OSError:\n"
        "    pass\n"
        "for path in ('/usr/marker', '/etc/marker'):\n"
        "    try:\n"
        "        pathlib.Path(path).write_text('x')\n"
        "        reached.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "pathlib.Path('written.txt').write_text('x')\n"
        "setup(name='probe', install_requires=reached)\n"
    )
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text(probe)
    assert setup_arguments(tree) == {"name": "probe", "install_requires": []}
    assert sorted(p.name for p in tree.iterdir()) == ["setup.py"]  # the evaluation wrote into a copy


# A years-old test requirements file (issue #45): pytest==3.0.7 cannot start on any Python requires-python allows,
# and with py==1.4.12 (jmespath's of 2017) no pytest can: "AttributeError: __spec__" from py's apipkg.
OLD_PINS = {
    "pyproject.toml": PYPROJECT.replace(">=3.9", ">=3.10"),
    "requirements-test.txt": "pytest==3.0.7\npy==1.4.12\n",
}


@pytest.mark.sandbox
@pytest.mark.slow
def test_old_pytest_and_py_pins_are_relaxed_recorded_and_pytest_starts_in_the_image(
    tmp_path, snapshots, index, built_images, bwrap_backend
):
    if not (TEST_WHEELS / ".fetched").is_file():
        pytest.fail(f"{TEST_WHEELS} is missing: `make test` fetches tests/fixtures/old-test-tools.txt there")
    task = _calc_task(tmp_path, snapshots, "calc-pins", files=OLD_PINS)
    provided, checked = _provided_and_validated(task, snapshots, index, built_images, bwrap_backend)
    env = provided.env
    assert env is not None and env.python == "3.11" and "pytest==6.2.4" in env.requirements
    assert any("pytest==3.0.7 relaxed to pytest==6.2.4" in line for line in env.detected_from)
    assert any("py==1.4.12 relaxed to py==1.11.0" in line for line in env.detected_from)
    assert checked.fail_to_pass == ["tests/test_calc.py::test_quad", "tests/test_calc.py::test_zero"]
