"""What every ingest adapter needs: a repository at a commit, a commit's fix, and export records with locations.

A task's base state is a repository tree at one commit with no git history. We do not use
``git archive | tar -x`` for it: ``git archive`` honours the repository's own ``.gitattributes``
(``export-ignore`` drops paths, ``export-subst`` rewrites files), and many projects export-ignore
their tests, which would silently remove the very files a task is graded with. Instead we read the
tree object by object and write each file ourselves, which also lets us refuse a path or symlink that
leaves the tree before it exists. Objects (trees, blobs, commits) are read in-process by libgit2
(pygit2), which runs no program and applies no attribute or filter, and parses commits for us: as fast
as ``git ls-tree`` and a ``git cat-file --batch`` process on trees, faster on commits
(``benchmarks/git_objects.py``). Everything else (clone, rev-list, diff) is ``git``.

Every failure here is a :class:`RepoError` carrying a short ``reason`` (the funnel's key) and a
message that names the commit, file or field, so an adapter drops one record and keeps the rest.

Bad input never stops a run and is never truncated: a line over ``IngestCaps.max_record_bytes`` is
dropped before it is decoded or parsed (``oversize_record``), and a record whose statement, hints,
patches or test lists are over their caps is dropped whole (``oversize_*``, ``too_many_tests``,
:func:`check_caps`), each with its line and the cap's name in ``params.yaml``.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO

import pygit2
from pygit2.enums import FileMode, Option, RepositoryOpenFlag

from trialforge.errors import PatchError, TaskError
from trialforge.funnel import Funnel
from trialforge.scratch import scratch_dir
from trialforge.tasks.buildfiles import write_build_files
from trialforge.tasks.ingest.caps import IngestCaps
from trialforge.tasks.patches import (
    MAX_PATCH_BYTES,
    TEST_CONFIG_NAMES,
    apply_patch,
    check_paths,
    filter_patch,
    is_test_path,
    touched_paths,
)
from trialforge.tasks.snapshots import SnapshotStore

if TYPE_CHECKING:
    from trialforge.tasks.schema import Task

RepoSource = str | Path  # a local git repository (bare mirror or work tree) or a clone URL

MAX_TREE_BYTES = 1 << 30  # a base state larger than this is not a practical task
MAX_CHANGED_LINES = 2000  # a fix that changes more lines than this is a refactor or a vendoring, not a task
GIT_TIMEOUT_S = 600
_EXTRAS_MARK = " extras="
_URL = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:)", re.IGNORECASE)
_BLOCK = re.compile(r"(?=^diff --git )", re.MULTILINE)
_BINARY = re.compile(r"^(?:GIT binary patch|Binary files .* differ)$", re.MULTILINE)
_SYMLINK_MODE = re.compile(r"^(?:new file mode|new mode) 120000$", re.MULTILINE)
DEFAULT_CAPS = IngestCaps()
_CAPS = "sources.caps"  # where the caps are set in params.yaml, named in every oversize message
_SKIP_CHUNK = 1 << 20  # the rest of an oversize line is read and discarded in pieces this big

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


class RepoError(TaskError):
    """One source record cannot become a task; ``reason`` is the funnel key, the message says why."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# --- the funnel with links ------------------------------------------------------------------------


@dataclass
class IngestFunnel(Funnel):
    """A funnel that also lists what was linked to what (ticket -> fix), with confidence and rule."""

    links: list[dict[str, Any]] = field(default_factory=list)

    def link(self, task_id: str, ticket: str, fix: str, confidence: float, rule: str, *, used: bool = True) -> None:
        self.links.append(
            {"task_id": task_id, "ticket": ticket, "fix": fix, "confidence": confidence, "rule": rule, "used": used}
        )

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "links": self.links}


# --- lossless extras on a task (until Task has a field for them) ------------------------------------


