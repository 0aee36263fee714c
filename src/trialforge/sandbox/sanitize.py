"""What may come out of a sandbox: regular files, directories and links that stay inside the tree.

Workspaces leave sandboxes as exports, snapshots, cached starts and diffs, and land in
directories the host reads (and, for a cached start, seeds other sandboxes from).
Whatever the agent made, none of it may carry privilege out: no setuid/setgid/sticky
bits, no group/other write, no device nodes, fifos or sockets, and no symlink that
resolves outside the tree. Every copy out of a sandbox applies ``safe_mode`` and
``link_stays_inside`` (bwrap: ``hostcopy.copy_tree``) or ``tar_member`` (the container
backend's archives): this is the one place it is decided. How much may come out is
``hostcopy``'s to decide.
"""

from __future__ import annotations

import posixpath
import stat
import tarfile

SAFE_BITS = 0o755  # rwx for the owner, r-x for others at most: no setuid, setgid, sticky, group/other write


def safe_mode(mode: int) -> int:
    return stat.S_IMODE(mode) & SAFE_BITS


def link_stays_inside(link_rel: str, target: str) -> bool:
    """Does a symlink at ``link_rel`` (relative to the tree's root) pointing at ``target`` stay in the tree?"""
    if posixpath.isabs(target):
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link_rel), target))
    return resolved != ".." and not resolved.startswith("../")


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
