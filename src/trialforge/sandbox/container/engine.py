"""A container engine to talk to: the user's Docker, or a Podman API service we start ourselves.

When ``DOCKER_HOST`` is set the user has chosen an engine and we use it. Otherwise :class:`PodmanService` runs
``podman system service`` on a private unix socket for as long as a ``with`` block (or a test session) lasts, with
the repository's ``containers.conf`` rendered into its home (``render_conf``) and a temp dir of its own
(``temp_dir``), and stops exactly that process afterwards. Why and how: docs/security.md, "The docker backend".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from trialforge.checkout import CHECKOUT
from trialforge.errors import SandboxError
from trialforge.owners import process_start, still_running
from trialforge.sandbox.host.statedir import private_dir, state_root
from trialforge.sandbox.oci_limits import runtime_script

log = logging.getLogger(__name__)

API_VERSION = "1.41"
CONF_ENV = "CONTAINERS_CONF"
_PODMAN_DIR = CHECKOUT / "images" / "podman"
_REPO_CONF = _PODMAN_DIR / "containers.conf"
RENDERED_CONF = "containers.conf"  # in a service's home
RUNTIME = "oci-runtime"  # in a service's home: images/podman/oci-runtime filled in
IMPORT_LEFTOVERS = "api_load.tar*"  # Podman's copy of an image imported through the API, never removed by Podman
_ENGINE_DOWN = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def containers_conf(path: Path | None = None) -> Path:
    """The containers.conf a Podman service should use: ``path``, else ``$CONTAINERS_CONF``, else the repo's."""
    chosen = path or (Path(os.environ[CONF_ENV]) if os.environ.get(CONF_ENV) else _REPO_CONF)
    if not chosen.is_file():
        raise SandboxError(
            f"containers.conf not found at {chosen}: pass containers_conf= or set {CONF_ENV} "
            "(the repository ships images/podman/containers.conf)",
            cause="engine",
        )
    return chosen


def render_conf(source: Path, home: Path) -> Path:
    """``source`` with trialforge's OCI runtime wrapper (filled in, written to ``home``) as ``runc`` and its slirp4netns
    wrapper, written to ``home``; returns the conf's path."""
    runtime = _write(home / RUNTIME, runtime_script(_PODMAN_DIR / "oci-runtime"), mode=0o755)
    text = source.read_text()
    engine = f'network_cmd_path = "{_PODMAN_DIR / "slirp4netns-userns"}"\n'
    if "[engine]" not in text:
        text += "\n[engine]\n"
    text = text.replace("[engine]\n", "[engine]\n" + engine, 1) + f'\n[engine.runtimes]\nrunc = ["{runtime}"]\n'
    return _write(home / RENDERED_CONF, text, mode=0o644)


def _write(dest: Path, text: str, *, mode: int) -> Path:
    tmp = dest.with_suffix(f".{os.getpid()}.part")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(dest)
    return dest


def engine_client(base_url: str | None = None, *, timeout: float = 120.0) -> docker.DockerClient:
    """A client for the engine at ``base_url`` (``None``: the environment's, i.e. ``DOCKER_HOST`` and its TLS).

    Pings once, so an unreachable engine fails here with a clear cause rather
    than in the middle of a rollout.
    """
    target = base_url or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if base_url is None:
            client = docker.from_env(version=API_VERSION, timeout=int(timeout))
        else:
            client = docker.DockerClient(base_url=base_url, version=API_VERSION, timeout=int(timeout))
    except _ENGINE_DOWN as exc:
        raise SandboxError(
            f"cannot configure a client for the container engine at {target}: {exc}", cause="engine"
        ) from exc
    try:
        client.ping()
    except _ENGINE_DOWN as exc:
        client.close()
        raise SandboxError(
            f"container engine at {target} is unreachable ({exc}); start one with "
            "`trialforge.sandbox.container.engine.PodmanService` or point DOCKER_HOST at a running Docker",
            cause="engine",
        ) from exc
    return client