def with_extras(ref: str, extras: Mapping[str, Any]) -> str:
    """``ref`` plus facts the Task has no field for (base commit, SWE-bench version...), as compact JSON.

    Temporary: ``Task`` has no free-form field, so these ride in ``Source.ref`` after a marker that
    :func:`split_extras` reverses exactly. Move them to ``Task.extra`` once it exists.
    """
    if not extras:
        return ref
    return ref + _EXTRAS_MARK + json.dumps(dict(extras), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def split_extras(ref: str) -> tuple[str, dict[str, Any]]:
    """The human part of a ref and its extras (empty when it has none)."""
    head, mark, tail = ref.partition(_EXTRAS_MARK)
    if not mark:
        return ref, {}
    return head, json.loads(tail)


# --- running git ------------------------------------------------------------------------------------


def git_env() -> dict[str, str]:
    """No user or system config (a host's settings must not change a snapshot), no prompts, no exotic transports."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "file:git:http:https:ssh",
        "LC_ALL": "C",
    }


def git_argv(repo: Path, *args: str) -> list[str]:
    # safe.directory=*: mirrors may belong to another user. We run only plumbing that executes no
    # program a repository's config could name (no hooks, fsmonitor, pager, textconv or external diff).
    return [
        "git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
        "-C", str(repo), *args,
    ]  # fmt: skip


def git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    """Run one git command in ``repo`` and return its stdout; a failure is a ``git_error`` naming the command."""
    done = subprocess.run(
        git_argv(repo, *args), input=stdin, capture_output=True, check=False, env=git_env(), timeout=GIT_TIMEOUT_S
    )
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        raise RepoError(f"git {' '.join(args[:3])} in {repo} failed: {err}", reason="git_error")
    return done.stdout


def repo_name_of(source: RepoSource) -> str:
    """A default task-repo name for a mirror path or URL: its last component without ``.git``."""
    return re.sub(r"\.git$", "", str(source).rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]) or "repo"


def resolve_commit(repo: Path, rev: str) -> str:
    """The full sha of ``rev`` in ``repo``; an ``unknown_commit`` when the mirror does not have it."""
    if not rev or rev.startswith("-"):
        raise RepoError(f"{rev!r} is not a commit", reason="unknown_commit")
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}").decode().strip()
    except RepoError:
        raise RepoError(f"commit {rev} is not in {repo} (stale mirror?)", reason="unknown_commit") from None


def rev_list(repo: Path, rev: str = "HEAD") -> list[tuple[str, tuple[str, ...]]]:
    """(sha, parents) of every commit reachable from ``rev``, oldest first."""
    out = git(repo, "rev-list", "--reverse", "--topo-order", "--parents", "--end-of-options", rev).decode()
    return [(shas[0], tuple(shas[1:])) for shas in (line.split() for line in out.splitlines()) if shas]


class Mirrors:
    """Repository names -> local git repositories; clone URLs are cloned (``--mirror``, once) on first use.

    Clones live in ``clone_dir`` when given (kept for the next run), else in a scratch directory removed
    when this object is closed.
    """

    def __init__(self, sources: Mapping[str, RepoSource], clone_dir: Path | None = None) -> None:
        self._sources = dict(sources)
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._clone_dir = clone_dir
        self._ready: dict[str, Path] = {}

    def __enter__(self) -> Mirrors:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def get(self, name: str) -> Path:
        if name not in self._ready:
            if name not in self._sources:
                known = ", ".join(sorted(self._sources)) or "none"
                raise RepoError(
                    f"no mirror or clone URL for repository {name!r} (known: {known})", reason="unknown_repository"
                )
            self._ready[name] = self._open(name, self._sources[name])
        return self._ready[name]

    def _open(self, name: str, source: RepoSource) -> Path:
        if isinstance(source, str) and _URL.match(source):
            return self._clone(name, source)
        path = Path(source).expanduser().resolve()
        if not path.is_dir():
            raise RepoError(f"mirror of {name!r} at {path} does not exist", reason="unknown_repository")
        # A plain directory inside some other repository would silently resolve to that repository.
        git_dir = Path(git(path, "rev-parse", "--absolute-git-dir").decode().strip())
        if git_dir not in (path, path / ".git"):
            raise RepoError(
                f"{path} (mirror of {name!r}) is not a git repository; it lies inside {git_dir}",
                reason="unknown_repository",
            )
        return path

    def _clone(self, name: str, url: str) -> Path:
        if self._clone_dir is None:
            self._scratch = self._scratch or scratch_dir("clones")
            base = Path(self._scratch.name)
        else:
            base = self._clone_dir
        dest = base / re.sub(r"[^\w.-]", "_", name)
        if (dest / "HEAD").is_file():
            git(dest, "fetch", "--quiet", "--prune", "origin")
            return dest
        base.mkdir(parents=True, exist_ok=True)
        git(base, "clone", "--mirror", "--quiet", "--", url, str(dest))
        return dest


# --- reading objects ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    author_date: datetime
    message: str

    @property
    def subject(self) -> str:
        return self.message.split("\n", 1)[0].strip()

    @property
    def body(self) -> str:
        return self.message.partition("\n")[2].strip()


class ObjectReader:
    """The objects of one repository by id, read in-process (libgit2); one per thread."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        # Mirrors may belong to another user: as ``safe.directory=*`` for git (reading objects runs nothing).
        pygit2.option(Option.SET_OWNER_VALIDATION, 0)
        try:
            self._git = pygit2.Repository(str(repo), RepositoryOpenFlag.NO_SEARCH)
        except pygit2.GitError as exc:
            raise RepoError(f"{repo} is not a git repository: {exc}", reason="git_error") from None

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._git.free()

    def get(self, oid: str) -> pygit2.Object:
        """An object by id, or by any name ``git cat-file`` takes (``COMMIT:PATH``)."""
        try:
            return self._git.revparse_single(oid)
        except (KeyError, ValueError, pygit2.GitError):
            raise RepoError(f"object {oid} is missing from {self.repo}", reason="unknown_commit") from None

    def read(self, oid: str) -> tuple[str, bytes]:
        """(type, content) of one object (``get``)."""
        obj = self.get(oid)
        return obj.type_str, obj.read_raw()

    def commit(self, sha: str) -> Commit:
        """A parsed commit; a message that is not valid text in its declared encoding is ``bad_encoding``."""
        obj = self.get(sha)
        if not isinstance(obj, pygit2.Commit):
            raise RepoError(f"{sha} is a {obj.type_str}, not a commit", reason="unknown_commit")
        encoding = obj.message_encoding or "utf-8"
        try:
            text = obj.raw_message.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise RepoError(f"commit {sha}: message is not valid {encoding} ({exc})", reason="bad_encoding") from None
        when = datetime.fromtimestamp(obj.author.time, timezone(timedelta(minutes=obj.author.offset)))
        return Commit(sha=sha, parents=tuple(str(p) for p in obj.parent_ids), author_date=when, message=text)

    def tree_entries(self, commit: str) -> list[_Entry]:
        """Every entry under the tree of ``commit`` but directories (submodules included)."""
        entries: list[_Entry] = []
        pending = [("", self.get(commit).peel(pygit2.Tree))]
        while pending:
            prefix, tree = pending.pop()
            for entry in tree:
                try:
                    path = prefix + entry.raw_name.decode("utf-8")
                except UnicodeDecodeError:
                    name = prefix.encode() + entry.raw_name
                    raise RepoError(
                        f"commit {commit}: file name {name!r} is not UTF-8", reason="bad_encoding"
                    ) from None
                if entry.filemode == FileMode.TREE:
                    pending.append((f"{path}/", self.get(str(entry.id))))
                else:
                    entries.append(_Entry(entry.filemode, str(entry.id), path))
        return entries


# --- a repository at a commit ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    mode: int  # pygit2.enums.FileMode
    oid: str
    path: str


def materialize(repo: Path, commit: str, dest: Path, *, max_bytes: int = MAX_TREE_BYTES) -> None:
    """Write the tree of ``commit`` into ``dest`` (which must not exist or be empty), without ``.git``.

    Submodules become empty directories, as after a clone without ``--recurse-submodules``.
    Refused with ``unsafe_tree``: paths leaving the tree or naming ``.git``, symlinks resolving outside.
    """
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    total = 0
    links: list[Path] = []
    with ObjectReader(repo) as objects:
        for entry in objects.tree_entries(commit):
            target = _safe_target(root, entry.path, commit)
            if entry.mode == FileMode.COMMIT:
                target.mkdir(parents=True, exist_ok=True)
                continue
            _, data = objects.read(entry.oid)
            total += len(data)
            if total > max_bytes:
                raise RepoError(f"tree of {commit} is over {max_bytes} bytes", reason="tree_too_large")
            if entry.mode == FileMode.LINK:
                links.append(_write_link(target, entry.path, data, commit))
            else:
                target.write_bytes(data)
                target.chmod(0o755 if entry.mode == FileMode.BLOB_EXECUTABLE else 0o644)
    for link in links:  # only now can a chain of links be followed
        if not Path(os.path.realpath(link)).is_relative_to(root):
            rel = link.relative_to(root)
            raise RepoError(f"commit {commit}: symlink {rel} resolves outside the repository", reason="unsafe_tree")


def _safe_target(root: Path, rel: str, commit: str) -> Path:
    """``root / rel``, its parent directories made, after checking that nothing on the way leaves ``root``.

    Each directory is checked before it is entered, so a symlinked directory (possible only in a
    crafted tree) can never make us create or write anything outside.
    """
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts or ".git" in pure.parts or not pure.parts:
        raise RepoError(
            f"commit {commit}: tree path {rel!r} escapes the repository or names .git", reason="unsafe_tree"
        )
    current = root
    for part in pure.parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise RepoError(f"commit {commit}: {rel!r} would be written through a symlink", reason="unsafe_tree")
        current.mkdir(exist_ok=True)
    target = current / pure.parts[-1]
    if target.is_symlink() or target.exists():
        raise RepoError(f"commit {commit}: the tree names {rel!r} twice", reason="unsafe_tree")
    return target


def _write_link(target: Path, rel: str, data: bytes, commit: str) -> Path:
    try:
        dest = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RepoError(f"commit {commit}: symlink {rel} has an undecodable target", reason="bad_encoding") from None
    if _link_escapes(rel, dest):
        raise RepoError(f"commit {commit}: symlink {rel} -> {dest} points outside the repository", reason="unsafe_tree")
    os.symlink(dest, target)
    return target


def _link_escapes(link_path: str, dest: str) -> bool:
    """Whether ``dest`` (a symlink's text) leaves the tree, judged by its text alone."""
    if dest.startswith("/"):
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(link_path), dest))
    return joined == ".." or joined.startswith("../")


