"""Per-sandbox cgroups: memory, process count and CPU bounds for bubblewrap sandboxes, and their CPU use.

Container engines set these themselves; bubblewrap does not, so the bwrap backend
creates one child group per sandbox below this process's own groups (cgroup v1,
as on hybrid hosts, or the unified v2 hierarchy) and starts every command inside it.
Root may do that anywhere; a normal user where its groups are delegated to it (a systemd
user slice, or a subtree an administrator chowned to it and started it in): ``missing``
says what stands in the way, and the backend refuses to run sandboxes without limits
unless told to accept that.
The group's CPU counter is kept by the kernel, out of the sandboxed code's reach: what
an episode used is read there (``cpu_s``), not from anything the sandbox reports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trialforge.errors import SandboxError

log = logging.getLogger(__name__)
ROOT = Path("/sys/fs/cgroup")
REMOVE_WAIT_S = 10.0
# A group whose processes take longer than that to exit is retried in the background this long (then, or if
# this process dies first, its sandbox's record is left due for `trialforge reap`).
LATER_WAIT_S = 600.0
CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")  # v1: cpuacct counts the CPU used


def _own_path(controller: str) -> str:
    """This process's group in ``controller`` ('' for the v2 unified hierarchy)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(",") or (controller == "" and names == ""):
            return path
    raise SandboxError(f"this process is in no {controller or 'unified'} cgroup", cause="cgroup")


def _is_v1() -> bool:
    return (ROOT / "memory" / "memory.limit_in_bytes").exists() or (ROOT / "memory").is_dir()


V2_CONTROLLERS = ("memory", "pids", "cpu")


def missing() -> list[str]:
    """What keeps this process from giving each sandbox a cgroup with limits (empty: nothing)."""
    uid = os.geteuid()
    try:
        if _is_v1():
            bases = [(c, ROOT / c / _own_path(c).lstrip("/")) for c in CONTROLLERS]
        else:
            bases = [("unified", ROOT / _own_path("").lstrip("/"))]
    except (OSError, SandboxError) as exc:
        return [str(exc)]
    problems = [
        f"{name}: {base} is not writable by uid {uid}"
        for name, base in bases
        if not (base.is_dir() and os.access(base, os.W_OK) and os.access(base / "cgroup.procs", os.W_OK))
    ]
    if not problems and not _is_v1():
        enabled = (bases[0][1] / "cgroup.controllers").read_text().split()
        problems += [f"{c}: not delegated to {bases[0][1]}" for c in V2_CONTROLLERS if c not in enabled]
    return problems


def available() -> bool:
    """True when this process may create child cgroups with limits (root, or a delegated hierarchy)."""
    return not missing()


