"""Unified diffs: which paths they touch, vetting and applying them safely, and diffing two trees.

Patches are applied on the host with ``git apply`` run in a plain directory (no
repository, no history): it refuses paths outside the tree and edits through
symlinks. We vet every patch ourselves first (:func:`vet_patch`: one set of checks for
ingestion and grading) so the error names the culprit and a reason.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from trialforge.errors import PatchError
from trialforge.scratch import scratch_dir
from trialforge.tasks.pytestconfig import collects, python_files_of

_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_FILE_LINE = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(\S+)", re.MULTILINE)
_BLOCK = re.compile(r"(?=^diff --git )", re.MULTILINE)
# git's binary hunk (anywhere in a block: even a text line that quotes one is refused) or its summary line
_BINARY = re.compile(r"GIT binary patch|^Binary files .* differ$", re.MULTILINE)
_SYMLINK_MODE = re.compile(r"^(?:new file mode|new mode) 120000$", re.MULTILINE)
MAX_PATCH_BYTES = 1 << 20

# Files the test runner reads: an agent that edits these could change how tests are collected or judged. Every ini
# file pytest reads (pytest.toml and .pytest.toml: pytest 9), and the modules the interpreter imports at start.
TEST_CONFIG_NAMES = frozenset({
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml",
    "sitecustomize.py", "usercustomize.py",
})  # fmt: skip
# What the interpreter or a package index reads at start or import, whoever wrote it: .pth files (run by site),
# bytecode (imported instead of its source when it looks fresh), and distribution metadata (entry points: pytest
# plugins that load before the run's first check).
IMPORT_TIME_SUFFIXES = (".pth", ".pyc", ".pyo")
IMPORT_TIME_DIR_SUFFIXES = (".dist-info", ".egg-info", ".egg")
IGNORED_DIRS = frozenset({".git", "__pycache__", ".pytest_cache", ".trialforge"})
# Test modules by name beyond pytest's default globs: unittest discovery's ``test*.py`` collects them, suites run
# them as ``python test.py``, Django apps keep their tests in ``tests.py`` (a root ``test.py`` was 289 commits lost).
TEST_MODULE_NAMES = frozenset({"test.py", "tests.py"})


def touched_paths(patch: str) -> list[str]:
    """Every path a patch names (old and new sides), in order, without duplicates."""
    paths: list[str] = []
    for a, b in _HEADER.findall(patch):
        paths += [a, b]
    if not paths:
        paths = [p for p in _FILE_LINE.findall(patch) if p != "/dev/null"]
    return list(dict.fromkeys(paths))


def patch_blocks(patch: str) -> list[str]:
    """A git diff's per-file blocks (each from its ``diff --git`` line), blank ones left out."""
    return [block for block in _BLOCK.split(patch) if block.strip()]


def vet_patch(patch: str, what: str = "patch", *, max_bytes: int = MAX_PATCH_BYTES, setting: str = "") -> None:
    """Refuse a patch we must not apply: a ``PatchError`` whose ``reason`` an ingest adapter reports.

    ``empty_patch``; ``oversize_patch`` (over ``max_bytes``; ``setting`` names where that is set, for the
    message); ``binary_change`` (a binary file: a task's patches are text); ``unsafe_patch`` (naming no file,
    paths leaving the tree or naming ``.git``, a symlink pointing outside). The message names ``what`` and the file.
    """
    if not patch.strip():
        raise PatchError(f"{what} is empty", reason="empty_patch")
    size = len(patch.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        where = f" ({setting})" if setting else ""
        raise PatchError(f"{what} is {size:,} bytes > {max_bytes:,}{where}", reason="oversize_patch")
    for block in patch_blocks(patch):
        paths = touched_paths(block)
        name = paths[-1] if paths else "?"
        if _BINARY.search(block):
            raise PatchError(f"{what} changes binary file {name}", reason="binary_change")
        if _SYMLINK_MODE.search(block):
            dest = next(
                (line[1:] for line in block.splitlines() if line.startswith("+") and not line.startswith("+++")), ""
            )
            if link_escapes(name, dest):
                raise PatchError(f"{what} makes symlink {name} -> {dest} pointing outside", reason="unsafe_patch")
    paths = touched_paths(patch)
    if not paths:
        raise PatchError(f"{what} names no file (not a unified diff?)", reason="unsafe_patch")
    for path in paths:
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts:
            raise PatchError(f"{what} path {path!r} escapes the repository", reason="unsafe_patch")
        if pure.parts and pure.parts[0] == ".git":
            raise PatchError(f"{what} path {path!r} touches git metadata", reason="unsafe_patch")


def link_escapes(link_path: str, dest: str) -> bool:
    """Whether ``dest`` (the text of a symlink at ``link_path``) leaves the tree, judged by its text alone."""
    if dest.startswith("/"):
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(link_path), dest))
    return joined == ".." or joined.startswith("../")


