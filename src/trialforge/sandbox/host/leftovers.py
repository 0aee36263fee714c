"""What dead runs leave behind, found and removed: the work of ``trialforge reap``.

Per kind: bwrap sandboxes (``reaper.reap``), labelled containers (``reap_containers``), the Podman services we
started with their conmon processes and state (``reap_services``), processes a run started for itself
(``owned.reap_owned``) and owner-named scratch dirs (``trialforge.scratch``). ``reap_all`` removes each kind whose
owner is dead or whose deadline passed (everything with ``everything=True``) and reports what it removed, by kind.
docs/security.md, "What `trialforge reap` removes".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket as pysocket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import docker
import docker.errors

from trialforge.errors import SandboxError
from trialforge.owners import still_running
from trialforge.sandbox.container.backend import LABEL_DEADLINE, LABEL_OWNER, remove_container
from trialforge.sandbox.container.endpoints import EngineEndpoint, SshTunnel
from trialforge.sandbox.container.engine import PodmanService, ServiceRecord, engine_client, remove_home, store_dir
from trialforge.sandbox.host import owned, reaper
from trialforge.sandbox.host.statedir import check_private, state_root
from trialforge.scratch import reap_scratch

log = logging.getLogger(__name__)

SERVICE_STOP_S = 15.0  # how long a stopped service may take to exit before it is killed


@dataclass
class Reaped:
    """What one reaping removed, by kind (names, ids, or ``"conmon <pid>"`` for processes)."""

    sandboxes: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    services: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    scratch: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)  # engines of the fleet that did not answer: not reaped

    def add(self, other: Reaped) -> Reaped:
        for f in fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))
        return self

    def summary(self) -> str:
        return (
            f"removed {len(self.sandboxes)} bwrap sandboxes, {len(self.containers)} containers, "
            f"{len(self.volumes)} volumes, {len(self.services)} podman services, "
            f"{len(self.processes)} processes, {len(self.scratch)} temp dirs"
            + (f"; engines not reached: {', '.join(self.unreachable)}" if self.unreachable else "")
        )


def reap_all(
    *,
    everything: bool = False,
    state_dir: Path | None = None,
    docker_host: str | None = None,
    engines: Sequence[EngineEndpoint] = (),
) -> Reaped:
    """Every kind, in order: sandboxes, services (with their containers), processes runs started, the engine's
    other containers, the fleet's engines' containers, temp dirs.

    The engine is ``docker_host``, else ``$DOCKER_HOST``, else a short-lived Podman service of our
    own (rootful Podman keeps containers in one store: a fresh service sees what a dead one left).
    ``engines`` (``sandbox.engines``) are each visited too; one that does not answer is reported, not fatal.
    """
    done = Reaped(sandboxes=reaper.reap(state_dir, everything=everything))
    done.add(reap_services(state_dir, everything=everything))
    done.processes.extend(owned.reap_owned(state_dir, everything=everything))
    for endpoint in engines:
        done.add(_reap_engine(endpoint, everything=everything))
    host = docker_host or os.environ.get("DOCKER_HOST")
    if host:
        client = engine_client(host)
        with contextlib.closing(client):
            done.add(reap_containers(client, everything=everything))
    elif shutil.which("podman"):
        with PodmanService(state_dir, use_docker_host=False) as engine:
            client = engine.client()
            with contextlib.closing(client):
                done.add(reap_containers(client, everything=everything))
    done.scratch = reap_scratch(everything=everything)
    return done


def _reap_engine(endpoint: EngineEndpoint, *, everything: bool) -> Reaped:
    with contextlib.ExitStack() as stack:
        url = endpoint.url
        try:
            if endpoint.scheme == "ssh":
                tunnel = SshTunnel(endpoint)
                stack.callback(tunnel.close)
                url = tunnel.ensure()
            client = stack.enter_context(contextlib.closing(endpoint.client(url, 30)))
            client.ping()
            return reap_containers(client, everything=everything)
        except (SandboxError, docker.errors.DockerException, OSError) as exc:
            log.warning("engine %s not reaped: it does not answer (%s)", endpoint.label, exc)
            return Reaped(unreachable=[endpoint.label])


def reap_containers(client: docker.DockerClient, *, everything: bool = False, owner: str | None = None) -> Reaped:
    """Remove trialforge containers whose owner process is gone or whose deadline passed.

    ``everything`` removes them all; ``owner`` (an ``owner_label()`` value) also removes that
    owner's, live or not (a test session cleaning up after itself). Labelled volumes go by
    the same rule; conmon processes on this host that outlive their removed container are killed.
    """
    api = client.api
    done = Reaped()
    removed_ids: list[str] = []
    for info in api.containers(all=True, filters={"label": LABEL_OWNER}):
        if not _ours_to_remove(info.get("Labels") or {}, everything, owner):
            continue
        name = (info.get("Names") or [info["Id"]])[0].lstrip("/")
        try:
            if not remove_container(api, info["Id"]):
                continue  # someone else removed it meanwhile
        except docker.errors.APIError as exc:
            log.warning("cannot remove container %s: %s", name, exc.explanation or exc)
            continue
        done.containers.append(name)
        removed_ids.append(info["Id"])
    for vol in (api.volumes(filters={"label": LABEL_OWNER}) or {}).get("Volumes") or []:
        if _ours_to_remove(vol.get("Labels") or {}, everything, owner):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # APIError: still in use
                api.remove_volume(vol["Name"], force=True)
                done.volumes.append(vol["Name"])
    done.processes = kill_conmons(removed_ids)
    return done


def reap_services(state_dir: Path | None = None, *, everything: bool = False) -> Reaped:
    """Stop the Podman services of dead owners (all with ``everything``), first removing their abandoned sandboxes."""
    root = state_dir or state_root()
    done = Reaped()
    homes = sorted(root.glob("podman-*")) if root.is_dir() else []
    if not homes:
        return done
    check_private(root)  # its records say which processes to kill: only ours may be trusted
    for home in homes:
        try:
            record = ServiceRecord(**json.loads((home / "service.json").read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being started, or not ours to judge
        if record.owner_alive() and not everything:
            continue
        if not _is_our_service(record, home):
            log.warning("not stopping pid %s: it is not the Podman service recorded in %s", record.service_pid, home)
        else:
            done.add(_stop_service(record, home, everything=everything))
        remove_home(home)
        done.services.append(home.name)
    return done


def _stop_service(record: ServiceRecord, home: Path, *, everything: bool) -> Reaped:
    done = Reaped()
    try:
        client = engine_client(record.url, timeout=30)
    except SandboxError as exc:
        log.warning("Podman service %s does not answer (%s): stopping it anyway", record.url, exc)
        if store_dir(home).is_dir():  # a store of its own: only a service on that store can remove its containers
            with (
                PodmanService(home, use_docker_host=False, own_storage=True) as engine,
                contextlib.closing(engine.client()) as revived,
            ):
                done.add(reap_containers(revived, everything=everything))
    else:
        with contextlib.closing(client):
            done.add(reap_containers(client, everything=everything))
    # Signalled only while it is the recorded process (pid and start time): a service that died with its owner
    # has nothing to stop, and its pid may be another process's by now.
    _signal(record, signal.SIGTERM)
    deadline = time.monotonic() + SERVICE_STOP_S
    while record.service_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # poll interval while it stops its containers' conmons and exits
    _signal(record, signal.SIGKILL)
    return done


def _signal(record: ServiceRecord, sig: signal.Signals) -> None:
    if record.service_alive():
        with contextlib.suppress(ProcessLookupError):  # it may exit between the check and the signal
            os.kill(record.service_pid, sig)


def _is_our_service(record: ServiceRecord, home: Path) -> bool:
    """The recorded pid is (still) ``podman system service`` on this home's socket, or it is already gone."""
    if not record.service_alive():
        return True
    line = cmdline(record.service_pid)
    return "podman" in line and "system service" in line and str(home) in record.url and record.url in line


