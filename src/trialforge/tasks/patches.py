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

_HEADER = "diff --git "
# Lines that name a file whole (to the end of the line): the ---/+++ pair, and git's rename and copy lines.
_NAMING = re.compile(r"^(?:(?:---|\+\+\+) |(?:rename|copy) (?:from|to) )(.*)$", re.MULTILINE)
# git's C-style quoting of a name with special bytes: its escapes, and octal for the bytes of non-ASCII text
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
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
# bytecode (imported instead of its source when it looks fresh), compiled extension modules (imported before a
# module's .py; only the sandbox's own build makes them), and distribution metadata (entry points: pytest
# plugins that load before the run's first check).
COMPILED_SUFFIXES = (".so", ".pyd")
IMPORT_TIME_SUFFIXES = (".pth", ".pyc", ".pyo", *COMPILED_SUFFIXES)
IMPORT_TIME_DIR_SUFFIXES = (".dist-info", ".egg-info", ".egg")
IGNORED_DIRS = frozenset({".git", "__pycache__", ".pytest_cache", ".trialforge"})
# Test modules by name beyond pytest's default globs: unittest discovery's ``test*.py`` collects them, suites run
# them as ``python test.py``, Django apps keep their tests in ``tests.py`` (a root ``test.py`` was 289 commits lost).
TEST_MODULE_NAMES = frozenset({"test.py", "tests.py"})


def touched_paths(patch: str) -> list[str]:
    """Every path a patch names (old and new sides), in order, without duplicates: git's quoted names unquoted, a
    name with spaces whole. What grading restores is judged from the trees, never from these (verify/grader.py)."""
    paths: list[str] = []
    for block in patch_blocks(patch):
        named = [p for p in map(_named, _NAMING.finditer(block)) if p != "/dev/null"]
        paths += _header_paths(block, guess=not named) + named
    return list(dict.fromkeys(p for p in paths if p))


def _named(line: re.Match[str]) -> str:
    """The name a naming line gives, unquoted; a ---/+++ name without its a/ or b/ prefix (rename and copy lines
    have none)."""
    path = _unquote(line.group(1).strip())
    return path[2:] if line.group(0).startswith(("---", "+++")) and path[:2] in ("a/", "b/") else path


def _header_paths(block: str, *, guess: bool) -> list[str]:
    """The names of a block's ``diff --git`` line: quoted, or split at its one `` b/``; with ``guess`` (the block
    names its files nowhere else: a mode change, an empty file) also an unquoted a/NAME b/NAME with spaces."""
    head = block.split("\n", 1)[0]
    if not head.startswith(_HEADER):
        return []
    rest = head[len(_HEADER) :]
    if rest.startswith('"'):
        end = _quoted_end(rest)
        first, second = rest[:end], rest[end:].strip()
    elif rest.count(" b/") == 1 or rest.count(' "b/') == 1:
        cut = max(rest.find(" b/"), rest.find(' "b/'))
        first, second = rest[:cut], rest[cut + 1 :]
    elif guess:  # a/NAME b/NAME, the same NAME on both sides (a rename has rename lines)
        half = (len(rest) - 1) // 2
        first, second = rest[:half], rest[half + 1 :]
    else:
        return []
    return [p[2:] for p in map(_unquote, (first, second)) if p[:2] in ("a/", "b/")]


def _quoted_end(text: str) -> int:
    """The index just past the quoted name ``text`` starts with."""
    i = 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _unquote(name: str) -> str:
    """A name as git writes it: C-style quoted (escapes, octal bytes of UTF-8) when it has special bytes."""
    if not (len(name) >= 2 and name[0] == name[-1] == '"'):
        return name.split("\t", 1)[0]  # GNU diff puts a timestamp after a tab
    out, i, body = bytearray(), 0, name[1:-1]
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode()
            i += 1
        elif body[i + 1 : i + 2] in _ESCAPES:
            out.append(_ESCAPES[body[i + 1]])
            i += 2
        elif re.fullmatch(r"[0-7]{3}", body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
            i += 4
        else:  # not an escape git writes: the backslash is a character (a hand-written diff must not crash us)
            out += b"\\"
            i += 1
    return out.decode("utf-8", errors="surrogateescape")


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
        # --no-prefix on trees named a and b: the names come out as a/NAME and b/NAME, quoted by git as git apply
        # reads them, with no rewriting of ours in between
        done = subprocess.run(
            ["git", "diff", "--no-index", "--no-prefix", "--no-color", "--no-ext-diff", "--binary", "a", "b"],
            cwd=tmp,
            capture_output=True,
            check=False,
            env=git_env(),
        )
    if done.returncode not in (0, 1):
        raise PatchError(f"git diff failed: {done.stderr.decode(errors='replace').strip()}", reason="git_error")
    return done.stdout.decode("utf-8", errors="surrogateescape")


def changed_paths(before: Path, after: Path) -> list[str]:
    """Every path whose file, symlink or mode differs between two trees, or that only one of them has, sorted:
    read from the trees, never from a diff's text. Directories are not paths; nothing is followed.

    ``after`` is ``before`` copied with its metadata and then patched: a file whose type, mode, size and
    modification time are unchanged was not written (``git apply`` writes every file it touches), so only the others
    are read."""
    old, new = _entries(before), _entries(after)
    changed = []
    for rel in sorted(old.keys() | new.keys()):
        a, b = old.get(rel), new.get(rel)
        if a is None or b is None or a.st_mode != b.st_mode or _differ(a, b, before / rel, after / rel):
            changed.append(rel)
    return changed


def _entries(tree: Path) -> dict[str, os.stat_result]:
    found = {}
    for root, dirs, files in os.walk(tree):  # a symlink to a directory is listed in dirs, and not walked
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = os.path.join(root, name)
            found[os.path.relpath(path, tree)] = os.lstat(path)
    return found


def _differ(a: os.stat_result, b: os.stat_result, old: Path, new: Path) -> bool:
    return (a.st_size, a.st_mtime_ns) != (b.st_size, b.st_mtime_ns) and _content(old) != _content(new)


def _content(path: Path) -> bytes:
    return os.readlink(path).encode("utf-8", "surrogateescape") if path.is_symlink() else path.read_bytes()


def filter_patch(patch: str, keep) -> tuple[str, list[str]]:
    """Split a git diff by file; keep the files for which ``keep(path)`` is true. Returns (patch, dropped paths)."""
    kept: list[str] = []
    dropped: list[str] = []
    for block in patch_blocks(patch):
        paths = touched_paths(block)
        if all(keep(p) for p in paths):
            kept.append(block)
        else:
            dropped.extend(p for p in paths if p not in dropped)
    return "".join(kept), dropped


def _copy_clean(src: Path, dest: Path) -> None:
    if src.exists():
        # compiled objects are built in each sandbox from the sources, never carried by a diff
        ignored = shutil.ignore_patterns(*IGNORED_DIRS, "*.pyc", *(f"*{suffix}" for suffix in COMPILED_SUFFIXES))
        shutil.copytree(src, dest, symlinks=True, ignore=ignored)
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