class PodmanService:
    """``podman system service`` on a private socket, for one ``with`` block; or the user's ``DOCKER_HOST``.

    >>> with PodmanService() as engine:
    ...     client = engine.client()
    """

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        containers_conf: Path | None = None,
        start_timeout_s: float = 60.0,
        use_docker_host: bool = True,
        own_storage: bool = False,
    ) -> None:
        """``own_storage``: images and containers in a store of the service's own (podman ``--root``/``--runroot``
        in ``store_dir(home)``) instead of the host's shared one: a second engine on one host behaves as an
        engine on another machine would (it sees none of the first one's images or containers)."""
        self.state_dir = state_dir
        self.own_storage = own_storage
        self.conf = containers_conf
        self.start_timeout_s = start_timeout_s
        self.external = os.environ.get("DOCKER_HOST") if use_docker_host else None
        self.base_url: str | None = self.external
        self.proc: subprocess.Popen[bytes] | None = None
        self._made_dir: Path | None = None
        self.tmp_dir: Path | None = None  # the service's $TMPDIR: None for the user's engine
        self._rendered: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        """What podman (service or CLI) needs to see this service's configuration, and its own temp dir."""
        env = {**os.environ, CONF_ENV: str(self._rendered or containers_conf(self.conf))}
        if self.tmp_dir is not None:
            env["TMPDIR"] = str(self.tmp_dir)
        return env

    def start(self) -> str:
        """Start the service (unless one is already running or DOCKER_HOST is set); returns its URL."""
        if self.external is not None:
            engine_client(None).close()  # fail now, with a clear message, if the user's engine is down
            return self.external
        if self.proc is not None:
            assert self.base_url is not None
            return self.base_url
        if shutil.which("podman") is None:
            raise SandboxError(
                "podman is not installed (apt-get install podman runc) and DOCKER_HOST is unset", cause="engine"
            )
        home = self._home()
        self._rendered = render_conf(containers_conf(self.conf), home)
        self.tmp_dir = _own_dir(temp_dir(home))
        socket = home / "podman.sock"
        socket.unlink(missing_ok=True)
        self.base_url = f"unix://{socket}"
        store = []
        if self.own_storage:
            root = _own_store(home)
            store = ["--root", str(root / "storage"), "--runroot", str(root / "run")]
        with (home / "service.log").open("ab") as logfile:
            self.proc = subprocess.Popen(
                ["podman", *store, "system", "service", "--time=0", self.base_url],
                env=self.env,
                cwd=home,  # conmon drops files (``oom``) into its working directory: keep them in ours
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal reaches us, and we stop it in order
            )
        ServiceRecord.for_service(self.proc.pid, self.base_url).save(home)
        try:
            self._wait_ready(home / "service.log")
        except BaseException:
            self.stop()
            raise
        log.info("podman service ready", extra={"url": self.base_url, "pid": self.proc.pid})
        return self.base_url

    def client(self) -> docker.DockerClient:
        return engine_client(self.start() if self.external is None else None)

    def stop(self) -> None:
        """Terminate the service process we started (and only it); containers are the caller's to remove first."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        if self.tmp_dir is not None:  # the engine's leftovers (image imports; a rootless Podman's run dir) go with it
            _kill_users(self.tmp_dir)  # the cleanup processes of a rootless Podman, which would make it again
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None
        if self._rendered is not None:
            self._rendered.unlink(missing_ok=True)
            self._rendered.with_name(RUNTIME).unlink(missing_ok=True)
            self._rendered = None
        if self._made_dir is not None:
            remove_home(self._made_dir)
            self._made_dir = None

    def __enter__(self) -> PodmanService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _home(self) -> Path:
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            return self.state_dir
        root = private_dir(state_root())
        self._made_dir = Path(tempfile.mkdtemp(prefix="podman-", dir=root))  # short: unix socket paths max 107 bytes
        return self._made_dir

    def _wait_ready(self, logfile: Path) -> None:
        """Poll ``/_ping`` until the service answers; fail fast if the process exits."""
        assert self.proc is not None and self.base_url is not None
        probe = docker.APIClient(base_url=self.base_url, version=API_VERSION, timeout=2)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise SandboxError(
                        f"podman system service exited with {self.proc.returncode}: {_tail(logfile)}", cause="engine"
                    )
                try:
                    if probe.ping():
                        return
                except _ENGINE_DOWN:
                    pass
                time.sleep(0.02)  # poll interval, not a guess at how long startup takes
        finally:
            probe.close()
        raise SandboxError(
            f"podman system service did not answer /_ping within {self.start_timeout_s:.0f}s: {_tail(logfile)}",
            cause="engine",
        )


@dataclass(frozen=True)
class ServiceRecord:
    """Who started a Podman service, so ``leftovers.reap_services`` can stop it once that owner is gone."""

    service_pid: int
    service_start: str
    owner_pid: int
    owner_start: str
    url: str

    @classmethod
    def for_service(cls, pid: int, url: str) -> ServiceRecord:
        me = os.getpid()
        return cls(pid, process_start(pid), me, process_start(me), url)

    def save(self, home: Path) -> None:
        tmp = home / "service.json.part"
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(home / "service.json")

    def owner_alive(self) -> bool:
        return still_running(self.owner_pid, self.owner_start)

    def service_alive(self) -> bool:
        return still_running(self.service_pid, self.service_start)


def temp_dir(home: Path) -> Path:
    """The service's ``$TMPDIR``: outside the state dir, for the reason ``store_dir`` gives (rootless Podman opened
    the state dir to every user when its temp dir was in it), named after the home, so a reaper finds it."""
    return Path(tempfile.gettempdir()) / f"tf-enginetmp-{home.name.removeprefix('podman-')}"


def store_dir(home: Path) -> Path:
    """Where the service homed at ``home`` keeps a store of its own: outside the state dir, since Podman opens a
    store's parents to every user (o+x, for user namespaces) and the state dir must stay closed; short, since
    Podman refuses a runroot over 50 characters. Named after the home, so a reaper finds it from the home."""
    return Path(tempfile.gettempdir()) / f"tf-store-{home.name.removeprefix('podman-')}"


def _own_store(home: Path) -> Path:
    """``store_dir(home)``, made by us now (never one somebody else made first), or ours from an earlier start."""
    return _own_dir(store_dir(home))


def _own_dir(path: Path) -> Path:
    """``path`` made by us now (never one somebody else made first, in the shared temp dir), or ours from before."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise SandboxError(f"refusing {path}: not a directory of ours", cause="state_dir") from None
    return path