def snapshot_at(repo: Path, commit: str, patches: Sequence[str], snapshots: SnapshotStore) -> str:
    """Store the tree at ``commit`` and return its digest, after proving every patch applies to it.

    The patches are tried on a copy, so the stored base state is exactly the commit's tree, plus what an editable
    install would add (``tasks.buildfiles``: the generated version module, the distribution's metadata).
    """
    with scratch_dir("ingest") as tmp:
        base, trial = Path(tmp) / "base", Path(tmp) / "trial"
        materialize(repo, commit, base)
        write_build_files(base)  # what `pip install -e .` would add: version module, distribution metadata
        shutil.copytree(base, trial, symlinks=True)
        for patch in patches:
            if not patch:
                continue
            try:
                apply_patch(trial, patch)
            except PatchError as exc:
                raise RepoError(f"on base {commit[:12]}: {exc}", reason="patch_does_not_apply") from None
        return snapshots.put(base)


# --- patches ----------------------------------------------------------------------------------------------


def patch_blocks(patch: str) -> list[str]:
    return [block for block in _BLOCK.split(patch) if block.strip()]


def vet_patch(patch: str, what: str, *, max_bytes: int = MAX_PATCH_BYTES) -> None:
    """Refuse a patch we must not use, with the reason an adapter reports.

    ``empty_patch``, ``binary_change`` (a binary file: a task's patches are text), ``oversize_patch``
    (over ``max_bytes``: ``sources.caps.max_patch_bytes``), ``unsafe_patch`` (paths leaving the tree or
    naming ``.git``, a symlink pointing outside).
    """
    if not patch.strip():
        raise RepoError(f"{what} is empty", reason="empty_patch")
    size = len(patch.encode("utf-8", "surrogatepass"))
    _check_cap(what, size, max_bytes, "bytes", "max_patch_bytes", "oversize_patch")
    for block in patch_blocks(patch):
        paths = touched_paths(block)
        name = paths[-1] if paths else "?"
        if _BINARY.search(block):
            raise RepoError(f"{what} changes binary file {name}", reason="binary_change")
        if _SYMLINK_MODE.search(block):
            dest = next(
                (line[1:] for line in block.splitlines() if line.startswith("+") and not line.startswith("+++")), ""
            )
            if _link_escapes(name, dest):
                raise RepoError(f"{what} makes symlink {name} -> {dest} pointing outside", reason="unsafe_patch")
    try:
        check_paths(patch)
    except PatchError as exc:
        raise RepoError(f"{what}: {exc}", reason="unsafe_patch") from None


