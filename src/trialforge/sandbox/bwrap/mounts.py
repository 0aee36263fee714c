"""Host-side mounts of root-run bwrap sandboxes, made and removed by system call (no ``mount`` process).

Each place of a sandbox (``disk.py``) is a tmpfs under its home, mounted ``nosuid,nodev`` with its size, inode
limit, mode and the sandbox's leased owner, and its ``/dev/pts`` a devpts instance of its own with a terminal
limit (``oci_limits.PTYS``). A process per mount and per unmount cost milliseconds each; the calls themselves
cost microseconds.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from trialforge.errors import SandboxError

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MNT_DETACH = 0x2
_libc = ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(target: Path, options: str, *, source: str) -> None:
    """Mount a tmpfs named ``source`` on ``target`` with ``options`` (``size=...,nr_inodes=...,mode=...,uid=...``)."""
    _mount("tmpfs", target, options, source=source, flags=MS_NOSUID | MS_NODEV)


def mount_devpts(target: Path, options: str, *, source: str) -> None:
    """Mount a new devpts instance on ``target`` (its ``ptmx`` allocates from it alone)."""
    _mount("devpts", target, f"newinstance,{options}", source=source, flags=MS_NOSUID | MS_NOEXEC)


def _mount(fstype: str, target: Path, options: str, *, source: str, flags: int) -> None:
    if _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags, options.encode()) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"cannot mount the {fstype} {target} ({options}): {os.strerror(err)}", cause="start")


def unmount(target: Path | str) -> None:
    """Detach the mount on ``target`` (lazily: a process still inside keeps it until it leaves); quiet if none."""
    if _libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more), or gone
            raise OSError(err, f"umount {target}: {os.strerror(err)}")
