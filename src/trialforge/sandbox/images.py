"""Sandbox images built from Debian packages: no registry, nothing is ever pulled.

A base image is a debootstrap'd Debian release with Python, pytest and pip (bookworm by default;
another release where a task's environment asks for its Python). It is built once per machine
into a cache directory, as an unpacked rootfs (bubblewrap) and a deterministic tarball (imported
into a container engine). Its digest is the sha256 of that tarball, so it names the content.
Environment images (``trialforge.tasks.envimages``) are layered on a base image; ``find_image`` resolves either
kind by name, so a backend can open any image a task names without being told about it first.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trialforge.errors import SandboxError

DEFAULT_SUITE = "bookworm"
BASE_REPO = "localhost/trialforge-base"
BASE_NAME = f"{BASE_REPO}:{DEFAULT_SUITE}"
ENV_REPO = "localhost/trialforge-env"
# pip installs an environment image's requirements at build time (there is no network after it);
# python-is-python3 makes `python` the release's python3, as nearly every agent and person types it.
BASE_PACKAGES = ("python3", "python-is-python3", "python3-pytest", "python3-pip")
DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class Image:
    name: str
    rootfs: Path
    tarball: Path
    digest: str  # "sha256:<hex>" of the tarball


def cache_root() -> Path:
    if env := os.environ.get("TRIALFORGE_CACHE"):
        return Path(env)
    return Path("/var/cache/trialforge") if os.geteuid() == 0 else Path.home() / ".cache" / "trialforge"


def base_image(cache_dir: Path | None = None, *, build: bool = True, suite: str = DEFAULT_SUITE) -> Image:
    """The base image of Debian ``suite``, built first when absent (a minute or two, once per machine)."""
    home = (cache_dir or cache_root()) / base_key(suite)
    if not (home / "digest").exists():
        if not build:
            raise SandboxError(f"base image is not built in {home}: run `trialforge image build`", cause="image")
        with build_lock(home):
            if not (home / "digest").exists():
                _build_base(home, suite)
    return cached_image(f"{BASE_REPO}:{suite}", home)


def base_key(suite: str = DEFAULT_SUITE) -> str:
    """The base image's cache key: its release and package list. Changing either builds a new base, and new
    environment images on it (their keys hold this one), never reuses a stale one."""
    return f"base-{suite}-{hashlib.sha256(' '.join(BASE_PACKAGES).encode()).hexdigest()[:8]}"


def find_image(name: str, cache_dir: Path | None = None) -> Image:
    """The built image called ``name``: a base (``...-base:SUITE``) or an environment (``...-env:KEY``).

    Nothing is built here: a task names an image that ``trialforge image build`` made, and a
    missing one is an error that says so.
    """
    repo, _, tag = name.rpartition(":")
    if repo == BASE_REPO and tag:
        return base_image(cache_dir, build=False, suite=tag)
    if repo == ENV_REPO and tag:
        home = (cache_dir or cache_root()) / "envs" / tag
        if (home / "digest").exists():
            return cached_image(name, home)
        raise SandboxError(
            f"environment image {name} is not built on this machine: run `trialforge image build` "
            "on the task set that names it",
            cause="image",
        )
    raise SandboxError(f"unknown image {name!r}: expected {BASE_REPO}:SUITE or {ENV_REPO}:KEY", cause="image")


def cached_image(name: str, home: Path) -> Image:
    return Image(name, home / "rootfs", home / "rootfs.tar", "sha256:" + (home / "digest").read_text().strip())


@contextlib.contextmanager
def build_lock(home: Path) -> Iterator[None]:
    """One build of an image at a time on this machine (two processes may ask for it at once)."""
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _build_base(home: Path, suite: str) -> None:
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is missing: apt-get install debootstrap (as root)", cause="image")
    if os.geteuid() != 0:
        raise SandboxError("building the base image needs root (debootstrap)", cause="image")
    home.mkdir(parents=True, exist_ok=True)
    mirror = os.environ.get("TRIALFORGE_DEBIAN_MIRROR", DEFAULT_MIRROR)
    with tempfile.TemporaryDirectory(dir=home, prefix=".build-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        done = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                suite,
                str(rootfs),
                mirror,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SandboxError(f"debootstrap failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}", cause="image")
        seal(rootfs, home)


def seal(rootfs: Path, home: Path) -> None:
    """Scrub ``rootfs``, pack it and move it into ``home`` with its digest (written last: it marks a whole image)."""
    _scrub(rootfs)
    tarball = rootfs.parent / "rootfs.tar"
    # Sorted names, numeric owners and a fixed mtime make the tarball, and so the digest, reproducible.
    subprocess.run(
        ["tar", "--sort=name", "--numeric-owner", "--mtime=@0", "-C", str(rootfs), "-cf", str(tarball), "."],
        check=True,
    )
    (home / "digest").unlink(missing_ok=True)
    shutil.rmtree(home / "rootfs", ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    rootfs.rename(home / "rootfs")
    tarball.rename(home / "rootfs.tar")
    (home / "digest").write_text(sha256_file(home / "rootfs.tar"))


def _scrub(rootfs: Path) -> None:
    """Remove caches and anything that could carry history into a sandbox."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "root/.bash_history", "root/.cache"):
        for path in rootfs.glob(pattern):
            path.unlink(missing_ok=True) if not path.is_dir() else shutil.rmtree(path)
    (rootfs / "work").mkdir(exist_ok=True)
    assert_no_git_history(rootfs)


def assert_no_git_history(tree: Path) -> None:
    """Images, snapshots and workspaces must never carry a repository's history."""
    found = [str(p) for p in tree.rglob(".git") if p.is_dir() or p.is_file()]
    if found:
        raise SandboxError(f"git history found in {tree}: {found[:5]}", cause="git_history")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
