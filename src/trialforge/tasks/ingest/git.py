"""Running git on the repositories ingestion reads: one hardened command line, the mirrors, revisions.

Every git command runs without user or system configuration and with nothing a repository's own config could
make it execute (hooks, fsmonitor, pager). Repository names resolve to local mirrors; a clone URL is cloned
(``--mirror``) once, on first use. A failure is a :class:`RepoError` naming the command (``git_error``) or
the missing commit or repository.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from trialforge.errors import RepoError
from trialforge.scratch import scratch_dir
from trialforge.tasks.patches import git_env

RepoSource = str | Path  # a local git repository (bare mirror or work tree) or a clone URL

GIT_TIMEOUT_S = 600
_URL = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:)", re.IGNORECASE)


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
