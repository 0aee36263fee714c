"""Version modules a build backend generates: written into ingested trees so the package imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trialforge.store.objstore import open_store
from trialforge.tasks.buildfiles import PY_STUB, write_build_files
from trialforge.tasks.ingest.trees import snapshot_at
from trialforge.tasks.snapshots import SnapshotStore

pytestmark = pytest.mark.pure

HATCH = '[tool.hatch.build.hooks.vcs]\nversion-file = "src/pkg/_version.py"\n'


def _tree(root: Path, pyproject: str) -> Path:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "__init__.py").write_text("from ._version import __version__\n")
    (root / "pyproject.toml").write_text(pyproject)
    return root


@pytest.mark.parametrize(
    "pyproject",
    [
        HATCH,
        '[tool.setuptools_scm]\nwrite_to = "src/pkg/_version.py"\n',
        '[tool.setuptools_scm]\nversion_file = "src/pkg/_version.py"\n',
    ],
)
def test_the_version_module_the_backend_would_write_is_written(tmp_path, pyproject):
    tree = _tree(tmp_path, pyproject)
    assert write_build_files(tree)[0] == "src/pkg/_version.py"
    assert (tree / "src/pkg/_version.py").read_text() == PY_STUB
    scope: dict = {}
    exec(PY_STUB, scope)
    assert scope["__version__"] == "0.0.0" and scope["version_tuple"] == (0, 0, 0)


@pytest.mark.parametrize("where", ["../outside.py", "/tmp/outside.py", "link/_version.py", "missing_dir/_version.py"])
def test_a_path_outside_the_tree_or_through_a_link_is_left_alone(tmp_path, where):
    tree = _tree(tmp_path / "repo", f'[tool.hatch.build.hooks.vcs]\nversion-file = "{where}"\n')
    (tmp_path / "elsewhere").mkdir()
    (tree / "link").symlink_to(tmp_path / "elsewhere")
    assert write_build_files(tree) == []  # (no [project] name: no metadata either)
    assert not (tmp_path / "outside.py").exists() and not (tmp_path / "elsewhere" / "_version.py").exists()


def test_an_existing_file_is_kept(tmp_path):
    tree = _tree(tmp_path, HATCH)
    (tree / "src/pkg/_version.py").write_text("__version__ = '9'\n")
    assert write_build_files(tree) == [] and "9" in (tree / "src/pkg/_version.py").read_text()


def test_an_ingested_commits_snapshot_has_its_version_module_and_metadata(tmp_path):
    repo = _tree(tmp_path / "repo", '[project]\nname = "my-pkg"\n' + HATCH)
    (repo / ".gitignore").write_text("src/pkg/_version.py\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    snapshots = SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")
    tree = snapshots.materialize(snapshot_at(repo, commit, [], snapshots))
    assert (tree / "src/pkg/_version.py").read_text() == PY_STUB
    # and the package's distribution metadata, which tests read (importlib.metadata.version at import)
    probe = "import importlib.metadata, pkg; print(importlib.metadata.version('my-pkg'), pkg.__version__)"
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tree, env={"PYTHONPATH": str(tree / "src")},
                         capture_output=True, text=True)  # fmt: skip
    assert ran.stdout.split() == ["0.0.0", "0.0.0"], ran.stderr