@dataclass
class SandboxCgroup:
    """The cgroup directories of one sandbox; ``dirs`` has one entry per v1 controller or a single v2 group."""

    name: str
    dirs: list[Path]
    v1: bool
    killer: Callable[[list[int]], None] | None = None  # how its processes are killed, when not by os.kill

    @staticmethod
    def paths(name: str) -> list[Path]:
        """The directories ``create(name)`` makes: a record can name them before they exist."""
        if _is_v1():
            return [ROOT / c / _own_path(c).lstrip("/") / name for c in CONTROLLERS]
        return [ROOT / _own_path("").lstrip("/") / name]

    @classmethod
    def create(cls, name: str, *, memory_mb: int, pids: int, cpus: float) -> SandboxCgroup:
        group = cls(name=name, dirs=cls.paths(name), v1=_is_v1())
        try:
            if not group.v1:  # the parent hands its controllers down (a delegated group allows it)
                subtree = group.dirs[0].parent / "cgroup.subtree_control"
                wanted = [c for c in V2_CONTROLLERS if c not in subtree.read_text().split()]
                if wanted:
                    subtree.write_text(" ".join(f"+{c}" for c in wanted))
            for d in group.dirs:
                d.mkdir(exist_ok=True)
            group._set_limits(memory_mb, pids, cpus)
        except OSError as exc:
            group.remove()
            raise SandboxError(f"cannot create cgroup {name}: {exc}", cause="cgroup") from exc
        return group

    def _set_limits(self, memory_mb: int, pids: int, cpus: float) -> None:
        mem = str(memory_mb * 1024 * 1024)
        quota = str(int(cpus * 100_000))
        if self.v1:
            memory, pid_dir, cpu, _ = self.dirs
            (memory / "memory.limit_in_bytes").write_text(mem)
            swap = memory / "memory.memsw.limit_in_bytes"
            if swap.exists():  # absent when swap accounting is off; then there is no swap to escape to
                swap.write_text(mem)
            (pid_dir / "pids.max").write_text(str(pids))
            (cpu / "cpu.cfs_period_us").write_text("100000")
            (cpu / "cpu.cfs_quota_us").write_text(quota)
        else:
            (group,) = self.dirs
            (group / "memory.max").write_text(mem)
            (group / "memory.swap.max").write_text("0")
            (group / "pids.max").write_text(str(pids))
            (group / "cpu.max").write_text(f"{quota} 100000")

    def enter_prefix(self) -> list[str]:
        """Argv prefix that moves the shell into this group, then execs the rest of the command.

        The move happens before the sandboxed command exists, so nothing it forks escapes.
        """
        procs = " ".join(f"echo $$ > {d}/cgroup.procs &&" for d in self.dirs)
        return ["/bin/sh", "-c", f'{procs} exec "$@"', "cgroup-enter"]

    def cpu_s(self) -> float:
        """CPU seconds used so far by every process that ran in this group (user and system, children included)."""
        if self.v1:
            return int((self.dirs[3] / "cpuacct.usage").read_text()) / 1e9
        fields = dict(line.split() for line in (self.dirs[0] / "cpu.stat").read_text().splitlines())
        return int(fields["usage_usec"]) / 1e6

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in this group so far."""
        name = "memory.oom_control" if self.v1 else "memory.events"
        try:
            fields = dict(line.split() for line in (self.dirs[0] / name).read_text().splitlines())
        except OSError:
            return 0
        return int(fields.get("oom_kill", "0"))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except OSError:
                continue
        return sorted(found)

    def kill_all(self) -> None:
        pids = self.pids()
        if self.killer is not None and pids:
            self.killer(pids)
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or another uid's: removal waits
                os.kill(pid, signal.SIGKILL)

    def holders(self) -> str:
        """The processes still in the group, with their state (``D``: uninterruptible, in the kernel)."""
        described = []
        for pid in self.pids():
            try:
                comm, rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
                described.append(f"{pid} {comm.split('(', 1)[1]} {rest.split()[0]}")
            except (OSError, IndexError):
                described.append(f"{pid} (gone)")
        return ", ".join(described) or "none"

    def remove(self, wait_s: float | None = None) -> list[Path]:
        """Kill what is left inside and delete the group directories; return those still there.

        A killed process leaves its groups only once it has fully exited, which on a loaded
        machine takes a while: poll (up to ``wait_s``, by default ``REMOVE_WAIT_S``) rather than give up after a few
        tries, which left empty groups behind by the hundred. A directory returned is held by a
        process that has not finished exiting: the caller must not forget it (``remove_later``).
        """
        self.kill_all()
        deadline = time.monotonic() + (REMOVE_WAIT_S if wait_s is None else wait_s)
        left = []
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        left.append(d)
                        break
                    self.kill_all()
                    time.sleep(0.005)  # poll interval while the killed processes exit
        return left


def remove_later(group: SandboxCgroup, then: Callable[[], None]) -> None:
    """Keep removing ``group`` in a background thread (once a second, up to ``LATER_WAIT_S``); call ``then`` once
    it is gone. A daemon thread: if this process ends first, the caller's record of the group remains."""

    def retry() -> None:
        deadline = time.monotonic() + LATER_WAIT_S
        while group.dirs and time.monotonic() < deadline:
            time.sleep(1.0)
            group.dirs = group.remove(wait_s=0)
        if group.dirs:
            log.warning("cgroup %s still held after %.0f s (%s): left to `trialforge reap`",
                        group.name, LATER_WAIT_S, group.holders())  # fmt: skip
        else:
            then()

    threading.Thread(target=retry, name=f"remove-{group.name}", daemon=True).start()
