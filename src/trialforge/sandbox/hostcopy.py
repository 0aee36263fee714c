"""Copies between a sandbox's workspace and the host, bounded as they are read.

Every copy of what the agent shaped (exports, snapshots, checkpoints, restores, file reads) takes a ``Budget`` (the
workspace's share of the quota, ``disk.py``) and charges it as it reads: logical size per inode, every entry, the
depth. The first charge past a limit raises ``SandboxError`` (cause ``quota``) naming the limit, never a raw
``OSError``. ``copy_tree`` (bwrap) works through directory fds, following nothing; docker archives are charged in
``container.transfer``; what may come out at all is ``sanitize``'s rule. docs/security.md, R2.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from trialforge.errors import SandboxError
from trialforge.sandbox.base import Limits
from trialforge.sandbox.disk import MIB, workspace
from trialforge.sandbox.sanitize import link_stays_inside, safe_mode

MAX_DEPTH = 64  # directories below the root: a repository needs a fraction of it; each level holds two fds
CHUNK = 1 << 20
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EMLINK)


@dataclass(frozen=True)
class CopyLimits:
    """How much one copy of a workspace may carry; ``source`` names the setting it comes from, for the error."""

    bytes: int
    entries: int
    depth: int = MAX_DEPTH
    source: str = "sandbox.disk_mb"

    @classmethod
    def of(cls, limits: Limits) -> CopyLimits:
        """The workspace's share of the sandbox's disk quota: what its ``/work`` can hold, in bytes and inodes."""
        place = workspace(limits)
        return cls(place.size_bytes, place.inodes, source=f"/work's share of sandbox.disk_mb={limits.disk_mb}")


@dataclass
class Budget:
    """What one copy has taken so far; every ``take_*`` raises once a limit would be passed."""

    limits: CopyLimits
    what: str  # "the export of tf-..." : the copy, for the error
    bytes: int = 0
    entries: int = 0
    seen: dict[tuple[int, int], str] = field(default_factory=dict)  # (dev, inode) -> where it was copied to

    def take_entry(self, rel: str, depth: int) -> None:
        self.entries += 1
        if self.entries > self.limits.entries:
            self._stop(f"more than {self.limits.entries} files, directories and links")
        if depth > self.limits.depth:
            self._stop(f"{rel!r} is deeper than {self.limits.depth} directories")

    def take_bytes(self, size: int, rel: str) -> None:
        """Charge a regular file's logical size (sparse files count in full: the host writes them in full)."""
        self.bytes += size
        if self.bytes > self.limits.bytes:
            self._stop(f"more than {_mib(self.limits.bytes)} of file data (at {rel!r}; sparse files count in full)")

    def take_tree(self, size: int, entries: int) -> None:
        """Charge a whole tree counted when it was made (a snapshot): a restore that cannot fit is refused up front."""
        self.entries += entries
        if self.entries > self.limits.entries:
            self._stop(f"{entries} files, directories and links, more than {self.limits.entries}")
        self.take_bytes(size, ".")

    def linked(self, key: tuple[int, int], rel: str) -> str | None:
        """Where an inode seen before went (a hard link: charged once, linked again); None the first time."""
        if key in self.seen:
            return self.seen[key]
        self.seen[key] = rel
        return None

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A destination that fills up before the budget does (a workspace smaller than the copy) is the same error,
        never a raw ``OSError``."""
        try:
            yield
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
            raise SandboxError(
                f"{self.what} does not fit: {exc.strerror} after {_mib(self.bytes)} and {self.entries} entries "
                f"(limit: {self.limits.source})",
                cause="quota",
            ) from exc

    def _stop(self, why: str) -> None:
        raise SandboxError(f"{self.what} stopped at the workspace quota: {why} (limit: {self.limits.source})",
                           cause="quota")  # fmt: skip


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def copy_tree(src: int, dest: int, budget: Budget, *, owner: tuple[int, int] | None = None) -> list[str]:
    """Copy the directory open as ``src`` into the one open as ``dest`` (both fds, left open), keeping only what is
    safe (``sanitize``), charging ``budget``; returns what was dropped or defused.

    Files get ``owner`` (uid, gid) when given, else whoever copies. A destination that fills up is the
    budget's error too, never a raw ``OSError``.
    """
    dropped: list[str] = []
    with budget.writing():
        _copy_dir(src, dest, "", 0, budget, owner, dropped, dest)
    return dropped


def _copy_dir(
    src: int,
    dest: int,
    rel_dir: str,
    depth: int,
    budget: Budget,
    owner: tuple[int, int] | None,
    dropped: list[str],
    root: int,
) -> None:
    for name in os.listdir(src):
        rel = f"{rel_dir}{name}"
        budget.take_entry(rel, depth)
        info = os.stat(name, dir_fd=src, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            target = os.readlink(name, dir_fd=src)
            if not link_stays_inside(rel, target):
                dropped.append(f"{rel}: symlink out of the tree")
                continue
            _clear(dest, name)
            os.symlink(target, name, dir_fd=dest)
        elif stat.S_ISDIR(info.st_mode):
            _copy_subdir(src, dest, name, rel, depth, budget, owner, dropped, root, safe_mode(info.st_mode) | 0o700)
        elif stat.S_ISREG(info.st_mode):
            if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                dropped.append(f"{rel}: setuid/setgid bit removed")
            first = budget.linked((info.st_dev, info.st_ino), rel) if info.st_nlink > 1 else None
            _clear(dest, name)
            if first is not None:
                os.link(first, name, src_dir_fd=root, dst_dir_fd=dest, follow_symlinks=False)
                continue  # one inode: its owner and mode were set when it was first copied
            budget.take_bytes(info.st_size, rel)
            _copy_file(src, dest, name, info, safe_mode(info.st_mode))
        else:
            dropped.append(f"{rel}: special file (device, fifo or socket) left out")
            continue
        if owner is not None:
            os.chown(name, *owner, dir_fd=dest, follow_symlinks=False)


def _copy_subdir(
    src: int,
    dest: int,
    name: str,
    rel: str,
    depth: int,
    budget: Budget,
    owner: tuple[int, int] | None,
    dropped: list[str],
    root: int,
    mode: int,
) -> None:
    try:
        os.mkdir(name, 0o700, dir_fd=dest)
    except FileExistsError:
        if not stat.S_ISDIR(os.stat(name, dir_fd=dest, follow_symlinks=False).st_mode):
            _clear(dest, name)
            os.mkdir(name, 0o700, dir_fd=dest)
    sub_src = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src)
    try:
        sub_dest = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dest)
        try:
            _copy_dir(sub_src, sub_dest, f"{rel}/", depth + 1, budget, owner, dropped, root)
            os.chmod(sub_dest, mode)
        finally:
            os.close(sub_dest)
    finally:
        os.close(sub_src)


def _clear(dest: int, name: str) -> None:
    """Make room for ``name`` in ``dest``: a file or link there goes (a directory stays, to be merged into)."""
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(name, dir_fd=dest)


def _copy_file(src: int, dest: int, name: str, info: os.stat_result, mode: int) -> None:
    """Contents only (no metadata), never through a link, at most the size charged for it, into a fresh file."""
    fd_in = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
    try:
        now = os.fstat(fd_in)
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino) or not stat.S_ISREG(now.st_mode):
            raise SandboxError(f"{name!r} changed while it was being copied", cause="path")
        fd_out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dest)
        try:
            left = info.st_size  # charged already: a file that grew meanwhile is cut there
            while left > 0:
                sent = os.sendfile(fd_out, fd_in, None, min(left, CHUNK))
                if sent == 0:
                    break
                left -= sent
            os.fchmod(fd_out, mode)  # O_CREAT's mode is cut by the umask
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def read_bounded(dir_fd: int, name: str, cap: int, what: str) -> bytes:
    """A regular file's bytes, refused (``SandboxError`` cause ``quota``) when it is larger than ``cap``: its size is
    asked before a byte is read, and no more than that is read however it grows. A fifo or a device is refused
    without blocking (``FileNotFoundError``, as for a file that is not there)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileNotFoundError(f"{what}: not a regular file")
        if info.st_size > cap:
            raise too_big(what, info.st_size, cap)
        chunks, left = [], info.st_size
        while left > 0 and (chunk := os.read(fd, min(left, CHUNK))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def too_big(what: str, size: int, cap: int) -> SandboxError:
    """The error of a file read refused for its size (both backends say the same)."""
    return SandboxError(
        f"{what} is {_mib(size)}, more than a read may carry ({_mib(cap)}: the workspace's share of "
        "sandbox.disk_mb; sparse files count in full)",
        cause="quota",
    )
