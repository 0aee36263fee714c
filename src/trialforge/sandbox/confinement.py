"""How a bubblewrap sandbox is confined: every protection a named step, listed in one place.

``bwrap_argv`` assembles them; docs/security.md maps each to the threat it answers and
tests/test_escapes.py to the attack that proves it holds.

1. ``identity``: as root, drop to the dedicated sandbox account (no capabilities, no
   supplementary groups, no-new-privileges) *before* bwrap runs, so the user namespace maps
   the sandbox user to that account, never to host root.
2. ``namespaces``: new user, mount, pid, ipc, uts, cgroup and network namespaces; nested
   user namespaces disabled; the process dies with its parent. The network namespace holds
   only ``lo``; with ``Limits.network`` a user-mode stack of the command's own adds ``tap0``
   (``usernet.py``: slirp4netns, the host's loopback refused), never the host's namespace.
3. ``filesystem``: the image read-only, ``/work`` the one writable tree (nosuid, nodev),
   a size-bounded ``/tmp``, a fresh ``/proc`` with the kernel's knobs read-only and its
   info leaks masked, a minimal ``/dev``, no ``/sys``.
4. ``seccomp``: the syscall filter in ``seccomp.py``.
5. ``environment``: nothing from the host: an explicit environment and hostname.
"""

from __future__ import annotations

from pathlib import Path

from trialforge.sandbox.identity import HostIdentity

# What runc masks (bind /dev/null over files, an empty read-only tmpfs over directories)...
MASKED_PROC = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/timer_list",
    "/proc/timer_stats",
)
# ...and what it makes read-only: host-wide kernel parameters (core_pattern runs a program as host root).
READONLY_PROC = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")

HOST_PROC = Path("/proc")


def identity(ident: HostIdentity | None) -> list[str]:
    if ident is None:  # not root: the user namespace maps the sandbox user to an unprivileged caller already
        return []
    return [
        "setpriv",
        f"--reuid={ident.uid}",
        f"--regid={ident.gid}",
        "--clear-groups",
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


def filesystem(rootfs: Path, workspace: Path, *, tmp_bytes: int) -> list[str]:
    args = [
        "--ro-bind", str(rootfs), "/",
        "--bind", str(workspace), "/work",  # bwrap binds nosuid,nodev
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(tmp_bytes), "--tmpfs", "/tmp",
    ]  # fmt: skip
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
