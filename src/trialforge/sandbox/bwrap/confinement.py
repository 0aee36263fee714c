"""How a bubblewrap sandbox is confined: every protection a named step, listed in one place.

``bwrap_argv`` assembles them: ``identity`` (the sandbox's own leased host uid, dropped to before bwrap runs),
``namespaces`` (all new, no nested user namespaces, dying with the parent; the network one holds only ``lo``, or a
``usernet.py`` tap), ``filesystem`` (the image read-only, the ``disk.py`` places the only writable ones, masked
``/proc``, a read-only ``/dev`` with a devpts of its own, no ``/sys``), ``seccomp`` (``seccomp.py``) and
``environment`` (nothing from the host). docs/security.md, "The bwrap backend", says each step in full and maps it to
the threat it answers; tests/test_escapes.py holds the attack that proves it.
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
