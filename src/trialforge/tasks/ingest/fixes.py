"""A fix as ingestion takes it: a code patch and a test patch, judged by the paths they touch.

A task needs a fix to grade against and tests to grade with: a change that touches no test, only tests, or
only documentation, CI and packaging files is refused (:func:`require_code_and_tests`). A commit's fix is read
from git (:func:`commit_fix`), cheapest checks first, and split into its code and test sides.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from trialforge.errors import PatchError, RepoError
from trialforge.tasks.ingest.caps import MAX_PATCH_BYTES_SETTING
from trialforge.tasks.ingest.git import git
from trialforge.tasks.ingest.objects import Commit
from trialforge.tasks.patches import (
    MAX_PATCH_BYTES,
    TEST_CONFIG_NAMES,
    filter_patch,
    is_test_path,
    touched_paths,
    vet_patch,
)

MAX_CHANGED_LINES = 2000  # a fix that changes more lines than this is a refactor or a vendoring, not a task
# Test-side files that configure the runner (``is_test_path`` counts them so they are restored before
# grading) but are not tests: a commit whose test side is only these brings nothing to grade with.
# ``conftest.py`` is not among them: it is test code (fixtures, hooks).
RUNNER_CONFIG_NAMES = (TEST_CONFIG_NAMES - {"conftest.py"}) | {".coveragerc", "noxfile.py"}
# Code-side files that are not code: documentation, CI, packaging and repository housekeeping.
SUPPORT_DIRS = frozenset({"docs", "doc", ".github", ".circleci", ".gitlab", ".azure-pipelines", ".devcontainer"})
SUPPORT_SUFFIXES = frozenset({".md", ".rst", ".txt", ".adoc"})
SUPPORT_NAMES = frozenset(
    {
        "setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "Pipfile", "Pipfile.lock", "poetry.lock",
        "environment.yml", "tox.ini", "noxfile.py", "Makefile", ".coveragerc", ".gitignore", ".gitattributes",
        ".mailmap", ".editorconfig", ".flake8", ".pylintrc", "mypy.ini", ".bumpversion.cfg",
        ".pre-commit-config.yaml", ".readthedocs.yml", ".readthedocs.yaml", ".travis.yml", ".gitlab-ci.yml",
        "appveyor.yml", "azure-pipelines.yml", "Jenkinsfile", "codecov.yml", ".codecov.yml",
    }
)  # fmt: skip
SUPPORT_STEMS = frozenset({"README", "CHANGELOG", "CHANGES", "HISTORY", "NEWS", "AUTHORS", "CONTRIBUTORS", "LICENSE",
                           "COPYING", "CONTRIBUTING", "CODE_OF_CONDUCT", "SECURITY"})  # fmt: skip


def split_patch(patch: str, collected: Sequence[str] = ()) -> tuple[str, str]:
    """(code patch, test patch) by path (``collected``: the repository's ``python_files`` globs); a file whose
    old and new paths disagree is refused."""
    code, _ = filter_patch(patch, lambda path: not is_test_path(path, collected))
    tests, _ = filter_patch(patch, lambda path: is_test_path(path, collected))
    lost = set(touched_paths(patch)) - set(touched_paths(code)) - set(touched_paths(tests))
    if lost:
        raise RepoError(f"renames between test and code paths: {sorted(lost)}", reason="mixed_rename")
    return code, tests


def is_runner_config(path: str) -> bool:
    """A test-side file that configures the runner (``setup.cfg``, ``tox.ini``, ``*.pth``...), not a test."""
    name = PurePosixPath(path).name
    return name in RUNNER_CONFIG_NAMES or name.endswith(".pth")


def is_support_file(path: str) -> bool:
    """Documentation, CI, packaging or repository housekeeping: a change that is not a code fix.

    Judged by the top-level directory (``docs/``, ``.github/``...), the name (``setup.py``, ``MANIFEST.in``,
    ``requirements*.txt``...), a text suffix (``.md``, ``.rst``, ``.txt``) or a suffix-less conventional
    name (``CHANGES``, ``LICENSE``); ``pkg/history.py`` or ``pkg/docs/render.py`` stay code.
    """
    pure = PurePosixPath(path)
    return (
        (len(pure.parts) > 1 and pure.parts[0] in SUPPORT_DIRS)
        or pure.name in SUPPORT_NAMES
        or pure.suffix.lower() in SUPPORT_SUFFIXES
        or (not pure.suffix and pure.name.upper() in SUPPORT_STEMS)
        or (pure.name.startswith("requirements") and pure.suffix in (".txt", ".in"))
    )


def require_code_and_tests(paths: Sequence[str], what: str, collected: Sequence[str] = ()) -> None:
    """A task needs a fix to grade against and tests to grade with, judged by the paths a change touches
    (``collected``: the repository's own ``python_files`` globs, test modules as well).

    ``no_test_changes``: no test file changed, or only runner configuration (``setup.cfg``, ``tox.ini``...)
    on the test side. ``no_code_changes``: only tests changed, or only docs, CI and packaging files
    (``README.md``, ``.github/``, ``setup.py``...) besides them. Both say which files they saw.
    """
    tests = [p for p in paths if is_test_path(p, collected)]
    code = [p for p in paths if not is_test_path(p, collected)]
    if not tests:
        raise RepoError(f"{what} changes no test file", reason="no_test_changes")
    if all(map(is_runner_config, tests)):
        raise RepoError(
            f"{what} changes only test-runner configuration on the test side ({_few(tests)}), no test",
            reason="no_test_changes",
        )
    if not code:
        raise RepoError(f"{what} changes only tests", reason="no_code_changes")
    if all(map(is_support_file, code)):
        raise RepoError(f"{what}: only docs/CI/packaging files changed ({_few(code)})", reason="no_code_changes")


def _few(paths: Sequence[str], n: int = 4) -> str:
    return ", ".join(paths[:n]) + (f" and {len(paths) - n} more" if len(paths) > n else "")


def commit_fix(
    repo: Path,
    commit: Commit,
    *,
    max_changed_lines: int = MAX_CHANGED_LINES,
    max_patch_bytes: int = MAX_PATCH_BYTES,
    collected: Sequence[str] = (),
) -> tuple[str, str]:
    """(code patch, test patch) of a non-merge commit against its parent, refused when unusable; ``collected``:
    the ``python_files`` globs of the repository's pytest configuration at the commit.

    Cheap checks first (``git diff-tree --numstat``): merges, root commits, binary changes, huge
    diffs and commits without both code and test changes (:func:`require_code_and_tests`) never
    have their full diff read.
    """
    if len(commit.parents) != 1:
        kind = "merge_commit" if commit.parents else "root_commit"
        raise RepoError(f"commit {commit.sha} has {len(commit.parents)} parents", reason=kind)
    parent = commit.parents[0]
    stats = _numstat(repo, parent, commit.sha)
    binary = [path for added, _, path in stats if added == "-"]
    if binary:
        raise RepoError(f"commit {commit.sha} changes binary file {binary[0]}", reason="binary_change")
    changed = sum(int(added) + int(deleted) for added, deleted, _ in stats)
    if changed > max_changed_lines:
        raise RepoError(f"commit {commit.sha} changes {changed} lines (limit {max_changed_lines})", reason="huge_diff")
    require_code_and_tests([path for _, _, path in stats], f"commit {commit.sha}", collected)
    patch = _decode_diff(commit.sha, _diff(repo, parent, commit.sha))
    try:
        vet_patch(patch, f"diff of commit {commit.sha}", max_bytes=max_patch_bytes, setting=MAX_PATCH_BYTES_SETTING)
    except PatchError as exc:  # a RepoError, as every refusal here, for the adapters' caches of verdicts
        raise RepoError(str(exc), reason=exc.reason) from None
    return split_patch(patch, collected)


def _numstat(repo: Path, parent: str, sha: str) -> list[tuple[str, str, str]]:
    out = git(repo, "diff-tree", "-r", "-z", "--numstat", "--no-renames", parent, sha)
    rows = []
    for record in out.split(b"\0"):
        if record.count(b"\t") == 2:
            added, deleted, path = record.decode("utf-8", "replace").split("\t")
            rows.append((added, deleted, path))
    return rows


def _diff(repo: Path, parent: str, sha: str) -> bytes:
    # Plumbing with explicit prefixes: a repository's diff.noprefix or color settings cannot change it.
    return git(
        repo, "diff-tree", "-p", "--no-renames", "--binary", "--no-color", "--no-ext-diff", "--no-textconv",
        "--src-prefix=a/", "--dst-prefix=b/", parent, sha,
    )  # fmt: skip


def _decode_diff(sha: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        block = raw[: exc.start].rsplit(b"\ndiff --git ", 1)[-1].split(b"\n", 1)[0]
        raise RepoError(
            f"commit {sha}: diff is not valid UTF-8 at byte {exc.start} (in {block.decode('utf-8', 'replace')})",
            reason="bad_encoding",
        ) from None