def split_patch(patch: str) -> tuple[str, str]:
    """(code patch, test patch) by path; a file whose old and new paths disagree is refused."""
    code, _ = filter_patch(patch, lambda path: not is_test_path(path))
    tests, _ = filter_patch(patch, is_test_path)
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


def require_code_and_tests(paths: Sequence[str], what: str) -> None:
    """A task needs a fix to grade against and tests to grade with, judged by the paths a change touches.

    ``no_test_changes``: no test file changed, or only runner configuration (``setup.cfg``, ``tox.ini``...)
    on the test side. ``no_code_changes``: only tests changed, or only docs, CI and packaging files
    (``README.md``, ``.github/``, ``setup.py``...) besides them. Both say which files they saw.
    """
    tests = [p for p in paths if is_test_path(p)]
    code = [p for p in paths if not is_test_path(p)]
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


def check_caps(task: Task, caps: IngestCaps) -> None:
    """Refuse a task whose text, patches or test lists are over ``caps`` (never truncated: the record is dropped).

    Reasons: ``oversize_statement``, ``oversize_hints`` (characters, ``max_statement_chars``),
    ``oversize_patch`` (bytes of the gold or test patch, ``max_patch_bytes``), ``too_many_tests``
    (fail-to-pass plus pass-to-pass, ``max_tests``).
    """
    what = task.task_id
    limit = caps.max_statement_chars
    statement = len(task.problem_statement)
    _check_cap(f"{what}: problem statement", statement, limit, "chars", "max_statement_chars", "oversize_statement")
    _check_cap(f"{what}: hints", len(task.hints), limit, "chars", "max_statement_chars", "oversize_hints")
    for name, patch in (("gold patch", task.gold_patch), ("test patch", task.test_patch)):
        size = len(patch.encode("utf-8", "surrogatepass"))
        _check_cap(f"{what}: {name}", size, caps.max_patch_bytes, "bytes", "max_patch_bytes", "oversize_patch")
    count = len(task.fail_to_pass) + len(task.pass_to_pass)
    _check_cap(f"{what}: FAIL_TO_PASS + PASS_TO_PASS", count, caps.max_tests, "tests", "max_tests", "too_many_tests")