def kill_conmons(container_ids: Iterable[str]) -> list[str]:
    """SIGKILL conmon processes on this host that still watch one of ``container_ids`` (already removed)."""
    ids = [cid for cid in container_ids if len(cid) >= 12]
    if not ids:
        return []
    killed: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or _comm(proc) != "conmon":
            continue
        argv = cmdline(int(proc.name)).split()
        if any(cid in argv for cid in ids) and proc.stat().st_uid == os.geteuid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(f"conmon {proc.name}")
    return killed


def _ours_to_remove(labels: dict[str, str], everything: bool, owner: str | None) -> bool:
    return everything or (owner is not None and labels.get(LABEL_OWNER) == owner) or abandoned(labels)


def abandoned(labels: dict[str, str]) -> bool:
    """Past its deadline, or its owner (on this host) is dead; another host's owner only its deadline can judge."""
    try:
        deadline = float(labels.get(LABEL_DEADLINE, "inf"))
    except ValueError:
        deadline = 0.0
    if deadline < time.time():
        return True
    host, _, rest = labels.get(LABEL_OWNER, "").partition(":")
    pid, _, start = rest.partition(":")
    if host != pysocket.gethostname() or not pid.isdigit():
        return False
    return not still_running(int(pid), start)


def _comm(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


def cmdline(pid: int | str) -> str:
    """A process's command line, space-joined; empty when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
