"""Per-mount and per-namespace limits of every sandbox, and how trialforge's Podman applies what its API cannot.

* A tmpfs of ``size`` bytes holds ``INODES_PER_MIB`` inodes per MiB of it (``disk.py`` sizes every
  place by this rule): a flood of empty files, which take no bytes, stops there.
* A sandbox's ``/dev/pts`` is a devpts instance of its own with at most ``PTYS`` terminals: the
  kernel's pool (``kernel.pty.max``, 4096 by default, 1024 of them kept for the host) is shared by
  every sandbox on the host, and one that took them all would leave none to the others.
* A container's user namespace gets its own per-user limits (``USERNS_LIMITS``). The kernel counts
  what a user namespace's users hold against the namespace's owner too, and every container Podman
  runs as root is root's: without a limit of its own, one container holding 128 inotify instances
  (``fs.inotify.max_user_instances``) left none to every other container, and none to host root.
  ``scripts/setup-system.sh`` raises root's own limits so that many containers at theirs fit.

bwrap mounts the first two itself, and each bwrap sandbox is a host uid of its own, counted alone;
Docker takes ``nr_inodes``. Podman's API refuses ``nr_inodes`` and has no say over devpts or the
namespace's limits, so trialforge's Podman runs ``runc`` through ``images/podman/oci-runtime``, a shell
script (it runs at every create) that ``runtime_script`` fills in with these values.
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