def _check_cap(what: str, size: int, limit: int, unit: str, cap: str, reason: str) -> None:
    if size > limit:
        raise RepoError(f"{what} is {size:,} {unit} > {limit:,} ({_CAPS}.{cap})", reason=reason)


def commit_fix(
    repo: Path,
    commit: Commit,
    *,
    max_changed_lines: int = MAX_CHANGED_LINES,
    max_patch_bytes: int = MAX_PATCH_BYTES,
) -> tuple[str, str]:
    """(code patch, test patch) of a non-merge commit against its parent, refused when unusable.

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
    require_code_and_tests([path for _, _, path in stats], f"commit {commit.sha}")
    patch = _decode_diff(commit.sha, _diff(repo, parent, commit.sha))
    vet_patch(patch, f"diff of commit {commit.sha}", max_bytes=max_patch_bytes)
    return split_patch(patch)


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


# --- export files -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    where: str  # file:line, for the report
    data: dict[str, Any]


def read_lines(path: Path, funnel: Funnel, max_record_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes without the line end) of each non-blank line; longer ones are dropped unread.

    A line over ``max_record_bytes`` is never held whole: ``readline`` stops at the cap and the rest is
    read and discarded in pieces, so a 50 MB line costs one pass and a megabyte of memory. It goes to
    ``funnel`` as ``oversize_record`` with its line number and size.
    """
    with path.open("rb") as fh:
        for lineno, line in enumerate(_bounded_lines(fh, max_record_bytes), start=1):
            if isinstance(line, int):
                funnel.drop(
                    f"{path.name}:{lineno}",
                    "oversize_record",
                    f"line {lineno} is {line:,} bytes > {max_record_bytes:,} ({_CAPS}.max_record_bytes)",
                )
            elif line.strip():
                yield lineno, line.removeprefix(b"\xef\xbb\xbf") if lineno == 1 else line


