"""What may come out of a sandbox: regular files, directories and links that stay inside the tree.

Workspaces leave sandboxes as exports, snapshots, cached starts and diffs, and land in
directories the host reads (and, for a cached start, seeds other sandboxes from).
Whatever the agent made, none of it may carry privilege out: no setuid/setgid/sticky
bits, no group/other write, no device nodes, fifos or sockets, and no symlink that
resolves outside the tree. Every copy out of a sandbox goes through ``copy_out`` (bwrap)
or ``tar_member`` (the container backend's archives), the one place this is decided.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
from pathlib import Path

SAFE_BITS = 0o755  # rwx for the owner, r-x for others at most: no setuid, setgid, sticky, group/other write


def safe_mode(mode: int) -> int:
    return stat.S_IMODE(mode) & SAFE_BITS


def link_stays_inside(link_rel: str, target: str) -> bool:
    """Does a symlink at ``link_rel`` (relative to the tree's root) pointing at ``target`` stay in the tree?"""
    if posixpath.isabs(target):
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link_rel), target))
    return resolved != ".." and not resolved.startswith("../")


def copy_out(src: Path, dest: Path, *, owner: tuple[int, int] | None = None) -> list[str]:
    """Copy the tree ``src`` into ``dest`` keeping only what is safe; returns what was dropped or defused.

    Nothing is followed: a symlink is copied as a link (when it stays inside) and never
    read through. Files get ``owner`` (uid, gid) when given, else whoever copies.
    """
    dropped: list[str] = []
    dest.mkdir(parents=True, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        out_dir = dest if rel_dir == "." else dest / rel_dir
        for name in [*dirnames, *filenames]:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            path, out = Path(dirpath) / name, out_dir / name
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(path)
                if not link_stays_inside(rel, target):
                    dropped.append(f"{rel}: symlink out of the tree")
                    continue
                out.unlink(missing_ok=True)
                os.symlink(target, out)
            elif stat.S_ISDIR(info.st_mode):
                out.mkdir(exist_ok=True)
                os.chmod(out, safe_mode(info.st_mode) | 0o700)
            elif stat.S_ISREG(info.st_mode):
                if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    dropped.append(f"{rel}: setuid/setgid bit removed")
                _copy_file(path, out, safe_mode(info.st_mode))
            else:
                dropped.append(f"{rel}: special file (device, fifo or socket) left out")
                continue
            if owner is not None:
                os.lchown(out, *owner)
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    if owner is not None:
        os.lchown(dest, *owner)
    return dropped


def _copy_file(src: Path, dest: Path, mode: int) -> None:
    """Copy contents only (no metadata), never through a link, into a fresh file with ``mode``."""
    if dest.is_symlink() or dest.exists():
        dest.unlink()
    fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fd_out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            with os.fdopen(fd_in, "rb", closefd=False) as fin, os.fdopen(fd_out, "wb", closefd=False) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)
    os.chmod(dest, mode)  # O_CREAT's mode is cut by the umask


def tar_member(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """The archive form of the same rule: None for what must not come out, else a defused copy."""
    if member.issym():
        return member if link_stays_inside(member.name, member.linkname) else None
    if member.islnk():
        return member if link_stays_inside(".", member.linkname) else None
    if not (member.isreg() or member.isdir()):
        return None
    mode = safe_mode(member.mode) | (0o700 if member.isdir() else 0)
    return member.replace(mode=mode, deep=False)
