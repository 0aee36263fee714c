"""Per-mount and per-namespace limits of every sandbox, and how trialforge's Podman applies what its API cannot.

``INODES_PER_MIB`` inodes per MiB of a tmpfs (``disk.py`` sizes every place by it), ``PTYS`` terminals in a
sandbox's own devpts, and ``USERNS_LIMITS`` per container user namespace. bwrap mounts the first two itself; Docker
takes ``nr_inodes``; Podman's API cannot ask for any of them, so our Podman runs ``runc`` through
``images/podman/oci-runtime``, a shell script ``runtime_script`` fills in with these values. Why each: docs/security.md,
R1, R4 and R5.
"""

from __future__ import annotations

from pathlib import Path

INODES_PER_MIB = 128  # 32,768 files and directories in a 256 MiB quota: a large repository's checkout fits
PTYS = 16  # terminals one sandbox may hold at once (a test suite that drives a shell through one needs a few)
# /proc/sys/user/* of a container's user namespace: a host user's defaults. (Not the namespace counts: the syscall
# filter refuses nested namespaces to the sandbox, while its slirp4netns makes a mount namespace in this one.)
USERNS_LIMITS = {"max_inotify_instances": 128, "max_inotify_watches": 65536}
MIB = 1 << 20


def inodes_for(size_bytes: int) -> int:
    """The inode limit of a tmpfs of ``size_bytes`` (the runtime wrapper computes the same in shell)."""
    return max(1, size_bytes * INODES_PER_MIB // MIB)


def runtime_script(template: Path) -> str:
    """``images/podman/oci-runtime`` with these limits filled in."""
    limits = "; ".join(f"echo {value} > /proc/sys/user/{name}" for name, value in USERNS_LIMITS.items())
    return (
        template.read_text()
        .replace("@INODES_PER_MIB@", str(INODES_PER_MIB))
        .replace("@PTYS@", str(PTYS))
        .replace("@USERNS_LIMITS@", limits)
    )