def remove_home(home: Path) -> None:
    """Remove a service's home and its own store, if any, unmounting first what is mounted there (the overlay
    driver bind-mounts its layer directory onto itself). Both are ours alone, so is what is mounted in them."""
    store = store_dir(home)
    _kill_users(store)
    for mount in mounts_under(store):
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
    shutil.rmtree(store, ignore_errors=True)
    _kill_users(temp_dir(home))
    shutil.rmtree(temp_dir(home), ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)


def _kill_users(store: Path, rounds: int = 50) -> None:
    """SIGKILL every process that names ``store`` on its command line (conmons, and the ``podman container
    cleanup`` they start when a container ends, which would otherwise recreate the store after its removal)."""
    needle = str(store).encode()
    for _ in range(rounds):
        users = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if needle in (proc / "cmdline").read_bytes():
                    users.append(int(proc.name))
            except OSError:
                continue
        if not users:
            return
        for pid in users:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)  # poll interval while the killed processes exit


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below ``root``, deepest first (mountinfo's 5th field, octal escapes decoded)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    points = {Path(line.split()[4].encode().decode("unicode_escape")) for line in lines if len(line.split()) > 4}
    root = root.resolve()
    return sorted((p for p in points if p == root or root in p.parents), key=lambda p: len(p.parts), reverse=True)


def _tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-size:].strip() or "(no output)"
    except OSError:
        return "(no log)"
