"""How a bubblewrap sandbox is confined: every protection a named step, listed in one place.

``bwrap_argv`` assembles them; docs/security.md maps each to the threat it answers and
tests/test_escapes.py to the attack that proves it holds.

1. ``identity``: drop to the sandbox's own leased host uid and gid (``host.idleases``: one per live
   sandbox, from a subordinate range), keeping only the group that traverses the state dir (as
   root); no capabilities, no-new-privileges; *before* bwrap runs, so the user namespace maps the
   sandbox user to that uid, never to host root, never to another sandbox's uid. A normal user's
   sandbox does the same inside its holder's namespace (``nsholder``), where that uid is 1.
2. ``namespaces``: new user, mount, pid, ipc, uts, cgroup and network namespaces; nested
   user namespaces disabled; the process dies with its parent. The network namespace holds
   only ``lo``; with ``Limits.network`` a user-mode stack of the command's own adds ``tap0``
   (``usernet.py``: slirp4netns, the host's loopback refused), never the host's namespace.
3. ``filesystem``: the image read-only; ``/work``, ``/tmp``, ``/var/tmp`` and ``/dev/shm`` the only
   writable places, each a tmpfs of its share of the disk quota in bytes and inodes (``disk.py``;
   nosuid, nodev); a fresh ``/proc`` with the kernel's knobs read-only and its info leaks masked, a
   minimal ``/dev``, read-only itself, whose ``/dev/pts`` is a devpts instance of the sandbox's own with a
   terminal limit (``oci_limits.PTYS``: the kernel's pool of terminals is the host's); no ``/sys``.
4. ``seccomp``: the syscall filter in ``seccomp.py``.
5. ``environment``: nothing from the host: an explicit environment and hostname (and bwrap itself,
   whose pid 1 keeps its own environment, starts with an empty one: ``env -i``).
"""

from __future__ import annotations

import shutil
from functools import cache
from pathlib import Path

from trialforge.sandbox.procfs import MASKED_PROC, READONLY_PROC

HOST_PROC = Path("/proc")
TOOLS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@cache
def tool(name: str) -> str:
    """The absolute path of a launcher (bwrap, setpriv...): they run with an empty environment, so no ``PATH``."""
    return shutil.which(name, path=TOOLS_PATH) or name


def identity(uid: int, gid: int, group: int | None) -> list[str]:
    return [
        tool("setpriv"),
        f"--reuid={uid}",
        f"--regid={gid}",
        f"--groups={group}" if group is not None else "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def namespaces(*, uid: int) -> list[str]:
    return [
        "--unshare-all",  # user, ipc, pid, net, uts, cgroup (and mount, always)
        "--unshare-user",
        "--disable-userns",
        "--uid", str(uid),
        "--gid", str(uid),
        "--cap-drop", "ALL",
        "--die-with-parent",
        "--new-session",  # no controlling terminal to push keystrokes into
    ]  # fmt: skip


def filesystem(rootfs: Path, places: dict[str, Path], *, pts: Path) -> list[str]:
    """``places``: each writable path inside and the host directory (its tmpfs) bound there; ``pts``: the sandbox's
    own devpts instance (its terminal limit), bound over bwrap's, which has none."""
    args = ["--ro-bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev", "--dev-bind", str(pts), "/dev/pts"]
    for inside, host in places.items():
        args += ["--bind", str(host), inside]  # bwrap binds nosuid,nodev (and the tmpfs are mounted so)
    args += ["--remount-ro", "/dev"]  # bwrap's /dev is a tmpfs of no size that the sandbox user owns
    for path in MASKED_PROC:
        host = HOST_PROC / path.removeprefix("/proc/")
        if host.is_dir():
            args += ["--tmpfs", path, "--remount-ro", path]
        elif host.exists():
            args += ["--ro-bind", "/dev/null", path]
    for path in READONLY_PROC:
        if (HOST_PROC / path.removeprefix("/proc/")).exists():
            args += ["--ro-bind", path, path]
    return args


def seccomp(fd: int) -> list[str]:
    return ["--seccomp", str(fd)]


def environment(env: dict[str, str], *, cwd: str) -> list[str]:
    args = ["--clearenv", "--hostname", "sandbox", "--chdir", cwd]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args
