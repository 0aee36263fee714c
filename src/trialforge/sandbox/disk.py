"""Every place a sandboxed command can write, each a tmpfs with a size and an inode limit, inside one disk budget.

A sandbox's disk quota (``Limits.disk_mb``) is split here, once, on both backends, between ``/work``, ``/tmp``,
``/var/tmp``, ``/dev/shm`` and a sliver for ``/run`` (docker's, read-only to the sandbox user): bytes and inodes
(``oci_limits.INODES_PER_MIB``) by one rule, so the places never sum past the quota. Nothing else in a sandbox is
writable. docs/security.md, "A sandbox cannot exhaust its host" (R1).
"""

from __future__ import annotations

from dataclasses import dataclass

from trialforge.sandbox.base import WORKDIR, Limits
from trialforge.sandbox.oci_limits import INODES_PER_MIB, MIB, PTYS, inodes_for

__all__ = ["INODES_PER_MIB", "MIB", "WORKDIR", "Place", "places", "scratch", "workspace"]

MIN_BYTES = 64 * 1024  # no place smaller than this, however small the quota (one of 1 MiB still sums inside it)
# Scratch places, in sixteenths of the budget; the workspace gets what they leave.
SCRATCH_SHARES = {"/tmp": 2, "/var/tmp": 1, "/dev/shm": 1}
RUN = "/run"  # mounted by the docker backend only, read-only to the sandbox user: a sixty-fourth of the budget
RUN_SHARE = 64


@dataclass(frozen=True)
class Place:
    """One writable tmpfs of a sandbox: where it is mounted inside, its host-side name, and its bounds."""

    path: str
    size_bytes: int
    inodes: int
    mode: int  # of its root: the workspace is the sandbox user's alone, scratch space is shared and sticky

    @property
    def name(self) -> str:
        """The directory a host-side mount of it is called (bwrap): ``/var/tmp`` -> ``var-tmp``."""
        return "work" if self.path == WORKDIR else self.path.strip("/").replace("/", "-")

    def tmpfs_options(self) -> str:
        """The tmpfs's own options (mount flags such as ``nosuid,nodev`` are the mounter's to add)."""
        return f"size={self.size_bytes},nr_inodes={self.inodes},mode={self.mode:04o}"


def places(limits: Limits) -> tuple[Place, ...]:
    """The workspace first, then the scratch places and ``/run``: their bytes and inodes sum to the quota's."""
    total = limits.disk_mb * MIB
    sizes = {path: max(total * share // 16, MIN_BYTES) for path, share in SCRATCH_SHARES.items()}
    sizes[RUN] = max(total // RUN_SHARE, MIN_BYTES)
    work = total - sum(sizes.values())
    return (
        Place(WORKDIR, work, inodes_for(work), 0o700),
        *(Place(path, size, inodes_for(size), 0o755 if path == RUN else 0o1777) for path, size in sizes.items()),
    )


PTS = "pts"  # a bwrap sandbox's devpts instance, mounted beside its places (``bwrap/mounts.py``)
# every host-side mount a bwrap sandbox's home may hold: its places and its devpts
HOME_MOUNTS = frozenset({PTS, *(p.name for p in places(Limits()))})
PTS_OPTIONS = f"ptmxmode=0666,mode=0620,max={PTYS}"


def scratch(limits: Limits) -> tuple[Place, ...]:
    """The places besides ``/work`` a command can write (``/run`` is not one): emptied whenever ``/work`` is reset."""
    return tuple(p for p in places(limits)[1:] if p.path != RUN)


def workspace(limits: Limits) -> Place:
    """The share of ``/work``: what an export, a snapshot or a restore of it may hold."""
    return places(limits)[0]