def is_test_path(path: str, collected: Sequence[str] = ()) -> bool:
    """A test file, a piece of test-runner configuration, or a file that changes what runs at import or collection
    time without being imported by name (``.pth`` files, ``__pycache__`` bytecode, ``*.dist-info``/``*.egg-info``
    metadata, ``sitecustomize``/``usercustomize``, every ini file pytest reads): restored from pristine (dropped from
    an agent's diff) before grading. ``collected``: the repository's own ``python_files`` globs."""
    pure = PurePosixPath(path)
    name = pure.name
    return (
        any(part in ("tests", "test", "testing", "__pycache__") for part in pure.parts[:-1])
        or any(part.endswith(IMPORT_TIME_DIR_SUFFIXES) for part in pure.parts)
        or name.startswith("test_")
        or name.endswith("_test.py")
        or is_test_module(path, collected)
        or name in TEST_CONFIG_NAMES
        or name.endswith(IMPORT_TIME_SUFFIXES)
    )


def is_test_module(path: str, collected: Sequence[str] = ()) -> bool:
    """A file the runner collects tests from: pytest's default globs (``test_*.py``, ``*_test.py``),
    ``TEST_MODULE_NAMES``, or one of the repository's own ``python_files`` globs (``collected``)."""
    name = PurePosixPath(path).name
    return name.endswith(".py") and (
        name.startswith("test_") or name.endswith("_test.py") or name in TEST_MODULE_NAMES or collects(path, collected)
    )


def test_files(tree: Path) -> list[str]:
    """The tree's Python test files (test modules, conftests, test helpers), relative, sorted; test modules as the
    tree's own pytest configuration names them count too."""
    collected = python_files_of(tree)
    found = []
    for path in tree.rglob("*.py"):
        rel = path.relative_to(tree)
        if not any(part in IGNORED_DIRS for part in rel.parts) and is_test_path(rel.as_posix(), collected):
            found.append(rel.as_posix())
    return sorted(found)


def apply_patch(tree: Path, patch: str, *, reverse: bool = False) -> None:
    """Apply ``patch`` to the directory ``tree`` in place, all or nothing, once :func:`vet_patch` passes it."""
    vet_patch(patch)
    argv = ["git", "apply", "--whitespace=nowarn", "-p1"]
    if reverse:
        argv.append("-R")
    done = subprocess.run(argv, cwd=tree, input=patch.encode(), capture_output=True, check=False, env=git_env())
    if done.returncode != 0:
        direction = "reverse-apply" if reverse else "apply"
        raise PatchError(f"patch does not {direction}: {done.stderr.decode(errors='replace').strip()}")


def diff_trees(before: Path, after: Path) -> str:
    """A git-style unified diff from ``before`` to ``after`` with paths relative to the trees."""
    with scratch_dir("diff") as tmp:  # named for its owner: `trialforge reap` removes it after a kill -9
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        _copy_clean(before, a)
        _copy_clean(after, b)
        done = subprocess.run(
            ["git", "diff", "--no-index", "--no-color", "--no-ext-diff", "--binary", "a", "b"],
            cwd=tmp,
            capture_output=True,
            check=False,
            env=git_env(),
        )
    if done.returncode not in (0, 1):
        raise PatchError(f"git diff failed: {done.stderr.decode(errors='replace').strip()}", reason="git_error")
    return _strip_tree_prefix(done.stdout.decode("utf-8", errors="replace"))


def filter_patch(patch: str, keep) -> tuple[str, list[str]]:
    """Split a git diff by file; keep the files for which ``keep(path)`` is true. Returns (patch, dropped paths)."""
    kept: list[str] = []
    dropped: list[str] = []
    for block in patch_blocks(patch):
        match = _HEADER.match(block)
        paths = match.groups() if match else tuple(touched_paths(block))
        if all(keep(p) for p in paths):
            kept.append(block)
        else:
            dropped.extend(p for p in paths if p not in dropped)
    return "".join(kept), dropped


def _strip_tree_prefix(diff: str) -> str:
    """``git diff --no-index a b`` names files a/a/x, b/b/x (a/b/x for new files); make them a/x and b/x."""
    diff = re.sub(r"^diff --git a/[ab]/(\S+) b/[ab]/(\S+)$", r"diff --git a/\1 b/\2", diff, flags=re.MULTILINE)
    diff = re.sub(r"^--- a/a/", "--- a/", diff, flags=re.MULTILINE)
    return re.sub(r"^\+\+\+ b/b/", "+++ b/", diff, flags=re.MULTILINE)


def _copy_clean(src: Path, dest: Path) -> None:
    if src.exists():
        shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(*IGNORED_DIRS, "*.pyc"))
    else:
        dest.mkdir()


def git_env() -> dict[str, str]:
    """For every git we run, on mirrors or on patches: no user or system config (a host's settings must not change a
    snapshot or how a patch applies), no prompts, no exotic transports."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "file:git:http:https:ssh",
        "LC_ALL": "C",
    }
