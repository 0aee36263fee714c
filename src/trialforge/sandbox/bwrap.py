"""The bubblewrap backend: an image's unpacked rootfs, read-only, with the workspace as the only writable tree.

Each command is its own ``bwrap`` process, confined as ``confinement.py`` lists (as root:
the dedicated sandbox account, never host root; fresh namespaces, no network, no
capabilities, no nested user namespaces, masked /proc, the seccomp filter), started inside
the sandbox's cgroup. The workspace lives on the host: as root it is a size-limited tmpfs
(the disk quota) owned by the sandbox account; snapshots are plain copies of it, which for
task-sized trees cost milliseconds, and every copy out of it goes through ``sanitize``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from trialforge.errors import SandboxError
from trialforge.sandbox import cgroups, confinement, seccomp, usernet
from trialforge.sandbox.base import SANDBOX_ENV, WORKDIR, ExecResult, Limits, SandboxSpec
from trialforge.sandbox.identity import SANDBOX_UID, sandbox_identity
from trialforge.sandbox.images import Image, find_image
from trialforge.sandbox.proc import ProcResult, run_capped
from trialforge.sandbox.reaper import SandboxRecord
from trialforge.sandbox.sanitize import copy_out
from trialforge.sandbox.statedir import private_dir, state_root

LAUNCH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
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

    def __init__(self, image: Image, *, state_dir: Path | None = None) -> None:
        if shutil.which("bwrap") is None:
            raise SandboxError("bubblewrap is not installed: apt-get install bubblewrap", cause="missing_bwrap")
        self.image = image
        self._images: dict[str, Image] = {image.name: image}
        self._images_lock = threading.Lock()
        self.identity = sandbox_identity()  # None when not root: nothing to drop
        self.state_dir = private_dir(state_dir or state_root())
        private_dir(self.state_dir / "sandboxes")
        self.snapshot_dir = private_dir(self.state_dir / "snapshots") / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.use_cgroups = cgroups.available()
        self.use_tmpfs = os.geteuid() == 0

    @property
    def owner_ids(self) -> tuple[int, int] | None:
        """(uid, gid) of the host account that owns workspaces; None: whoever we are."""
        return (self.identity.uid, self.identity.gid) if self.identity else None

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
        self.workspace = self.home / "work"
        self.cgroup: cgroups.SandboxCgroup | None = None
        self.closed = False
        self.mounted = False
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
        self.workspace.mkdir(mode=0o700)
        self.record.save(self.home)
        ids = self.owner.owner_ids
        if ids is not None:
            os.chown(self.workspace, *ids)
        if self.owner.use_tmpfs:
            owner = f",uid={ids[0]},gid={ids[1]}" if ids else ""
            size = f"size={self.limits.disk_mb}m,mode=0700,nosuid,nodev{owner}"
            _check(
                ["mount", "-t", "tmpfs", "-o", size, f"trialforge-{self.id}", str(self.workspace)], "mount workspace"
            )
            self.mounted = True
            self.record.mounts.append(str(self.workspace))
        if self.owner.use_cgroups:
            # Written ahead: an owner killed while the groups are being made leaves a record that names them all.
            self.record.cgroups = [str(d) for d in cgroups.SandboxCgroup.paths(self.id)]
        self.record.save(self.home)
        if self.owner.use_cgroups:
            self.cgroup = cgroups.SandboxCgroup.create(
                self.id, memory_mb=self.limits.memory_mb, pids=self.limits.pids, cpus=self.limits.cpus
            )
        if spec.workspace is not None:
            copy_out(spec.workspace, self.workspace, owner=ids)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        left = self.cgroup.remove() if self.cgroup is not None else []
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.workspace)], check=False, capture_output=True)
        if left:
            self._hand_over(left)
        else:
            shutil.rmtree(self.home, ignore_errors=True)

    def _hand_over(self, left: list[Path]) -> None:
        """Groups that a killed process had not yet left are never forgotten: the record keeps naming them, due
        now, so that `trialforge reap` removes them if this process cannot; meanwhile it retries in the background."""
        assert self.cgroup is not None
        log.warning("sandbox %s: cgroups %s still held %.0f s after SIGKILL (%s): removing them in the background",
                    self.id, [str(d) for d in left], cgroups.REMOVE_WAIT_S, self.cgroup.holders())  # fmt: skip
        self.record.cgroups, self.record.mounts, self.record.deadline = [str(d) for d in left], [], time.time()
        self.record.save(self.home)
        shutil.rmtree(self.workspace, ignore_errors=True)
        home = self.home
        cgroups.remove_later(replace(self.cgroup, dirs=left), then=lambda: shutil.rmtree(home, ignore_errors=True))

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_alive(self) -> None:
        if not self.alive():
            raise SandboxError(f"sandbox {self.id} is closed or lost its workspace", cause="died")

    def alive(self) -> bool:
        return not self.closed and self.workspace.is_dir() and (self.cgroup is None or self.cgroup.dirs[0].is_dir())

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
        if not self.workspace.is_dir():
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
            self.cgroup.kill_all()  # anything that escaped the process group dies with its sandbox
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
                self._limit_prefix() + self._bwrap_args(cwd, env or {}, filter_fd, net) + ["--", *argv],
                timeout=limit,
                cap=self.limits.output_cap_bytes,
                env=LAUNCH_ENV,  # bwrap's own pid 1 keeps the environment it was started with: give it nothing
                pass_fds=(filter_fd, *(net.child_fds if net else ())),
                started=net.attach if net else None,
            )
            return result, net.command_started() if net is not None else not result.stderr.startswith("bwrap:")
        finally:
            os.close(filter_fd)
            if net is not None:
                net.close()

    def _network(self) -> usernet.UserNet | None:
        """The command's own user-mode network (in the sandbox's cgroup), or None: only ``lo``."""
        if not self.limits.network:
            return None
        return usernet.UserNet(self.home / "slirp4netns.log", prefix=self._limit_prefix())

    def _limit_prefix(self) -> list[str]:
        if self.cgroup is not None:
            return self.cgroup.enter_prefix()
        lim = self.limits  # unprivileged fallback: per-process rlimits (weaker than a cgroup, still bounded)
        return [
            "prlimit",
            f"--as={lim.memory_mb * 1024 * 1024}",
            f"--nproc={lim.pids}",
            f"--fsize={lim.disk_mb * 1024 * 1024}",
            "--",
        ]

    def _bwrap_args(self, cwd: str, env: dict[str, str], filter_fd: int, net: usernet.UserNet | None) -> list[str]:
        """The confinement steps of ``confinement.py``, in the order they apply."""
        return [
            *confinement.identity(self.owner.identity),
            "bwrap",
            *confinement.namespaces(uid=SANDBOX_UID),
            *confinement.filesystem(self.image.rootfs, self.workspace, tmp_bytes=self.limits.disk_mb * 1024 * 1024),
            *(net.bwrap_args() if net else ()),  # after the root: it binds /etc/resolv.conf over the image's
            *confinement.seccomp(filter_fd),
            *confinement.environment({**SANDBOX_ENV, **env}, cwd=cwd),
        ]

    # --- files -----------------------------------------------------------------------
    def _host_path(self, path: str) -> Path:
        """Map a sandbox path under /work to the host, refusing anything that resolves outside it."""
        self._require_alive()
        rel = os.path.relpath(os.path.join(WORKDIR, path), WORKDIR)
        if rel == ".." or rel.startswith("../"):
            raise SandboxError(f"path {path!r} is outside {WORKDIR}", cause="path")
        host = self.workspace / rel
        real = Path(os.path.realpath(host))
        if real != self.workspace and self.workspace not in real.parents:
            raise SandboxError(f"path {path!r} resolves outside {WORKDIR}", cause="path")
        return host

    def read_file(self, path: str) -> bytes:
        host = self._host_path(path)
        try:
            return host.read_bytes()
        except OSError as exc:
            raise FileNotFoundError(f"{path}: {exc.strerror}") from exc

    def write_file(self, path: str, data: bytes) -> None:
        host = self._host_path(path)
        made = [p for p in reversed(host.parents) if self.workspace in p.parents and not p.exists()]
        host.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if (ids := self.owner.owner_ids) is not None:  # the agent must own what we put in its workspace
            for created in [*made, host]:
                os.lchown(created, *ids)

    def export_workspace(self, dest: Path) -> None:
        self._require_alive()
        copy_out(self.workspace, dest)

    # --- snapshots ---------------------------------------------------------------------
    def snapshot(self) -> BwrapSnapshot:
        self._require_alive()
        snap_id = uuid.uuid4().hex[:12]
        path = self.owner.snapshot_dir / snap_id
        path.parent.mkdir(mode=0o700, exist_ok=True)
        copy_out(self.workspace, path)
        return BwrapSnapshot(id=snap_id, path=path)

    def restore(self, snap: BwrapSnapshot) -> None:
        if not snap.path.is_dir():
            raise SandboxError(f"snapshot {snap.id} is gone", cause="snapshot")
        self.reset(snap.path)

    def reset(self, workspace: Path | None) -> None:
        self._require_alive()
        for child in self.workspace.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        if workspace is not None:
            copy_out(workspace, self.workspace, owner=self.owner.owner_ids)


def _check(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SandboxError(f"cannot {what}: {done.stderr.strip()}", cause="start")
