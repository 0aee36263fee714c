"""The container-engine backend: one container per sandbox over the Docker Engine API (Docker or Podman).

Everything goes through the ``docker`` SDK and works unchanged against Docker and
Podman's compatible service. Choices, and why:

* **Container.** Created from the engine's copy of the image (imported from the
  image tarball, never pulled), with no network, no capabilities,
  ``no-new-privileges``, uid 1000, a read-only root, an explicit minimal
  environment, memory (+swap), pids and CPU limits, and labels naming the owner
  process and a deadline so a reaper can remove what a crash leaves behind.
  Pid 1 is a tiny ``sh`` loop that idles *and reaps zombies*: orphans of killed
  commands are re-parented to pid 1, and a bare ``sleep infinity`` would leave
  them as zombies that eat the pids limit.
* **Disk quota: a tmpfs.** Overlay has no size limit without XFS project quotas
  (``storage_opt size=`` fails here), so ``/work`` is a ``tmpfs`` of
  ``disk_mb``: writes past it fail with ENOSPC, honestly. It is a *named
  volume* of the ``local`` driver with tmpfs options rather than a
  ``HostConfig.Tmpfs`` mount because Docker's archive API (``get_archive`` /
  ``put_archive``) cannot see a tmpfs mount (it reads the directory underneath),
  while it does resolve volumes; Podman handles both. The size is given as
  ``nr_blocks`` because Podman 4 takes ``size=`` on a volume as a request for
  XFS quotas. ``/tmp`` is a size-limited tmpfs too.
* **Snapshots: a tar of /work kept on the host.** ``commit`` captures the
  writable layer, not a tmpfs; with a read-only root, and no process outliving
  its command, ``/work`` is the only state that carries from one command to the
  next besides scratch tmpfs (``/tmp``...), so a tar of it *is* the sandbox's
  state. It is fetched with ``get_archive``, rewritten relative to ``/work``
  (without any ``.git``), and stored under the state directory like the bwrap
  backend's snapshots (so ``reaper.reap`` drops those of dead owners). Restore
  kills the sandbox's processes, empties ``/work`` and ``/tmp`` and puts the tar
  back: one exec and one ``put_archive``, with no image layers to create or
  garbage-collect. ``reset`` (a pool's reuse) is the same clean slate, seeded
  from a host directory. ``from_snapshot`` starts a new container seeded from
  the tar (the group fork). We trade the image-based snapshot (share-able through the
  engine, but slower and unbounded by any quota) for a quota that holds.
* **Exec.** docker-py's timeout does not bound an exec, so every command runs
  under ``timeout -s KILL`` inside the sandbox, wrapped by a fixed ``sh`` script
  that, when the command ends, kills every process but pid 1: as with bwrap
  (whose pid namespace dies with each command), nothing a command starts
  outlives it, backgrounded, ``setsid``-ed or timed out. A sandbox therefore
  runs one command at a time. The host enforces a second deadline (limit +
  grace) and then kills every process from another exec. Output is read frame
  by frame from the exec socket into bounded head/tail buffers. OOM is read
  from the container's memory cgroup (``oom_kill``) after a SIGKILL exit.
* **Files.** Paths are confined to ``/work`` lexically, and then *inside the
  sandbox*: the engine's archive API follows symlinks as root, so the path is
  resolved by ``realpath`` running as the sandbox user. Reads run ``cat`` as
  that user; writes create the parents as that user and put the file with
  ``put_archive``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import posixpath
import select
import socket as pysocket
import struct
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import Mount

from trialforge.errors import SandboxError
from trialforge.sandbox.base import SANDBOX_ENV, WORKDIR, ExecResult, Limits, SandboxSpec
from trialforge.sandbox.images import Image
from trialforge.sandbox.proc import _Capture
from trialforge.sandbox.reaper import SandboxRecord
from trialforge.sandbox.sanitize import tar_member
from trialforge.sandbox.seccomp import oci_profile
from trialforge.sandbox.statedir import private_dir, state_root

log = logging.getLogger(__name__)

LABEL_OWNER = "trialforge.owner"  # "<hostname>:<pid>:<process start time>"
LABEL_DEADLINE = "trialforge.deadline"  # epoch seconds
LABEL_SANDBOX = "trialforge.sandbox"
LABEL_DIGEST = "trialforge.digest"  # on imported images: the tarball's content digest
SANDBOX_UID = 1000
HOST_GRACE_S = 5.0  # the host's deadline trails the in-sandbox one by this much
DRAIN_S = 5.0  # after the host's deadline, how long to wait for the killed command's last output
HELPER_TIMEOUT_S = 30.0

# Pid 1: idle, and reap every orphan (``wait`` reaps any child, adopted ones included).
IDLE_INIT = ["/bin/sh", "-c", "while :; do sleep infinity & wait; done"]

# $1: seconds; the rest: the command. Runs the command under ``timeout`` (which kills its process
# group at the limit), then kills every process but pid 1 and itself: nothing a command starts
# outlives it (as in bwrap, where the command's pid namespace dies with it), whether it was
# backgrounded, ``setsid``-ed or left behind by a timeout. The shell's own stderr goes to /dev/null
# (dash would add "Killed" to the command's); the command gets the real one through fd 3. If the
# command cannot even be forked, the EXIT trap says so.
EXEC_WRAPPER = """
t=$1; shift
exec 3>&2 2>/dev/null
trap 'echo "trialforge: cannot start the command: no process slot left" >&3' EXIT
(exec timeout -s KILL "$t" "$@" 2>&3 3>&-)
rc=$?
trap - EXIT
kill -9 -1
exit "$rc"
"""

# Resolve $1 as the sandbox user; refuse anything outside /work (existing or not); print the file.
READ_SCRIPT = """
p=$(realpath -m -- "$1") || exit 2
case "$p" in /work|/work/*) ;; *) printf '%s' "$p" >&2; exit 3 ;; esac
exec cat -- "$p"
"""

# Resolve $1 as the sandbox user; refuse anything outside /work; create its parents;
# print the resolved path and, when the file exists, its mode (NUL-separated).
WRITE_SCRIPT = """
p=$(realpath -m -- "$1") || exit 2
case "$p" in /work|/work/*) ;; *) printf '%s' "$p" >&2; exit 3 ;; esac
[ -d "$p" ] && { printf 'Is a directory' >&2; exit 5; }
mkdir -p -- "${p%/*}" || exit 4
printf '%s\\0' "$p"
stat -c %a -- "$p" 2>/dev/null || true
"""

# Back to a clean slate before a restore or reuse: no processes, empty /work and scratch space.
RESET_SCRIPT = """
kill -9 -1 2>/dev/null
for d in /var/tmp /dev/shm; do [ -d "$d" ] && find "$d" -mindepth 1 -delete 2>/dev/null; done
chmod -R u+rwX /work /tmp 2>/dev/null
find /work /tmp -mindepth 1 -delete
"""

OOM_SCRIPT = "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null; true"

_ENGINE_DOWN = (requests.exceptions.RequestException, docker.errors.DockerException, OSError)


def owner_label() -> str:
    """Who owns what we create: host, pid and the pid's start time (so pid reuse does not fool the reaper)."""
    me = SandboxRecord.for_current_process("", backend="docker", labels={}, deadline=0)
    return f"{pysocket.gethostname()}:{me.owner_pid}:{me.owner_start}"


@dataclass(frozen=True)
class DockerSnapshot:
    """A sandbox's /work as a tar (members relative to /work) on the host."""

    id: str
    path: Path
    image_digest: str


@dataclass
class _Run:
    """What one exec produced, before it is interpreted as an observation."""

    exit_code: int
    stdout: _Capture
    stderr: _Capture
    duration_s: float
    deadline_hit: bool

    def out_bytes(self) -> bytes:
        return bytes(self.stdout.head + self.stdout.tail)

    def err_text(self) -> str:
        return bytes(self.stderr.head + self.stderr.tail).decode("utf-8", errors="replace").strip()


class DockerBackend:
    """Creates container sandboxes over one image, through the engine ``client`` talks to."""

    name = "docker"

    def __init__(self, client: docker.DockerClient, image: Image, *, state_dir: Path | None = None) -> None:
        self.client = client
        self.api: docker.APIClient = client.api
        self.image = image
        self.state_dir = state_dir or state_root()
        self.snapshot_dir = self.state_dir / "snapshots" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._image_id: str | None = None
        self._seccomp: str | None = None
        self._image_lock = threading.Lock()

    # --- image -------------------------------------------------------------------------
    def ensure_image(self) -> str:
        """The engine's id of our image, importing the tarball first when it is absent or stale.

        An image is stale when its ``trialforge.digest`` label is not the tarball's
        digest (the tarball was rebuilt, or someone imported it by hand): the
        engine's copy must be the content the digest names.
        """
        with self._image_lock:  # a pool creates from several threads: import once
            if self._image_id is None:
                self._image_id = self._current_image_id()
            return self._image_id

    def _current_image_id(self) -> str:
        attrs = self._inspect_image()
        labels = ((attrs or {}).get("Config") or {}).get("Labels") or {}
        if attrs is not None and labels.get(LABEL_DIGEST) == self.image.digest:
            return str(attrs["Id"])
        log.info("importing image", extra={"image": self.image.name, "tarball": str(self.image.tarball)})
        self._import_image()
        fresh = self._inspect_image()
        if fresh is None:
            raise SandboxError(f"image {self.image.name} is missing right after its import", cause="image")
        if attrs is not None and attrs["Id"] != fresh["Id"]:
            with contextlib.suppress(*_ENGINE_DOWN):  # still used by a container: it stays, untagged
                self.api.remove_image(attrs["Id"])
        return str(fresh["Id"])

    def _inspect_image(self) -> dict[str, Any] | None:
        try:
            return self.api.inspect_image(self.image.name)
        except docker.errors.ImageNotFound:
            return None
        except _ENGINE_DOWN as exc:
            raise SandboxError(f"cannot inspect image {self.image.name}: {exc}", cause="engine") from exc

    def _import_image(self) -> None:
        """``docker import`` through the API (``images.load`` wants an image archive, not a rootfs)."""
        if not self.image.tarball.is_file():
            raise SandboxError(f"image tarball {self.image.tarball} is missing: rebuild the image", cause="image")
        repo, tag = _split_ref(self.image.name)
        try:
            answer = self.api.import_image(
                src=str(self.image.tarball),
                repository=self.image.name,
                changes=[f"LABEL {LABEL_DIGEST}={self.image.digest}"],
            )
            image_id = _imported_id(answer)
            self.api.tag(image_id, repo, tag)  # Podman ignores the tag in an import's name; Docker honours it
        except _ENGINE_DOWN as exc:
            raise SandboxError(
                f"cannot import {self.image.tarball} as {self.image.name}: {exc}", cause="image"
            ) from exc

    def seccomp_option(self) -> str:
        """Our syscall rules for ``--security-opt seccomp=``: inline JSON for Docker, a file for Podman.

        Docker's API takes the profile's content; Podman's compatible API opens the value as a
        path on the engine's host, so the profile is written (once) into our private state dir.
        """
        with self._image_lock:
            if self._seccomp is None:
                profile = json.dumps(oci_profile(), separators=(",", ":"))
                self._seccomp = profile
                components = self.client.version().get("Components") or []
                if any("podman" in str(c.get("Name", "")).lower() for c in components):
                    path = private_dir(self.state_dir) / "seccomp.json"
                    tmp = path.with_suffix(".part")
                    tmp.write_text(profile)
                    tmp.replace(path)
                    self._seccomp = str(path)
            return self._seccomp

    # --- sandboxes and snapshots -----------------------------------------------------------
    def create(self, spec: SandboxSpec) -> DockerSandbox:
        return DockerSandbox(self, spec)

    def from_snapshot(self, snap: DockerSnapshot, spec: SandboxSpec) -> DockerSandbox:
        """A new sandbox whose workspace starts as ``snap`` (the fork of a rollout group)."""
        if not snap.path.is_file():
            raise SandboxError(f"snapshot {snap.id} is gone", cause="snapshot")
        return DockerSandbox(self, spec, seed_tar=snap.path)

    def release(self, snap: DockerSnapshot) -> None:
        snap.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Drop every snapshot this backend made (its sandboxes are closed by their owners)."""
        for tar in self.snapshot_dir.glob("*.tar"):
            tar.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.snapshot_dir.rmdir()


class DockerSandbox:
    backend = "docker"

    def __init__(self, owner: DockerBackend, spec: SandboxSpec, *, seed_tar: Path | None = None) -> None:
        self.owner = owner
        self.api = owner.api
        self.limits: Limits = spec.limits
        self.id = f"tf-{uuid.uuid4().hex[:12]}"
        self.volume = f"{self.id}-work"
        self.image_digest = owner.ensure_image()
        self.deadline = spec.deadline()
        self.labels = {
            **spec.labels,
            LABEL_OWNER: owner_label(),  # per sandbox: right even in a process forked after the backend was made
            LABEL_DEADLINE: str(int(self.deadline)),
            LABEL_SANDBOX: self.id,
        }
        self.container_id = ""
        self.closed = False
        self._oom_kills = 0
        try:
            self._start()
            self._seed(seed_tar, spec.workspace)
        except BaseException:
            self.close()
            raise

    # --- lifecycle -------------------------------------------------------------------
    def _start(self) -> None:
        lim = self.limits
        pages = max(1, lim.disk_mb * 1024 * 1024 // os.sysconf("SC_PAGE_SIZE"))
        try:
            self.api.create_volume(
                self.volume,
                driver="local",
                driver_opts={
                    "type": "tmpfs",
                    "device": "tmpfs",
                    "o": f"nr_blocks={pages},uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755",
                },
                labels=self.labels,
            )
            host_config = self.api.create_host_config(
                network_mode=None if lim.network else "none",
                mem_limit=f"{lim.memory_mb}m",
                memswap_limit=f"{lim.memory_mb}m",
                pids_limit=lim.pids,
                nano_cpus=int(lim.cpus * 1e9),
                read_only=True,
                tmpfs={"/tmp": f"size={lim.disk_mb}m,mode=1777"},
                mounts=[Mount(target=WORKDIR, source=self.volume, type="volume")],
                cap_drop=["ALL"],
                # our syscall rules (the bwrap backend's, as an OCI profile) in place of the engine's default
                security_opt=["no-new-privileges", f"seccomp={self.owner.seccomp_option()}"],
            )
            created = self.api.create_container(
                self.image_digest,
                command=IDLE_INIT,
                name=self.id,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}",
                environment=SANDBOX_ENV,
                working_dir=WORKDIR,
                hostname="sandbox",
                labels=self.labels,
                host_config=host_config,
            )
            self.container_id = created["Id"]
            self.api.start(self.container_id)
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot start sandbox {self.id}: {exc.explanation or exc}", cause="start") from exc
        except _ENGINE_DOWN as exc:
            raise SandboxError(f"cannot start sandbox {self.id}: engine unreachable: {exc}", cause="engine") from exc

    def _seed(self, seed_tar: Path | None, workspace: Path | None) -> None:
        """Fill /work from a snapshot's tar, or else from a host directory (its ``.git`` left out)."""
        if seed_tar is not None:
            with seed_tar.open("rb") as fh:
                self._put(WORKDIR, fh, "seed the workspace")
        elif workspace is not None:
            with _tar_of_dir(workspace) as fh:
                self._put(WORKDIR, fh, "seed the workspace")

    def close(self) -> None:
        """Remove the container and its workspace volume; idempotent, and quiet if they are already gone."""
        if self.closed:
            return
        self.closed = True
        for remove in (
            lambda: self.api.remove_container(self.id, force=True, v=True),
            lambda: self.api.remove_volume(self.volume, force=True),
        ):
            try:
                remove()
            except docker.errors.NotFound:
                pass
            except _ENGINE_DOWN as exc:  # the reaper removes what we could not
                log.warning("sandbox cleanup failed", extra={"sandbox": self.id, "error": str(exc)})

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- commands --------------------------------------------------------------------
    def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str = WORKDIR,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        limit = max(timeout if timeout is not None else self.limits.exec_timeout_s, 0.001)
        run = self._run(
            ["/bin/sh", "-c", EXEC_WRAPPER, "trialforge-exec", f"{limit:.3f}", *argv],
            limit_s=limit + HOST_GRACE_S,
            cap=self.limits.output_cap_bytes,
            cwd=cwd,
            env=env,
        )
        if _runtime_failed(run):
            raise SandboxError(f"cannot start a command in {self.id} (cwd {cwd!r}): {run.err_text()}", cause="start")
        timed_out = run.deadline_hit or (run.exit_code == 137 and run.duration_s >= limit)
        oom = run.exit_code == 137 and not timed_out and self._oom_since_last()
        out, out_cut = run.stdout.text()
        err, err_cut = run.stderr.text()
        return ExecResult(
            exit_code=137 if timed_out else run.exit_code,
            stdout=out,
            stderr=err,
            duration_s=run.duration_s,
            timed_out=timed_out,
            oom=oom,
            truncated=out_cut or err_cut,
        )

    def _run(
        self, argv: Sequence[str], *, limit_s: float, cap: int, cwd: str = WORKDIR, env: dict[str, str] | None = None
    ) -> _Run:
        """One exec with a host-side deadline; on it, every process in the sandbox is killed."""
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed", cause="closed")
        start = time.monotonic()
        with self._engine_call("exec"):
            exec_id = self.api.exec_create(
                self.container_id, list(argv), stdout=True, stderr=True, environment=env or None, workdir=cwd
            )["Id"]
            sock = self.api.exec_start(exec_id, socket=True)
        out, err = _Capture(cap), _Capture(cap)
        try:
            deadline_hit = _pump_frames(sock, out, err, deadline=start + limit_s, on_deadline=self._kill_all)
        except OSError as exc:
            self._raise_if_dead("exec")
            raise SandboxError(f"lost the output stream of an exec in {self.id}: {exc}", cause="engine") from exc
        finally:
            _close_exec_socket(sock)
        exit_code = 137 if deadline_hit else self._exit_code(exec_id)
        return _Run(exit_code, out, err, time.monotonic() - start, deadline_hit)

    def _exit_code(self, exec_id: str) -> int:
        for _ in range(100):  # the engine may record the exit a moment after the stream ends
            with self._engine_call("exec"):
                info = self.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                if int(info["ExitCode"]) < 0:  # the engine lost the process: most likely the container with it
                    self._raise_if_dead("exec")
                return int(info["ExitCode"])
            time.sleep(0.01)
        self._raise_if_dead("exec")
        raise SandboxError(f"exec {exec_id[:12]} in {self.id} never reported an exit code", cause="engine")

    def _helper(self, script: str, *args: str, cap: int = 1 << 20) -> _Run:
        """Run one of our fixed scripts as the sandbox user, with its own short deadline."""
        return self._run(["/bin/sh", "-c", script, "trialforge", *args], limit_s=HELPER_TIMEOUT_S, cap=cap)

    def _kill_all(self) -> None:
        """Kill every process but pid 1 (the host's deadline passed, or a restore begins)."""
        with contextlib.suppress(SandboxError):
            self._run(["/bin/sh", "-c", "kill -9 -1"], limit_s=HELPER_TIMEOUT_S, cap=4096)

    def _oom_since_last(self) -> bool:
        """Did the kernel OOM-kill anything in this container since we last looked? (cgroup v1 or v2 counter)."""
        text = self._helper(OOM_SCRIPT).out_bytes().decode(errors="replace")
        counts = [int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")]
        if not counts:  # no readable counter: ask the engine, which knows when pid 1 was the victim
            with self._engine_call("inspect"):
                return bool(self.api.inspect_container(self.container_id)["State"].get("OOMKilled"))
        seen, self._oom_kills = self._oom_kills, max(counts)
        return self._oom_kills > seen

    # --- engine errors ---------------------------------------------------------------
    @contextlib.contextmanager
    def _engine_call(self, what: str) -> Iterator[None]:
        """Translate engine failures: a sandbox that vanished or stopped "died"; anything else is the engine's."""
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed", cause="closed")
        try:
            yield
        except docker.errors.NotFound as exc:
            raise SandboxError(f"sandbox {self.id} vanished ({what}): {exc.explanation or exc}", cause="died") from exc
        except docker.errors.APIError as exc:
            self._raise_if_dead(what)
            raise SandboxError(f"engine refused {what} in {self.id}: {exc.explanation or exc}", cause="engine") from exc
        except _ENGINE_DOWN as exc:
            raise SandboxError(f"engine unreachable during {what} in {self.id}: {exc}", cause="engine") from exc

    def _raise_if_dead(self, what: str) -> None:
        try:
            state = self.api.inspect_container(self.container_id)["State"]
        except docker.errors.NotFound as exc:
            raise SandboxError(f"sandbox {self.id} vanished ({what})", cause="died") from exc
        except _ENGINE_DOWN:
            return
        if not state.get("Running"):
            why = "out of memory" if state.get("OOMKilled") else f"exit code {state.get('ExitCode')}"
            raise SandboxError(f"sandbox {self.id} died ({what}): container stopped, {why}", cause="died")

    # --- files -----------------------------------------------------------------------
    def read_file(self, path: str) -> bytes:
        target = _confined(path)
        run = self._helper(READ_SCRIPT, target, cap=2 * self.limits.disk_mb * 1024 * 1024 + 2)
        if run.exit_code == 3:
            raise SandboxError(f"path {path!r} resolves outside {WORKDIR} (to {run.err_text()})", cause="path")
        if run.exit_code != 0:
            raise FileNotFoundError(f"{path}: {run.err_text() or 'cannot read'}")
        return run.out_bytes()

    def write_file(self, path: str, data: bytes) -> None:
        target = _confined(path)
        run = self._helper(WRITE_SCRIPT, target)
        if run.exit_code == 3:
            raise SandboxError(f"path {path!r} resolves outside {WORKDIR} (to {run.err_text()})", cause="path")
        if run.exit_code == 5:
            raise IsADirectoryError(f"{path}: Is a directory")
        if run.exit_code != 0:
            raise SandboxError(f"cannot write {path!r} in {self.id}: {run.err_text()}", cause="path")
        resolved, _, mode = run.out_bytes().partition(b"\0")
        real = resolved.decode()
        info = _file_info(posixpath.basename(real), len(data), int(mode.strip() or b"644", 8))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.addfile(info, io.BytesIO(data))
        buf.seek(0)
        self._put(posixpath.dirname(real), buf, f"write {path!r}")

    def export_workspace(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        with self._workspace_tar() as tar:
            for member in _rebased(tar):
                tar.extract(member, dest, filter=_export_filter)  # sanitize.tar_member, then the stdlib's rule

    def _put(self, directory: str, data: Any, what: str) -> None:
        with self._engine_call(what):
            self.api.put_archive(self.container_id, directory, data)

    @contextlib.contextmanager
    def _workspace_tar(self) -> Iterator[tarfile.TarFile]:
        """/work as a streamed tar (members named ``work/...``)."""
        self._raise_if_dead("archive")  # a stopped container's archive would be an empty, silent lie
        with self._engine_call("archive"):
            chunks, _ = self.api.get_archive(self.container_id, WORKDIR)
            with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks)), mode="r|") as tar:
                yield tar

    # --- snapshots ---------------------------------------------------------------------
    def snapshot(self) -> DockerSnapshot:
        snap_id = uuid.uuid4().hex[:12]
        path = self.owner.snapshot_dir / f"{snap_id}.tar"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        try:
            with self._workspace_tar() as src, tarfile.open(tmp, mode="w") as out:
                for member in _rebased(src):
                    safe = tar_member(member)
                    if safe is not None:
                        out.addfile(safe, src.extractfile(member) if member.isreg() else None)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return DockerSnapshot(id=snap_id, path=path, image_digest=self.image_digest)

    def restore(self, snap: DockerSnapshot) -> None:
        if not snap.path.is_file():
            raise SandboxError(f"snapshot {snap.id} is gone", cause="snapshot")
        self._clear()
        with snap.path.open("rb") as fh:
            self._put(WORKDIR, fh, f"restore snapshot {snap.id}")

    def reset(self, workspace: Path | None) -> None:
        """Make /work hold exactly ``workspace`` (empty when None), with no process left running: pool reuse."""
        self._clear()
        self._seed(None, workspace)

    def alive(self) -> bool:
        """One engine round trip, no command: the container still exists and runs."""
        if self.closed:
            return False
        try:
            return bool(self.api.inspect_container(self.container_id)["State"].get("Running"))
        except _ENGINE_DOWN:
            return False

    def _clear(self) -> None:
        """No processes but pid 1, and empty /work and /tmp (one exec)."""
        done = self._helper(RESET_SCRIPT)
        if done.exit_code != 0:
            raise SandboxError(f"cannot empty the workspace of {self.id}: {done.err_text()}", cause="died")


# --- reaping ---------------------------------------------------------------------------
def reap_containers(client: docker.DockerClient, *, everything: bool = False, owner: str | None = None) -> list[str]:
    """Remove trialforge sandboxes whose owner process is gone or whose deadline passed.

    ``everything`` removes them all; ``owner`` (an :func:`owner_label` value) also
    removes that owner's, live or not (a test session cleaning up after itself).
    Workspace volumes left without their container go too. Returns the names of
    the containers removed.
    """
    api = client.api
    removed: list[str] = []
    for info in api.containers(all=True, filters={"label": LABEL_OWNER}):
        labels = info.get("Labels") or {}
        if everything or labels.get(LABEL_OWNER) == owner or _abandoned(labels):
            name = (info.get("Names") or [info["Id"]])[0].lstrip("/")
            with contextlib.suppress(docker.errors.NotFound):
                api.remove_container(info["Id"], force=True, v=True)
                removed.append(name)
    for vol in (api.volumes(filters={"label": LABEL_OWNER}) or {}).get("Volumes") or []:
        labels = vol.get("Labels") or {}
        if everything or labels.get(LABEL_OWNER) == owner or _abandoned(labels):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # APIError: still in use
                api.remove_volume(vol["Name"], force=True)
    return removed


def _abandoned(labels: dict[str, str]) -> bool:
    try:
        deadline = float(labels.get(LABEL_DEADLINE, "inf"))
    except ValueError:
        deadline = 0.0
    if deadline < time.time():
        return True
    host, _, rest = labels.get(LABEL_OWNER, "").partition(":")
    pid, _, start = rest.partition(":")
    if host != pysocket.gethostname() or not pid.isdigit():
        return False  # another machine's (or unreadable): only its deadline can tell
    return not SandboxRecord("", "docker", int(pid), start, deadline).owner_alive()


# --- helpers -----------------------------------------------------------------------------
def _runtime_failed(run: _Run) -> bool:
    """Did the OCI runtime fail to start the exec (no such cwd, no free pid), as opposed to the command failing?"""
    err = run.err_text()
    return run.exit_code in (125, 126, 127) and any(
        words in err
        for words in ("unable to start container process", "OCI runtime")  # runc's words, any engine
    )


def _confined(path: str) -> str:
    """The absolute sandbox path for ``path`` (relative paths are under /work); refuse lexical escapes."""
    full = posixpath.normpath(posixpath.join(WORKDIR, path))
    if full != WORKDIR and not full.startswith(WORKDIR + "/"):
        raise SandboxError(f"path {path!r} is outside {WORKDIR}", cause="path")
    return full


def _imported_id(answer: str) -> str:
    """The image id from an import's JSON-lines answer (Docker streams progress; Podman answers once)."""
    for line in reversed(answer.strip().splitlines()):
        msg = json.loads(line)
        if "error" in msg or "errorDetail" in msg:
            raise SandboxError(f"image import failed: {msg.get('error') or msg.get('errorDetail')}", cause="image")
        for key in ("id", "status"):
            if str(msg.get(key, "")).startswith("sha256:"):
                return str(msg[key])
    raise SandboxError(f"image import answered without an id: {answer[:500]}", cause="image")


def _split_ref(name: str) -> tuple[str, str]:
    """``registry/repo:tag`` -> (``registry/repo``, ``tag``); a colon in the registry part is a port."""
    repo, sep, tag = name.rpartition(":")
    return (repo, tag) if sep and "/" not in tag else (name, "latest")


def _file_info(name: str, size: int, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, int(time.time())
    info.uid = info.gid = SANDBOX_UID
    return info


def _is_git(name: str) -> bool:
    return ".git" in name.split("/")


def _sandbox_owned(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Seed members belong to the sandbox user; git history never enters a sandbox."""
    if _is_git(info.name):
        return None
    info.uid = info.gid = SANDBOX_UID
    info.uname = info.gname = ""
    return info


@contextlib.contextmanager
def _tar_of_dir(src: Path) -> Iterator[io.IOBase]:
    """``src`` as a tar (spooled to disk past 8 MiB) whose root entry becomes /work itself."""
    with tempfile.SpooledTemporaryFile(max_size=8 << 20) as fh:
        with tarfile.open(fileobj=fh, mode="w") as tar:  # type: ignore[call-overload]
            tar.add(str(src), arcname=".", filter=_sandbox_owned)
        fh.seek(0)
        yield fh  # type: ignore[misc]


def _rebased(tar: tarfile.TarFile) -> Iterable[tarfile.TarInfo]:
    """Members of a ``work/...`` archive renamed relative to /work, without git history."""
    prefix = posixpath.basename(WORKDIR)
    for member in tar:
        name = _strip(member.name, prefix)
        if name is None or _is_git(name):
            continue
        member.name = name
        if member.islnk():
            member.linkname = _strip(member.linkname, prefix) or member.linkname
        yield member


def _strip(name: str, prefix: str) -> str | None:
    name = name.lstrip("/")
    if name == prefix:
        return "."
    return name[len(prefix) + 1 :] if name.startswith(prefix + "/") else None


def _export_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """What may leave a sandbox (``sanitize``), inside ``dest`` (the stdlib's ``data`` rule), owned by the exporter."""
    defused = tar_member(member)
    if defused is None:
        return None
    safe = tarfile.data_filter(defused, dest)
    return safe.replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="", deep=False)


class _ChunkReader(io.RawIOBase):
    """A file over the byte chunks docker-py yields, so tarfile can stream them."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            self._buf = next(self._chunks, b"")
            if not self._buf:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _pump_frames(sock: Any, out: _Capture, err: _Capture, *, deadline: float, on_deadline: Any) -> bool:
    """Demultiplex an exec's stream (8-byte frame headers) into the captures; True if the deadline hit."""
    buf = bytearray()
    hit = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if hit:
                return True
            hit = True
            on_deadline()
            deadline = time.monotonic() + DRAIN_S
            continue
        ready, _, _ = select.select([sock], [], [], min(remaining, 1.0))
        if not ready:
            continue
        chunk = sock.read(65536)
        if not chunk:
            return hit
        buf += chunk
        while len(buf) >= 8:
            stream, size = struct.unpack(">BxxxL", buf[:8])
            if len(buf) < 8 + size:
                break
            (err if stream == 2 else out).feed(bytes(buf[8 : 8 + size]))
            del buf[: 8 + size]


def _close_exec_socket(sock: Any) -> None:
    response = getattr(sock, "_response", None)  # docker-py keeps the HTTP response on the socket
    with contextlib.suppress(OSError):
        sock.close()
    if response is not None:
        with contextlib.suppress(Exception):
            response.close()


__all__ = ["DockerBackend", "DockerSandbox", "DockerSnapshot", "owner_label", "reap_containers"]