def _bounded_lines(fh: BinaryIO, limit: int) -> Iterator[bytes | int]:
    """Each line without its end, or the size of a line over ``limit`` bytes in its place."""
    while chunk := fh.readline(limit + 2):  # room for the line end: a line of exactly ``limit`` bytes fits
        line = chunk.removesuffix(b"\n").removesuffix(b"\r") if chunk.endswith(b"\n") else chunk
        if len(line) <= limit:
            yield line
            continue
        size = len(line)
        while not chunk.endswith(b"\n") and (chunk := fh.readline(_SKIP_CHUNK)):
            size += len(chunk.removesuffix(b"\n"))
        yield size


def read_json_records(path: Path, funnel: Funnel, *, caps: IngestCaps = DEFAULT_CAPS) -> Iterator[Record]:
    """Records of a JSON-lines file or of one JSON array; unreadable ones go to ``funnel`` with their line.

    Bytes that are not UTF-8 are kept as lone surrogates while parsing, so one bad record is reported
    (``bad_encoding``, naming its field) and its neighbours survive. A JSON-lines record over
    ``caps.max_record_bytes`` is dropped before it is decoded (:func:`read_lines`); a JSON array is one
    document, read whole, so its elements are measured as they are parsed (give big exports as JSON lines).
    """
    if _first_char(path) == b"[":
        text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
        parsed = _array_records(path.name, text, funnel, caps.max_record_bytes)
    else:
        parsed = _line_records(path, funnel, caps.max_record_bytes)
    for where, value in parsed:
        if not isinstance(value, dict):
            funnel.drop(where, "invalid_record", f"expected a JSON object, got {type(value).__name__}")
            continue
        bad = find_undecodable(value)
        if bad is not None:
            funnel.drop(where, "bad_encoding", f"field {bad} is not valid UTF-8")
            continue
        yield Record(where, value)


def _first_char(path: Path) -> bytes:
    """The first byte that is not whitespace or a byte-order mark (``[`` for a JSON array)."""
    with path.open("rb") as fh:
        while (byte := fh.read(1)) and (byte.isspace() or byte in b"\xef\xbb\xbf"):
            pass
    return byte


def _line_records(path: Path, funnel: Funnel, max_record_bytes: int) -> Iterator[tuple[str, Any]]:
    for lineno, line in read_lines(path, funnel, max_record_bytes):
        where = f"{path.name}:{lineno}"
        try:
            yield where, json.loads(line.decode("utf-8", errors="surrogateescape"))
        except json.JSONDecodeError as exc:
            funnel.drop(where, "malformed_json", f"line {lineno}: {exc}")


def _array_records(name: str, text: str, funnel: Funnel, max_record_bytes: int) -> Iterator[tuple[str, Any]]:
    """Elements of a top-level JSON array one at a time, so each has a line number and a size."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        pos = _skip(text, pos, ",")
        if pos >= len(text) or text[pos] == "]":
            return
        where = f"{name}:{text.count(chr(10), 0, pos) + 1}"
        start = pos
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            funnel.drop(where, "malformed_json", f"{exc}; the rest of the array cannot be read")
            return
        # characters <= bytes <= 4 * characters: encode only when the count is in doubt
        size = pos - start
        if size * 4 > max_record_bytes:
            size = len(text[start:pos].encode("utf-8", "surrogateescape"))
        if size > max_record_bytes:
            cap = f"{max_record_bytes:,} ({_CAPS}.max_record_bytes)"
            funnel.drop(where, "oversize_record", f"array element is {size:,} bytes > {cap}")
            continue
        yield where, value


def _skip(text: str, pos: int, separators: str) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
        pos += 1
    return pos


def find_undecodable(value: Any, where: str = "") -> str | None:
    """The path of the first string holding a lone surrogate (an undecodable byte), or None."""
    if isinstance(value, str):
        return where or "(value)" if any("\ud800" <= ch <= "\udfff" for ch in value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = find_undecodable(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None
