"""The bubblewrap backend: an image's unpacked rootfs, read-only; tmpfs of the disk quota the only writable places.

Each command is its own ``bwrap`` process, confined as ``confinement.py`` lists, started inside the sandbox's
cgroup. Snapshots are plain copies of ``/work`` (milliseconds for task-sized trees), bounded by the quota as they
are read (``hostcopy``) and sanitized (``sanitize``). Without a cgroup (root's, or one delegated to a normal user)
the backend refuses to start unless ``allow_unlimited`` accepts per-process rlimits. Why and how:
docs/security.md, "The bwrap backend".
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from trialforge.errors import SandboxError
from trialforge.sandbox import disk, hostcopy, seccomp
from trialforge.sandbox.base import SANDBOX_ENV, WORKDIR, ExecResult, Limits, SandboxSpec
from trialforge.sandbox.bwrap import cgroups, confinement, mounts, nsholder, usernet
from trialforge.sandbox.bwrap.nsholder import INNER_ID, Holder
from trialforge.sandbox.host import idleases
from trialforge.sandbox.host.identity import SANDBOX_UID, sandbox_identity
from trialforge.sandbox.host.reaper import SandboxRecord
from trialforge.sandbox.host.statedir import private_dir, state_root
from trialforge.sandbox.hostcopy import Budget, CopyLimits
from trialforge.sandbox.images import Image, find_image
from trialforge.sandbox.proc import ProcResult, run_capped

LAUNCH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # to find the launchers; ``env -i`` clears it before bwrap
UNPRIVILEGED_TOOLS = {"unshare": "util-linux", "nsenter": "util-linux", "newuidmap": "uidmap", "newgidmap": "uidmap"}
# A networked command whose bwrap died before releasing it (usernet's loopback race) is launched this often.
NETWORK_LAUNCHES = 3
log = logging.getLogger(__name__)
__all__ = ["SANDBOX_ENV", "BwrapBackend", "BwrapSandbox", "BwrapSnapshot"]


@dataclass(frozen=True)
class BwrapSnapshot:
    id: str
    path: Path


class BwrapBackend:
    """Creates bubblewrap sandboxes over ``image`` or any other built image a spec names."""

    name = "bwrap"

    def __init__(self, image: Image, *, state_dir: Path | None = None, allow_unlimited: bool = False) -> None:
        """``allow_unlimited``: where no cgroup can be had (a normal user without a delegated one), run sandboxes
        under per-process rlimits instead of refusing (``sandbox.allow_unlimited`` in params.yaml)."""
        if shutil.which("bwrap") is None:
            raise SandboxError("bubblewrap is not installed: apt-get install bubblewrap", cause="missing_bwrap")
        self.image = image
        self._images: dict[str, Image] = {image.name: image}
        self._images_lock = threading.Lock()
        self.privileged = os.geteuid() == 0
        # Root: the account whose group traverses the state dir and whose subordinate ids sandboxes get. A normal
        # user: its own subordinate ids, each sandbox in a namespace of its own (``nsholder``).
        self.account = sandbox_identity()
        if not self.privileged:
            lacking = [f"{tool} ({pkg})" for tool, pkg in UNPRIVILEGED_TOOLS.items() if shutil.which(tool) is None]
            if lacking:
                raise SandboxError(f"bwrap sandboxes of a normal user need {', '.join(lacking)}", cause="start")
        me = self.account.name if self.account else idleases.user_name(os.getuid())
        self.ids = idleases.IdRange.of(me, self.account.uid if self.account else os.getuid())
        self.state_dir = private_dir(state_dir or state_root())
        private_dir(self.state_dir / "sandboxes")
        self.snapshot_dir = private_dir(self.state_dir / "snapshots") / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        missing = cgroups.missing()
        if missing and not allow_unlimited:
            raise SandboxError(
                "sandboxes cannot be given memory, CPU and process limits: no cgroup of this process can take child "
                f"groups ({'; '.join(missing)}). Run as root, or in a cgroup delegated to this user (a systemd user "
                "slice, or a subtree chowned to it), or set sandbox.allow_unlimited: true (params.yaml) to accept "
                "per-process rlimits instead",
                cause="cgroup",
            )
        self.use_cgroups = not missing

    def image_for(self, name: str) -> Image:
        """The image a sandbox spec names ("": the backend's own)."""
        key = name or self.image.name
        with self._images_lock:
            if key not in self._images:
                self._images[key] = find_image(key)
            return self._images[key]

    def create(self, spec: SandboxSpec) -> BwrapSandbox:
        return BwrapSandbox(self, spec)

    def from_snapshot(self, snap: BwrapSnapshot, spec: SandboxSpec) -> BwrapSandbox:
        """A new sandbox whose workspace starts as ``snap`` (the fork of a rollout group)."""
        return BwrapSandbox(self, replace(spec, workspace=snap.path))

    def release(self, snap: BwrapSnapshot) -> None:
        shutil.rmtree(snap.path, ignore_errors=True)

    def close(self) -> None:
        """Drop every snapshot this backend made."""
        shutil.rmtree(self.snapshot_dir, ignore_errors=True)


class BwrapSandbox:
    backend = "bwrap"

    def __init__(self, owner: BwrapBackend, spec: SandboxSpec) -> None:
        self.owner = owner
        self.limits: Limits = spec.limits
        self.id = f"tf-{uuid.uuid4().hex[:12]}"
        self.image = owner.image_for(spec.image)
        self.image_digest = self.image.digest
        self.home = owner.state_dir / "sandboxes" / self.id
        # Where its places are, as its commands' launch and the host-side copies see them: mounted under its home
        # as root, at the holder's ``ROOT`` inside the holder's namespace as a normal user.
        self.root = self.home if owner.privileged else nsholder.ROOT
        self.workspace = self.root / "work"
        self.places = (disk.workspace(self.limits), *disk.scratch(self.limits))
        self.copy_limits = CopyLimits.of(self.limits)
        self.cgroup: cgroups.SandboxCgroup | None = None
        self.lease: idleases.Lease | None = None
        self.holder: Holder | None = None  # a normal user's: the namespace that holds the sandbox's ids and mounts
        self.closed = False
        self.mounted: list[Path] = []
        self.deadline = spec.deadline()
        self.record = SandboxRecord.for_current_process(
            self.id, backend="bwrap", labels=spec.labels, deadline=self.deadline
        )
        try:
            self._setup(spec)
        except Exception:
            self.close()
            raise

    # --- lifecycle -------------------------------------------------------------------
    def _setup(self, spec: SandboxSpec) -> None:
        if self.limits.network:
            usernet.check_available()
        private_dir(self.home)
        if self.owner.privileged:
            for name in (*(p.name for p in self.places), disk.PTS):
                (self.home / name).mkdir(mode=0o700)
        self.lease = idleases.lease(self.owner.ids, self.home)  # valid while the home exists: given back with it
        if self.owner.privileged:
            # Named ahead: an owner killed while mounting leaves a record that names every mount.
            self.record.mounts = [str(self.home / name) for name in (*(p.name for p in self.places), disk.PTS)]
        if self.owner.use_cgroups:
            # Written ahead: an owner killed while the groups are being made leaves a record that names them all.
            self.record.cgroups = [str(d) for d in cgroups.SandboxCgroup.paths(self.id)]
        self.record.save(self.home)
        if self.owner.privileged:
            for place in self.places:
                owned = f"{place.tmpfs_options()},uid={self.lease.uid},gid={self.lease.gid}"
                mounts.mount_tmpfs(self.home / place.name, owned, source=f"trialforge-{self.id}")
                self.mounted.append(self.home / place.name)
            mounts.mount_devpts(self.home / disk.PTS, disk.PTS_OPTIONS, source=f"trialforge-{self.id}")
            self.mounted.append(self.home / disk.PTS)
        else:
            self.holder = Holder(self.image.rootfs, self.places, self.lease.uid, self.lease.gid)
        if self.owner.use_cgroups:
            self.cgroup = cgroups.SandboxCgroup.create(
                self.id, memory_mb=self.limits.memory_mb, pids=self.limits.pids, cpus=self.limits.cpus
            )
            if self.holder is not None:  # its processes are another uid's: only the namespace's root may kill them
                self.cgroup.signal = self._kill_pids
        if spec.workspace is not None:
            self._fill(spec.workspace, "the seeding")

    @property
    def file_owner(self) -> tuple[int, int]:
        """(uid, gid) the sandbox's files belong to, as the host-side copies see them (inside the holder: 1)."""
        assert self.lease is not None
        return (INNER_ID, INNER_ID) if self.holder is not None else (self.lease.uid, self.lease.gid)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        left = self.cgroup.remove() if self.cgroup is not None else []
        for target in self.mounted:
            mounts.unmount(target)
        if self.holder is not None:
            self.holder.close()  # its namespace goes, and with it every mount and byte of the sandbox
        if left:
            self._hand_over(left)
        else:
            shutil.rmtree(self.home, ignore_errors=True)
            if self.lease is not None:
                self.lease.release()

    def _hand_over(self, left: list[Path]) -> None:
        """Groups that a killed process had not yet left are never forgotten: the record keeps naming them, due
        now, so that `trialforge reap` removes them if this process cannot; meanwhile it retries in the background."""
        assert self.cgroup is not None
        log.warning("sandbox %s: cgroups %s still held %.0f s after SIGKILL (%s): removing them in the background",
                    self.id, [str(d) for d in left], cgroups.REMOVE_WAIT_S, self.cgroup.holders())  # fmt: skip
        self.record.cgroups, self.record.mounts, self.record.deadline = [str(d) for d in left], [], time.time()
        self.record.save(self.home)
        if self.owner.privileged:
            for name in (*(p.name for p in self.places), disk.PTS):
                shutil.rmtree(self.home / name, ignore_errors=True)
        home, lease = self.home, self.lease

        def gone() -> None:
            shutil.rmtree(home, ignore_errors=True)
            if lease is not None:
                lease.release()

        cgroups.remove_later(replace(self.cgroup, dirs=left), then=gone)

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_alive(self) -> None:
        if not self.alive():
            raise SandboxError(f"sandbox {self.id} is closed or lost its workspace", cause="died")

    def alive(self) -> bool:
        return (
            not self.closed
            and (self.holder.alive() if self.holder is not None else self.workspace.is_dir())
            and (self.cgroup is None or self.cgroup.dirs[0].is_dir())
        )

    def cpu_s(self) -> float | None:
        """The sandbox cgroup's CPU counter; None without a cgroup (unprivileged: rlimits bound, nothing counts)."""
        if self.cgroup is None:
            return None
        try:
            return self.cgroup.cpu_s()
        except (OSError, KeyError, ValueError):
            return None

    # --- commands --------------------------------------------------------------------
    def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str = WORKDIR,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed", cause="closed")
        if not self.alive():
            raise SandboxError(f"sandbox {self.id} lost its workspace", cause="died")
        limit = timeout if timeout is not None else self.limits.exec_timeout_s
        oom_before = self.cgroup.oom_kills() if self.cgroup else 0
        result, ran = self._launch(argv, limit, cwd, env)
        for _ in range(NETWORK_LAUNCHES - 1 if self.limits.network else 0):
            if ran or result.returncode == 0:
                break
            log.warning("sandbox %s: bwrap died setting up the network, before the command: started again (%s)",
                        self.id, result.stderr.strip()[:200])  # fmt: skip
            result, ran = self._launch(argv, limit, cwd, env)
        if result.timed_out and self.cgroup is not None:
            self.cgroup.kill_all()  # anything that escaped the bwrap process dies with its sandbox
        oom = self.cgroup is not None and self.cgroup.oom_kills() > oom_before
        if result.returncode == 1 and not ran:
            raise SandboxError(f"bubblewrap failed to start in {self.id}: {result.stderr.strip()}", cause="start")
        return ExecResult(
            exit_code=137 if result.timed_out else result.returncode,
            stdout=result.stdout,
            stderr=result.stderr,
            duration_s=result.duration_s,
            timed_out=result.timed_out,
            oom=oom,
            truncated=result.truncated,
        )

    def _launch(
        self, argv: Sequence[str], limit: float, cwd: str, env: dict[str, str] | None
    ) -> tuple[ProcResult, bool]:
        """One bwrap process running ``argv``, and whether the command itself ran (False: bwrap failed first).

        A networked command knows it (``UserNet.command_started``); otherwise bwrap's own failures are told
        by the prefix of their message.
        """
        filter_fd = seccomp.filter_fd()
        net = self._network()
        try:
            result = run_capped(
                [*self._limit_prefix(), *self._bwrap_args(cwd, env or {}, filter_fd, net), "--", *argv],
                timeout=limit,
                cap=self.limits.output_cap_bytes,
                env=LAUNCH_ENV,
                pass_fds=(filter_fd, *(net.child_fds if net else ())),
                started=net.attach if net else None,
                kill=self._kill_launch if self.holder is not None else None,
            )
            return result, net.command_started() if net is not None else not result.stderr.startswith("bwrap:")
        finally:
            os.close(filter_fd)
            if net is not None:
                net.close()

    def _network(self) -> usernet.UserNet | None:
        """The command's own user-mode network (in the sandbox's cgroup, as the sandbox's uid), or None: only ``lo``."""
        if not self.limits.network:
            return None
        assert self.lease is not None
        return usernet.UserNet(
            self.home / "slirp4netns.log", prefix=[*self._limit_prefix(), *confinement.identity(*self._identity())]
        )

    def _limit_prefix(self) -> list[str]:
        """The cgroup (else, where that was accepted, rlimits), then an empty environment: nothing of the host's,
        not even the launching shell's ``PWD``, reaches bwrap, whose own pid 1 keeps the environment it starts with.
        """
        if self.cgroup is not None:
            return [*self.cgroup.enter_prefix(), confinement.tool("env"), "-i"]
        lim = self.limits  # accepted by sandbox.allow_unlimited: per-process rlimits (weaker than a cgroup)
        return [
            confinement.tool("env"), "-i",
            confinement.tool("prlimit"), f"--as={lim.memory_mb * 1024 * 1024}", f"--nproc={lim.pids}",
            f"--fsize={disk.workspace(lim).size_bytes}",
            "--",
        ]  # fmt: skip

    def _kill_pids(self, pids: list[int]) -> None:
        """Kill the sandbox's processes from inside its holder's namespace (a normal user cannot signal another uid)."""
        assert self.holder is not None
        if self.holder.alive():
            self.holder.run(_kill, pids)

    def _kill_launch(self, proc: subprocess.Popen) -> None:
        """A normal user's timed-out launch: bwrap runs as the sandbox's uid, so it is killed from the holder too."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._kill_pids([proc.pid, *(self.cgroup.pids() if self.cgroup is not None else ())])

    def _identity(self) -> tuple[int, int, int | None]:
        """(uid, gid, group) the sandbox runs as: its leased ids, and the group that traverses the state dir to its
        places as root (inside a holder's namespace they are in the open, under ``nsholder.ROOT``: no group)."""
        assert self.lease is not None
        if self.holder is not None:
            return INNER_ID, INNER_ID, None
        assert self.owner.account is not None
        return self.lease.uid, self.lease.gid, self.owner.account.gid

    def _bwrap_args(self, cwd: str, env: dict[str, str], filter_fd: int, net: usernet.UserNet | None) -> list[str]:
        """The confinement steps of ``confinement.py``, in the order they apply."""
        return [
            *(self.holder.prefix() if self.holder is not None else ()),
            *confinement.identity(*self._identity()),
            confinement.tool("bwrap"),
            *confinement.namespaces(uid=SANDBOX_UID),
            *confinement.filesystem(
                self.image.rootfs if self.holder is None else nsholder.ROOT / "rootfs",
                {p.path: self.root / p.name for p in self.places},
                pts=self.root / disk.PTS,
            ),
            *(net.bwrap_args() if net else ()),  # after the root: it binds /etc/resolv.conf over the image's
            *confinement.seccomp(filter_fd),
            *confinement.environment({**SANDBOX_ENV, **env}, cwd=cwd),
        ]

    # --- files -----------------------------------------------------------------------
    # Every host-side file operation runs where the sandbox's mounts are (``_in_place``): here as root, in a forked
    # child inside the holder's namespaces as a normal user. Host directories are opened first and passed as fds.
    def _in_place(self, fn: Callable[..., T], *args: Any) -> T:
        self._require_alive()
        return self.holder.run(fn, *args) if self.holder is not None else fn(*args)

    def read_file(self, path: str) -> bytes:
        rel = _relative(path)
        cap = self.copy_limits.bytes
        return self._in_place(_read, self.workspace, rel, path, cap)

    def write_file(self, path: str, data: bytes) -> None:
        Budget(self.copy_limits, f"writing {path!r} into {self.id}").take_bytes(len(data), path)
        self._in_place(_write, self.workspace, _relative(path), path, bytes(data), self.file_owner)

    def export_workspace(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        self._copy_out(dest, f"the export of {self.id}")

    def _copy_out(self, dest: Path, what: str) -> None:
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            self._in_place(_copy_from, self.workspace, fd, Budget(self.copy_limits, what))
        finally:
            os.close(fd)

    def _fill(self, src: Path, what: str) -> None:
        """Copy the host tree ``src`` into /work (emptied first by the caller), within the workspace's quota."""
        fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            budget = Budget(self.copy_limits, f"{what} of {self.id}")
            self._in_place(_copy_into, fd, self.workspace, budget, self.file_owner)
        finally:
            os.close(fd)

    # --- snapshots ---------------------------------------------------------------------
    def snapshot(self) -> BwrapSnapshot:
        self._require_alive()
        snap_id = uuid.uuid4().hex[:12]
        path = self.owner.snapshot_dir / snap_id
        self.owner.snapshot_dir.mkdir(mode=0o700, exist_ok=True)  # its parent is private_dir's
        path.mkdir(mode=0o700)
        try:
            self._copy_out(path, f"the snapshot of {self.id}")
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)  # never half a snapshot
            raise
        return BwrapSnapshot(id=snap_id, path=path)

    def restore(self, snap: BwrapSnapshot) -> None:
        if not snap.path.is_dir():
            raise SandboxError(f"snapshot {snap.id} is gone", cause="snapshot")
        self.reset(snap.path)

    def reset(self, workspace: Path | None) -> None:
        """/work becomes ``workspace`` (empty when None) and the scratch places empty: nothing of the last holder's."""
        self._in_place(_empty, [self.root / p.name for p in self.places])
        if workspace is not None:
            self._fill(workspace, "the restore")


T = TypeVar("T")


def _relative(path: str) -> str:
    """``path`` relative to /work, lexically; refuses what leaves it."""
    rel = os.path.relpath(os.path.join(WORKDIR, path), WORKDIR)
    if rel == ".." or rel.startswith("../"):
        raise SandboxError(f"path {path!r} is outside {WORKDIR}", cause="path")
    return rel


def _resolved(work: Path, rel: str, path: str) -> Path:
    """The real path of ``rel`` under ``work``, refused when it resolves outside it (through a link the agent made)."""
    real = Path(os.path.realpath(work / rel))
    if real != work and work not in real.parents:
        raise SandboxError(f"path {path!r} resolves outside {WORKDIR}", cause="path")
    return real


# What ``_in_place`` runs: plain functions of paths as the sandbox's mounts show them, and of fds.
def _read(work: Path, rel: str, path: str, cap: int) -> bytes:
    real = _resolved(work, rel, path)
    try:
        parent = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise FileNotFoundError(f"{path}: {exc.strerror}") from exc
    try:
        return hostcopy.read_bounded(parent, real.name, cap, f"{path!r}")
    except OSError as exc:
        raise FileNotFoundError(f"{path}: {exc.strerror or exc}") from exc
    finally:
        os.close(parent)


def _write(work: Path, rel: str, path: str, data: bytes, owner: tuple[int, int]) -> None:
    host = _resolved(work, rel, path) if os.path.lexists(work / rel) else work / rel
    _resolved(work, os.path.relpath(host.parent, work), path)  # its folder, made or not, stays inside too
    made = [p for p in reversed(host.parents) if work in p.parents and not p.exists()]
    try:
        host.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except OSError as exc:
        if exc.errno in hostcopy.NO_ROOM:
            raise SandboxError(f"cannot write {path!r}: {exc.strerror} (the workspace's share of sandbox.disk_mb)",
                               cause="quota") from exc  # fmt: skip
        raise
    for created in [*made, host]:  # the agent must own what we put in its workspace
        os.lchown(created, *owner)


def _copy_from(work: Path, dest: int, budget: Budget) -> list[str]:
    src = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return hostcopy.copy_tree(src, dest, budget)
    finally:
        os.close(src)


def _copy_into(src: int, work: Path, budget: Budget, owner: tuple[int, int]) -> list[str]:
    dest = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return hostcopy.copy_tree(src, dest, budget, owner=owner)
    finally:
        os.close(dest)


def _empty(folders: list[Path]) -> None:
    """Remove everything in each folder (never following a link out), keeping the folders (mount points)."""
    for folder in folders:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for name in os.listdir(fd):
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
