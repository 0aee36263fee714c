"""Sandbox images built from Debian packages: no registry, nothing is ever pulled.

The base image is a debootstrap'd Debian with Python and pytest. It is built once
per machine into a cache directory, as an unpacked rootfs (bubblewrap) and a
deterministic tarball (imported into a container engine). Its digest is the
sha256 of that tarball, so it names the content.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trialforge.errors import SandboxError

BASE_NAME = "localhost/trialforge-base:bookworm"
BASE_PACKAGES = ("python3", "python3-pytest")
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


def base_image(cache_dir: Path | None = None, *, build: bool = True) -> Image:
    """The base image, built first when absent (about a minute and a half, once per machine)."""
    home = (cache_dir or cache_root()) / "base"
    digest_file = home / "digest"
    if not digest_file.exists():
        if not build:
            raise SandboxError(f"base image is not built in {home}: run `trialforge image build`", cause="image")
        _build_base(home)
    return Image(BASE_NAME, home / "rootfs", home / "rootfs.tar", "sha256:" + digest_file.read_text().strip())


def _build_base(home: Path) -> None:
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
                "bookworm",
                str(rootfs),
                mirror,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SandboxError(f"debootstrap failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}", cause="image")
        _scrub(rootfs)
        tarball = Path(tmp) / "rootfs.tar"
        # Sorted names, numeric owners and a fixed mtime make the tarball, and so the digest, reproducible.
        subprocess.run(
            ["tar", "--sort=name", "--numeric-owner", "--mtime=@0", "-C", str(rootfs), "-cf", str(tarball), "."],
            check=True,
        )
        shutil.rmtree(home / "rootfs", ignore_errors=True)
        rootfs.rename(home / "rootfs")
        tarball.rename(home / "rootfs.tar")
        (home / "digest").write_text(_sha256(home / "rootfs.tar"))


def _scrub(rootfs: Path) -> None:
    """Remove caches and anything that could carry history into a sandbox."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "root/.bash_history"):
        for path in rootfs.glob(pattern):
            path.unlink(missing_ok=True) if not path.is_dir() else shutil.rmtree(path)
    (rootfs / "work").mkdir(exist_ok=True)
    assert_no_git_history(rootfs)


def assert_no_git_history(tree: Path) -> None:
    """Images, snapshots and workspaces must never carry a repository's history."""
    found = [str(p) for p in tree.rglob(".git") if p.is_dir() or p.is_file()]
    if found:
        raise SandboxError(f"git history found in {tree}: {found[:5]}", cause="git_history")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
