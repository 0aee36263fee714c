"""The container-engine backend: one container per sandbox over the Docker Engine API (Docker or Podman).

This module is the *runtime*: what you can do in a sandbox. Where the engine comes from is ``engine.py`` (the
deployment), how a container is confined is ``confinement.py``, how bytes cross is ``transfer.py``, and what a
crash leaves behind is ``host/leftovers.py``. A sandbox runs one command at a time: each runs under ``timeout -s
KILL`` and a script that then kills every process but pid 1. How containers, quotas, snapshots, limits, exec and
paths work, and why: docs/security.md, "The docker backend".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import socket as pysocket
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors
import requests.exceptions
from tenacity import (
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    wait_fixed,
    wait_incrementing,
)

from trialforge.errors import SandboxError
from trialforge.sandbox import disk
from trialforge.sandbox.base import SANDBOX_ENV, WORKDIR, ExecResult, Limits, SandboxSpec
from trialforge.sandbox.container import confinement as confine
from trialforge.sandbox.container import registry as image_registry
from trialforge.sandbox.container import transfer as docker_io
from trialforge.sandbox.container.engine import IMPORT_LEFTOVERS
from trialforge.sandbox.container.registry import RegistryParams
from trialforge.sandbox.host.identity import SANDBOX_UID
from trialforge.sandbox.host.reaper import SandboxRecord
from trialforge.sandbox.host.statedir import private_dir, state_root
from trialforge.sandbox.hostcopy import Budget, CopyLimits, too_big
from trialforge.sandbox.images import Image, find_image
from trialforge.sandbox.oci_limits import PTYS, USERNS_LIMITS
from trialforge.sandbox.proc import _Capture
from trialforge.sandbox.seccomp import oci_profile

log = logging.getLogger(__name__)

LABEL_OWNER = "trialforge.owner"  # "<hostname>:<pid>:<process start time>"
LABEL_DEADLINE = "trialforge.deadline"  # epoch seconds
LABEL_SANDBOX = "trialforge.sandbox"
LABEL_DIGEST = "trialforge.digest"  # on imported images: the tarball's content digest
HOST_GRACE_S = 5.0  # the host's deadline trails the in-sandbox one by this much
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

# Resolve $1 as the sandbox user; refuse anything outside /work (existing or not); state the file's size and print
# it, unless it is larger than $2 bytes (exit 8; never more than that is printed, however the file grows).
READ_SCRIPT = """
p=$(realpath -m -- "$1") || exit 2
case "$p" in /work|/work/*) ;; *) printf '%s' "$p" >&2; exit 3 ;; esac
[ -f "$p" ] || { printf 'no such regular file' >&2; exit 1; }
size=$(stat -c %s -- "$p") || exit 1
printf '%s' "$size" >&2
[ "$size" -le "$2" ] || exit 8
exec head -c "$2" -- "$p"
"""

# Resolve $1 as the sandbox user; refuse anything outside /work; create its parents; write the $2
# bytes of stdin to it (a byte count, not EOF, ends it: a TLS connection cannot half-close; a write that fails, on
# a full disk, still reads the rest, so the sender is not cut off mid-stream). An
# existing file keeps its mode (even a read-only one); anything but a regular file there (a fifo
# would block the writer) is replaced.
WRITE_SCRIPT = """
p=$(realpath -m -- "$1") || exit 2
case "$p" in /work|/work/*) ;; *) printf '%s' "$p" >&2; exit 3 ;; esac
[ -d "$p" ] && { printf 'Is a directory' >&2; exit 5; }
mkdir -p -- "${p%/*}" || exit 4
if [ -e "$p" ] && [ ! -f "$p" ]; then rm -f -- "$p" || exit 4; fi
mode=$(stat -c %a -- "$p" 2>/dev/null) && chmod u+w -- "$p"
head -c "$2" > "$p" || { cat > /dev/null; exit 6; }
[ -z "$mode" ] || chmod "$mode" -- "$p"
[ "$(stat -c %s -- "$p")" = "$2" ] || exit 7
"""
WRITE_ATTEMPTS = 3  # exit 7: stdin arrived short (Podman 4's exec attach can drop what is sent as it starts)
# Fewer bytes than the file's size arrived: lost on the way. The cause seen here was docker-py's own read-ahead
# (docker_io._read_ahead, fixed); the check stays for engines that truncate an exec's output (containers/podman#9096).
READ_ATTEMPTS = 3

# A clean slate, then the archive on stdin as /work: no processes, no IPC objects (the IPC namespace lives as long
# as the container), empty scratch space, and /work exactly the archive (restore, reset, seeding). tar stops at the
# archive's end marker, not at EOF. ``-p``: the archive's modes, not the umask's.
LOAD_SCRIPT = """
kill -9 -1 2>/dev/null
ipcrm --all 2>/dev/null
chmod -R u+rwX /work /tmp /var/tmp /dev/shm 2>/dev/null
find /work /tmp /var/tmp /dev/shm $([ -d /dev/mqueue ] && echo /dev/mqueue) -mindepth 1 -delete || exit 4
exec tar -x -p --no-same-owner -f - -C /work
"""
NO_ROOM_WORDS = ("No space left", "Disk quota exceeded", "Too many links")

SAVE_ARGV = ["tar", "-c", "-f", "-", "-C", WORKDIR, "."]

OOM_SCRIPT = "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null; true"
# The container's own limits as its cgroup (v2, else v1) states them (memory, pids, CPU quota), then its mounts.
LIMITS_SCRIPT = """
if [ -f /sys/fs/cgroup/memory.max ]; then
  cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max /sys/fs/cgroup/cpu.max
else
  cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us
fi 2>/dev/null
echo --
cat /proc/sys/user/max_inotify_instances
echo --
cat /proc/self/mounts
"""

_ENGINE_DOWN = (requests.exceptions.RequestException, docker.errors.DockerException, OSError)


def owner_label() -> str:
    """Who owns what we create: host, pid and the pid's start time (so pid reuse does not fool the reaper)."""
    me = SandboxRecord.for_current_process("", backend="docker", labels={}, deadline=0)
    return f"{pysocket.gethostname()}:{me.owner_pid}:{me.owner_start}"


@dataclass(frozen=True)
class DockerSnapshot:
    """A sandbox's /work as a tar (members relative to /work) on the host, and what it holds (as its budget counted)."""

    id: str
    path: Path
    image_digest: str
    bytes: int = 0
    entries: int = 0


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
    """Creates container sandboxes, through the engine ``client`` talks to, of ``image`` or any image a spec names."""

    name = "docker"

    def __init__(
        self,
        client: docker.DockerClient,
        image: Image,
        *,
        state_dir: Path | None = None,
        allow_host_uids: bool = False,
        registry: RegistryParams | None = None,
        allow_unlimited: bool = False,
        engine_tmp: Path | None = None,
    ) -> None:
        """``allow_host_uids``: accept a Docker daemon without ``userns-remap`` (sandbox uid 1000 = host uid 1000).
        ``allow_unlimited``: accept an engine that does not apply memory, pids and CPU limits (rootless Podman on
        cgroup v1) instead of refusing it. ``engine_tmp``: the temp dir of a Podman service of ours
        (``PodmanService.tmp_dir``), where each image import leaves a copy of the image that this backend removes."""
        self.client = client
        self.engine_tmp = engine_tmp
        self.allow_unlimited = allow_unlimited
        self.limits_checked = False  # the first sandbox reads its own cgroup's limits (``DockerSandbox._check_limits``)
        self.api: docker.APIClient = client.api
        self.image = image
        self.state_dir = state_dir or state_root()
        self.snapshot_dir = self.state_dir / "snapshots" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.allow_host_uids = allow_host_uids
        self.registry = registry if registry is not None and registry.url else None
        self._images: dict[str, Image] = {}
        self._image_ids: dict[str, str] = {}  # image name -> the engine's id of it
        self._seccomp: str | None = None
        self._engine: confine.Engine | None = None
        self._lock = threading.RLock()  # ensure_image asks engine() while holding it
        self.live = 0  # sandboxes of this backend not yet closed (a fleet places by it)
        self.on_count: Callable[[], None] | None = None  # told when ``live`` changed (a fleet waiting for room)

    # --- the engine and the image --------------------------------------------------------
    def engine(self) -> confine.Engine:
        """Which engine serves the API (Podman, or Docker with or without userns-remap); asked once."""
        with self._lock:
            if self._engine is None:
                try:
                    self._engine = confine.Engine.from_api(self.client.version(), self.client.info())
                except _ENGINE_DOWN as exc:
                    raise SandboxError(f"cannot ask the container engine what it is: {exc}", cause="engine") from exc
            return self._engine

    def seccomp_option(self) -> str:
        """Our syscall rules for ``--security-opt seccomp=``: inline JSON for Docker, a file for Podman.

        Docker's API takes the profile's content; Podman's compatible API opens the value as a
        path on the engine's host, so the profile is written (once) into our private state dir.
        """
        podman = self.engine().podman
        with self._lock:
            if self._seccomp is None:
                profile = json.dumps(oci_profile(), separators=(",", ":"))
                self._seccomp = profile
                if podman:
                    path = private_dir(self.state_dir) / "seccomp.json"
                    tmp = path.with_suffix(f".{os.getpid()}.part")
                    tmp.write_text(profile)
                    tmp.replace(path)
                    self._seccomp = str(path)
            return self._seccomp

    def image_for(self, name: str) -> Image:
        """The image a sandbox spec names: the backend's own, or any other built on this machine."""
        if name in ("", self.image.name):
            return self.image
        with self._lock:
            if name not in self._images:
                self._images[name] = find_image(name)
            return self._images[name]

    def ensure_image(self, image: Image | None = None) -> str:
        """The engine's id of ``image`` (default: the backend's), importing its tarball first when absent or stale.

        An image is stale when its ``trialforge.digest`` label is not the tarball's
        digest (the tarball was rebuilt, or someone imported it by hand): the
        engine's copy must be the content the digest names.
        """
        image = image or self.image
        with self._lock:  # a pool creates from several threads: import once
            if image.name not in self._image_ids:
                self._image_ids[image.name] = self._current_image_id(image)
            return self._image_ids[image.name]

    def has_image(self, name: str) -> bool:
        """Whether ``name`` is already in the engine (imported and checked by this backend). Without the lock,
        which an import holds for minutes: a fleet asks while placing sandboxes on every engine."""
        return name in self._image_ids

    def forget_images(self) -> None:
        """Check every image again on next use: the engine came back and may have lost its store."""
        with self._lock:
            self._image_ids.clear()

    def count(self, delta: int) -> None:
        with self._lock:
            self.live += delta
        if self.on_count is not None:
            self.on_count()

    def _current_image_id(self, image: Image) -> str:
        """The engine's copy of ``image`` if its digest label is right; else pulled from the registry (if any),
        else imported from the tarball (and pushed to the registry, for the next engine)."""
        attrs = self._inspect_image(image)
        if _holds(attrs, image):
            return str(attrs["Id"])  # type: ignore[index]  # _holds: not None
        fresh = self._pulled(image) if self.registry is not None else None
        if fresh is None:
            log.info("importing image", extra={"image": image.name, "tarball": str(image.tarball)})
            self._import_image(image)
            fresh = self._inspect_image(image)
            if fresh is None:
                raise SandboxError(f"image {image.name} is missing right after its import", cause="image")
            if self.registry is not None:
                image_registry.push(self.api, self.registry, image, str(fresh["Id"]))
        if attrs is not None and attrs["Id"] != fresh["Id"]:
            with contextlib.suppress(*_ENGINE_DOWN):  # still used by a container: it stays, untagged
                self.api.remove_image(attrs["Id"])
        return str(fresh["Id"])

    def _pulled(self, image: Image) -> dict[str, Any] | None:
        """``image`` pulled from the registry and tagged as its name, if the registry has it with the right digest."""
        assert self.registry is not None
        if not image_registry.pull(self.api, self.registry, image, podman=self.engine().podman):
            return None
        try:
            self.api.tag(self.registry.reference(image), *_split_ref(image.name))
        except _ENGINE_DOWN as exc:
            raise SandboxError(f"cannot tag the pulled {image.name}: {exc}", cause="engine") from exc
        pulled = self._inspect_image(image)
        if not _holds(pulled, image):
            log.warning("the registry's image is not the tarball's content: importing", extra={"image": image.name})
            return None
        return pulled

    def _inspect_image(self, image: Image) -> dict[str, Any] | None:
        try:
            return self.api.inspect_image(image.name)
        except docker.errors.ImageNotFound:
            return None
        except _ENGINE_DOWN as exc:
            raise SandboxError(f"cannot inspect image {image.name}: {exc}", cause="engine") from exc

    def _import_image(self, image: Image) -> None:
        """``docker import`` through the API (``images.load`` wants an image archive, not a rootfs)."""
        if not image.tarball.is_file():
            raise SandboxError(f"image tarball {image.tarball} is missing: rebuild the image", cause="image")
        repo, tag = _split_ref(image.name)
        try:
            answer = self.api.import_image(
                src=str(image.tarball),
                repository=image.name,
                changes=[f"LABEL {LABEL_DIGEST}={image.digest}"],
            )
            image_id = _imported_id(answer)
            self.api.tag(image_id, repo, tag)  # Podman ignores the tag in an import's name; Docker honours it
        except _ENGINE_DOWN as exc:
            raise SandboxError(f"cannot import {image.tarball} as {image.name}: {exc}", cause="image") from exc
        finally:
            self._remove_import_leftovers()

    def _remove_import_leftovers(self) -> None:
        """Podman keeps the upload of every import in its temp dir (it never removes it): ours is known, so is it."""
        if self.engine_tmp is not None:
            for leftover in self.engine_tmp.glob(IMPORT_LEFTOVERS):
                leftover.unlink(missing_ok=True)

    # --- sandboxes and snapshots -----------------------------------------------------------
    def create(self, spec: SandboxSpec) -> DockerSandbox:
        return DockerSandbox(self, spec)

    def from_snapshot(self, snap: DockerSnapshot, spec: SandboxSpec) -> DockerSandbox:
        """A new sandbox whose workspace starts as ``snap`` (the fork of a rollout group)."""
        if not snap.path.is_file():
            raise SandboxError(f"snapshot {snap.id} is gone", cause="snapshot")
        return DockerSandbox(self, spec, seed=snap)

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

    def __init__(self, owner: DockerBackend, spec: SandboxSpec, *, seed: DockerSnapshot | None = None) -> None:
        self.owner = owner
        self.api = owner.api
        self.limits: Limits = spec.limits
        self.id = f"tf-{uuid.uuid4().hex[:12]}"
        self.image_digest = owner.ensure_image(owner.image_for(spec.image))
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
        self.copy_limits = CopyLimits.of(self.limits)
        owner.count(+1)  # close() gives it back, also when starting fails below
        try:
            self._start()
            if not owner.limits_checked:
                self._check_limits()
            if seed is not None:
                self.restore(seed)
            else:
                self.reset(spec.workspace)
        except BaseException:
            self.close()
            raise

    # --- lifecycle -------------------------------------------------------------------
    def _start(self) -> None:
        owner = self.owner
        host_config = confine.host_config(
            owner.engine(),
            self.limits,
            seccomp_profile=owner.seccomp_option(),
            allow_host_uids=owner.allow_host_uids,
        )
        try:
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
            why = str(exc.explanation or exc)
            raise SandboxError(f"cannot start sandbox {self.id}: {why}{_hint(why)}", cause="start") from exc
        except _ENGINE_DOWN as exc:
            raise SandboxError(f"cannot start sandbox {self.id}: engine unreachable: {exc}", cause="engine") from exc

    def close(self) -> None:
        """Remove the container (its tmpfs go with it); idempotent, and quiet if it is already gone."""
        if self.closed:
            return
        self.closed = True
        self.owner.count(-1)
        try:
            remove_container(self.api, self.id)
        except _ENGINE_DOWN as exc:  # the reaper removes what we could not
            log.warning("sandbox cleanup failed", extra={"sandbox": self.id, "error": str(exc)})

    def _check_limits(self) -> None:
        """Read this container's cgroup limits from inside (before any agent code runs) and refuse an engine that did
        not apply them, unless the backend accepts that (``allow_unlimited``)."""
        text = self._helper(LIMITS_SCRIPT).out_bytes().decode(errors="replace")
        cgroup, inotify, mounts = [*text.split("--", 2), "", ""][:3]
        values = cgroup.split()
        memory, pids, quota = [*values, "", "", ""][:3]
        options = {f[1]: f[3] for f in (line.split() for line in mounts.splitlines()) if len(f) > 3}
        lim = self.limits
        missing = [
            name
            for name, ok in (
                ("memory", memory.isdigit() and int(memory) <= lim.memory_mb * 1024 * 1024),
                ("pids", pids.isdigit() and int(pids) <= lim.pids),
                ("cpu", quota.lstrip("-").isdigit() and int(quota) > 0),
                *((f"{p.path} inodes", "nr_inodes=" in options.get(p.path, "")) for p in disk.places(lim)),
                ("/dev/pts terminals", f"max={PTYS}" in options.get("/dev/pts", "")),
                ("inotify", inotify.strip().isdigit() and int(inotify) <= USERNS_LIMITS["max_inotify_instances"]),
            )
            if not ok
        ]
        if missing and not self.owner.allow_unlimited:
            raise SandboxError(
                f"the container engine did not apply the sandbox's {', '.join(missing)} limits (its cgroup says "
                f"{' '.join(values) or 'nothing'}): rootless Podman on cgroup v1 cannot set cgroup limits, and a "
                "Podman without trialforge's containers.conf (which PodmanService writes) sets no inode, terminal or "
                "inotify limit. "
                "Run the engine as root (or on cgroup v2 with the controllers delegated) with that configuration, "
                "or set sandbox.allow_unlimited: true (params.yaml) to accept that",
                cause="cgroup",
            )
        if missing:
            log.warning("the engine applies no %s limits; accepted by sandbox.allow_unlimited", ", ".join(missing))
        self.owner.limits_checked = True

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def alive(self) -> bool:
        """One engine round trip, no command: the container still exists and runs."""
        if self.closed:
            return False
        try:
            return bool(self.api.inspect_container(self.container_id)["State"].get("Running"))
        except _ENGINE_DOWN:
            return False

    def cpu_s(self) -> float | None:
        """The engine's CPU counter for the container (its cgroup's), one API call; None if it cannot say."""
        if self.closed:
            return None
        try:  # one_shot: Docker Engine otherwise waits for a second sample to compute a percentage
            stats = self.api.stats(self.container_id, stream=False, one_shot=True)
            return int(stats["cpu_stats"]["cpu_usage"]["total_usage"]) / 1e9
        except (*_ENGINE_DOWN, KeyError, TypeError, ValueError):
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
        limit = max(timeout if timeout is not None else self.limits.exec_timeout_s, 0.001)
        cap = self.limits.output_cap_bytes
        run = self._run(
            ["/bin/sh", "-c", EXEC_WRAPPER, "trialforge-exec", f"{limit:.3f}", *argv],
            limit_s=limit + HOST_GRACE_S,
            out=_Capture(cap),
            err=_Capture(cap),
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
        self,
        argv: Sequence[str],
        *,
        limit_s: float,
        out: Any,
        err: _Capture,
        cwd: str = WORKDIR,
        env: dict[str, str] | None = None,
        stdin: IO[bytes] | bytes | None = None,
    ) -> _Run:
        """One exec with a host-side deadline; on it, every process in the sandbox is killed."""
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed", cause="closed")
        start = time.monotonic()
        with self._engine_call("exec"):
            exec_id = self.api.exec_create(
                self.container_id,
                list(argv),
                stdout=True,
                stderr=True,
                stdin=stdin is not None,
                environment=env or None,
                workdir=cwd,
            )["Id"]
            sock = self.api.exec_start(exec_id, socket=True)
        try:
            deadline_hit = docker_io.pump_frames(
                sock, out, err, deadline=start + limit_s, on_deadline=self._kill_all, stdin=stdin
            )
        except OSError as exc:
            self._raise_if_dead("exec")
            raise SandboxError(f"lost the output stream of an exec in {self.id}: {exc}", cause="engine") from exc
        finally:
            docker_io.close_exec_socket(sock)
        exit_code = 137 if deadline_hit else self._exit_code(exec_id)
        return _Run(exit_code, out, err, time.monotonic() - start, deadline_hit)

    def _exit_code(self, exec_id: str) -> int:
        polling = Retrying(  # the engine may record the exit a moment after the stream ends
            retry=retry_if_result(lambda info: info.get("Running") or info.get("ExitCode") is None),
            stop=stop_after_attempt(100),
            wait=wait_fixed(0.01),
            retry_error_callback=lambda _: None,
        )
        info = polling(self._inspect_exec, exec_id)
        if info is None:
            self._raise_if_dead("exec")
            raise SandboxError(f"exec {exec_id[:12]} in {self.id} never reported an exit code", cause="engine")
        if int(info["ExitCode"]) < 0:  # the engine lost the process: most likely the container with it
            self._raise_if_dead("exec")
        return int(info["ExitCode"])

    def _inspect_exec(self, exec_id: str) -> dict[str, Any]:
        with self._engine_call("exec"):
            return self.api.exec_inspect(exec_id)

    def _helper(self, argv: Sequence[str], *args: str, cap: int = 1 << 20, out: Any = None, stdin: Any = None) -> _Run:
        """One of our fixed commands (a script if ``argv`` is a string), as the sandbox user, with a short deadline."""
        full = ["/bin/sh", "-c", argv, "trialforge", *args] if isinstance(argv, str) else list(argv)
        sink = out if out is not None else _Capture(cap)
        return self._run(full, limit_s=HELPER_TIMEOUT_S, out=sink, err=_Capture(1 << 16), stdin=stdin)

    def _kill_all(self) -> None:
        """Kill every process but pid 1 (the host's deadline passed)."""
        with contextlib.suppress(SandboxError):
            self._helper(["/bin/sh", "-c", "kill -9 -1"], cap=4096)

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
        """The file's bytes; the script states its size first, so output the engine lost is asked for again, and a
        file larger than the workspace's quota is refused before a byte of it is sent."""
        target = _confined(path)
        cap = self.copy_limits.bytes
        for _ in range(READ_ATTEMPTS):
            run = self._helper(READ_SCRIPT, target, str(cap), cap=cap + 2)
            if run.exit_code == 3:
                raise SandboxError(f"path {path!r} resolves outside {WORKDIR} (to {run.err_text()})", cause="path")
            if run.exit_code == 8:
                raise too_big(repr(path), int(run.err_text() or 0), cap)
            if run.exit_code != 0:
                raise FileNotFoundError(f"{path}: {run.err_text() or 'cannot read'}")
            data = run.out_bytes()
            if str(len(data)) == run.err_text():
                return data
            log.warning("%s of %s arrived short (%d bytes, %s stated): reading again", path, self.id, len(data),
                        run.err_text())  # fmt: skip
        raise SandboxError(f"cannot read {path!r} in {self.id}: its content arrived short", cause="path")

    def write_file(self, path: str, data: bytes) -> None:
        target = _confined(path)
        Budget(self.copy_limits, f"writing {path!r} into {self.id}").take_bytes(len(data), path)
        for _ in range(WRITE_ATTEMPTS):
            run = self._helper(WRITE_SCRIPT, target, str(len(data)), stdin=bytes(data))
            if run.exit_code != 7:
                break
        if run.exit_code == 3:
            raise SandboxError(f"path {path!r} resolves outside {WORKDIR} (to {run.err_text()})", cause="path")
        if run.exit_code == 5:
            raise IsADirectoryError(f"{path}: Is a directory")
        if run.exit_code != 0:
            why = "its content arrived short" if run.exit_code == 7 else run.err_text()
            full = any(words in why for words in NO_ROOM_WORDS)
            raise SandboxError(f"cannot write {path!r} in {self.id}: {why}", cause="quota" if full else "path")

    def export_workspace(self, dest: Path) -> None:
        budget = Budget(self.copy_limits, f"the export of {self.id}")
        with self._workspace_tar() as tar:
            docker_io.extract_workspace(tar, dest, budget)

    @contextlib.contextmanager
    def _workspace_tar(self) -> Iterator[tarfile.TarFile]:
        """/work as the tar that ``tar`` in the sandbox writes (members ``./...``), read in stream mode as it arrives.

        ``tar`` never writes nothing (an empty archive is two zero blocks): an exit 0 with no byte is output lost on
        the way (as READ_ATTEMPTS says), so the archive is asked for once more. A caller that stops reading (its
        budget ran out) ends the exec: the pipe closes, the stream is dropped, and whatever still runs is killed.
        """
        for attempt in (1, 2):
            sink = docker_io.PipeSink()
            outcome: dict[str, Any] = {}
            pump = threading.Thread(target=self._archive_into, args=(sink, outcome), name="archive", daemon=True)
            pump.start()
            finished = False
            try:
                tar = sink.open_tar()
                if tar is None:
                    pump.join()
                    run = self._archived(outcome)
                    if run.exit_code == 0 and sink.total == 0 and attempt == 1:
                        log.warning("the engine delivered no byte of %s's workspace archive (exit 0): asking again",
                                    self.id)  # fmt: skip
                        finished = True  # nothing left running to kill
                        continue
                    raise SandboxError(f"the workspace archive of {self.id} is unreadable", cause="snapshot") from None
                with tar:
                    yield tar
                sink.drain()
                finished = True
            finally:
                sink.reader.close()  # a writer still sending gets EPIPE: the exec's reading ends
                pump.join()
                if not finished:
                    self._kill_all()
            self._archived(outcome)
            return

    def _archive_into(self, sink: docker_io.PipeSink, outcome: dict[str, Any]) -> None:
        try:
            outcome["run"] = self._helper(SAVE_ARGV, out=sink)
        except BaseException as exc:  # handed to the reading thread, which decides what it means
            outcome["error"] = exc
        finally:
            sink.close_writer()

    def _archived(self, outcome: dict[str, Any]) -> _Run:
        """The archiving exec's result, or its error raised; a failed ``tar`` is a ``snapshot`` error."""
        if "error" in outcome:
            raise outcome["error"]
        run: _Run = outcome["run"]
        if run.exit_code != 0:
            self._raise_if_dead("archive")
            raise SandboxError(f"cannot archive the workspace of {self.id}: {run.err_text()}", cause="snapshot")
        return run

    def _load(self, archive: IO[bytes], what: str) -> None:
        """/work becomes exactly ``archive`` (its ``.`` entry makes /work the sandbox user's), with no process left."""
        run = self._helper(LOAD_SCRIPT, stdin=archive)
        if run.exit_code != 0:
            self._raise_if_dead(what)
            full = any(words in run.err_text() for words in NO_ROOM_WORDS)
            raise SandboxError(f"cannot {what} of {self.id}: {run.err_text()}", cause="quota" if full else "died")

    # --- snapshots ---------------------------------------------------------------------
    def snapshot(self) -> DockerSnapshot:
        snap_id = uuid.uuid4().hex[:12]
        folder = self.owner.snapshot_dir
        if not folder.is_dir():
            private_dir(self.owner.state_dir / "snapshots")
            folder.mkdir(exist_ok=True)
        path = folder / f"{snap_id}.tar"
        budget = Budget(self.copy_limits, f"the snapshot of {self.id}")
        with self._workspace_tar() as src:
            docker_io.write_snapshot(src, path, budget)
        return DockerSnapshot(snap_id, path, self.image_digest, budget.bytes, budget.entries)

    def restore(self, snap: DockerSnapshot) -> None:
        """/work becomes the snapshot; refused up front when this sandbox's quota cannot hold it."""
        if not snap.path.is_file():
            raise SandboxError(f"snapshot {snap.id} is gone", cause="snapshot")
        budget = Budget(self.copy_limits, f"the restore of snapshot {snap.id} into {self.id}")
        budget.take_tree(snap.bytes, snap.entries)
        with snap.path.open("rb") as fh:
            self._load(fh, f"restore snapshot {snap.id}")

    def reset(self, workspace: Path | None) -> None:
        """Make /work hold exactly ``workspace`` (empty when None), with no process left running: pool reuse."""
        with docker_io.tar_of_dir(workspace, Budget(self.copy_limits, f"the seeding of {self.id}")) as fh:
            self._load(fh, "reset the workspace")


# --- helpers -----------------------------------------------------------------------------
def _holds(attrs: dict[str, Any] | None, image: Image) -> bool:
    """An engine's image (``inspect`` attributes) is ``image``: its digest label is the tarball's digest."""
    labels = ((attrs or {}).get("Config") or {}).get("Labels") or {}
    return attrs is not None and labels.get(LABEL_DIGEST) == image.digest


def remove_container(api: docker.APIClient, container: str, *, attempts: int = 3) -> bool:
    """Force-remove ``container`` (and its anonymous volumes); True if it existed.

    Podman (rootful, user namespace) sometimes reports ``userdata/shm: device or resource busy``
    for a container it did remove: what counts is whether the container is gone afterwards. One still
    there is asked again, 0.2 s later, then 0.4 s...; after ``attempts`` the engine's error is raised.
    """
    retrying = Retrying(
        retry=retry_if_exception_type(_StillThere),
        stop=stop_after_attempt(attempts),
        wait=wait_incrementing(start=0.2, increment=0.2),
        reraise=True,
    )

    def remove() -> bool:
        try:
            api.remove_container(container, force=True, v=True)
        except docker.errors.NotFound:
            return retrying.statistics["attempt_number"] > 1  # an earlier try removed it after all
        except docker.errors.APIError as exc:
            if _exists(api, container):
                raise _StillThere(exc) from exc
        return True

    try:
        return retrying(remove)
    except _StillThere as still:
        raise still.error from None


class _StillThere(Exception):
    """The engine refused to remove a container that is still there: worth asking again."""

    def __init__(self, error: docker.errors.APIError) -> None:
        super().__init__(str(error))
        self.error = error


def _exists(api: docker.APIClient, container: str) -> bool:
    try:
        api.inspect_container(container)
    except docker.errors.NotFound:
        return False
    return True


def _runtime_failed(run: _Run) -> bool:
    """Did the OCI runtime fail to start the exec (no such cwd, no free pid), as opposed to the command failing?"""
    err = run.err_text()
    return run.exit_code in (125, 126, 127) and any(
        words in err
        for words in ("unable to start container process", "OCI runtime")  # runc's words, any engine
    )


def _hint(engine_error: str) -> str:
    """What to do about an engine's refusal to create a confined container, when we know."""
    if any(words in engine_error for words in ("subuid", "subgid", "available IDs", "user namespace")):
        return (
            " (Podman's UsernsMode=auto needs /etc/subuid and /etc/subgid entries for the user `containers`: "
            "run scripts/setup-system.sh as root)"
        )
    if "slirp4netns" in engine_error:
        return " (network on Podman needs slirp4netns: apt-get install slirp4netns)"
    return ""


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


__all__ = ["DockerBackend", "DockerSandbox", "DockerSnapshot", "owner_label", "remove_container"]
