"""Sandboxes over several container engines at once: placement, health checks, failover.

A fleet is a ``Backend`` the pool uses like any other, over the engines of ``sandbox.engines``, each with a
capacity. The engines' own sandboxes, snapshots and reapers are ``DockerBackend``'s; a snapshot is a tarball on this
host, so a group's fork may land on any engine. Placement, health, failover and images by digest: docs/fleet.md.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
import requests.exceptions

from trialforge.errors import SandboxError
from trialforge.sandbox.base import Sandbox, SandboxSpec
from trialforge.sandbox.container.backend import LABEL_DIGEST, LABEL_OWNER, DockerBackend, DockerSnapshot
from trialforge.sandbox.container.endpoints import EngineEndpoint, SshTunnel
from trialforge.sandbox.container.registry import RegistryParams
from trialforge.sandbox.host.leftovers import reap_containers
from trialforge.sandbox.images import Image

log = logging.getLogger(__name__)

_ENGINE_DOWN = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)
PROBE_TIMEOUT_S = 5.0  # a ping slower than this is an engine out of order


@dataclass
class FleetEngine:
    """An engine as the fleet sees it: its backend, its capacity, whether it answers."""

    endpoint: EngineEndpoint
    backend: DockerBackend
    probe: docker.APIClient  # short timeout, for health checks only
    tunnel: SshTunnel | None = None  # an ssh:// engine's forwarded socket
    up: bool = True
    pending: int = 0  # placements chosen and not yet created
    placed: int = 0
    downs: int = 0
    last_error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.endpoint.label

    def free(self) -> int:
        return self.endpoint.capacity - self.backend.live - self.pending

    def answers(self, *, reconnect: bool = False) -> bool:
        """One ping; ``reconnect`` restarts a tunnel that died first (the health check's thread does: a tunnel
        dies with the thread that started it)."""
        try:
            if reconnect and self.tunnel is not None:
                self.tunnel.ensure()
            return bool(self.probe.ping())
        except (SandboxError, *_ENGINE_DOWN):
            return False

    def status(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "up": self.up,
            "live": self.backend.live,
            "capacity": self.endpoint.capacity,
            "placed": self.placed,
            "downs": self.downs,
            "last_error": self.last_error,
        }


class EngineFleet:
    """A ``Backend`` over several engines (see the module doc)."""

    name = "docker"

    def __init__(self, engines: list[FleetEngine], *, health_s: float = 5.0, capacity_wait_s: float = 60.0) -> None:
        if not engines:
            raise SandboxError("an engine fleet needs at least one engine", cause="engine")
        self.engines = engines
        self.image: Image = engines[0].backend.image
        self.health_s = health_s
        self.capacity_wait_s = capacity_wait_s
        self.waiting = 0  # creates waiting for a free slot (every engine that answers is full)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        for engine in engines:
            engine.backend.on_count = self._notify
        self._checker = threading.Thread(target=self._check_every, name="engine-health", daemon=True)
        self._checker.start()

    # --- Backend -------------------------------------------------------------------------
    def image_for(self, name: str) -> Image:
        return self.engines[0].backend.image_for(name)

    def create(self, spec: SandboxSpec) -> Sandbox:
        return self._place(spec, lambda engine: engine.backend.create(spec))

    def from_snapshot(self, snap: DockerSnapshot, spec: SandboxSpec) -> Sandbox:
        return self._place(spec, lambda engine: engine.backend.from_snapshot(snap, spec))

    def release(self, snap: DockerSnapshot) -> None:
        self.engines[0].backend.release(snap)

    def close(self) -> None:
        self._stop.set()
        self._checker.join()
        for engine in self.engines:
            engine.backend.close()
            engine.probe.close()

    # --- health ----------------------------------------------------------------------------
    def check(self) -> list[dict[str, Any]]:
        """Ping every engine now: take out those that do not answer, put back those that do again."""
        for engine in self.engines:
            answers = engine.answers(reconnect=True)
            if answers and not engine.up:
                engine.backend.forget_images()
                self._mark(engine, up=True, why="answers again")
            elif not answers and engine.up:
                self._mark(engine, up=False, why="does not answer /_ping")
        return self.status()

    def status(self) -> list[dict[str, Any]]:
        with self._cond:
            return [engine.status() for engine in self.engines]

    def _check_every(self) -> None:
        while not self._stop.wait(self.health_s):
            self.check()

    def _mark(self, engine: FleetEngine, *, up: bool, why: str) -> None:
        with self._cond:
            if engine.up == up:
                return
            engine.up = up
            if not up:
                engine.downs += 1
                engine.last_error = why
            self._cond.notify_all()
        say = log.info if up else log.warning
        say("engine %s", "up" if up else "down", extra={"engine": engine.name, "why": why})

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # --- placement -------------------------------------------------------------------------
    def _place(self, spec: SandboxSpec, make: Callable[[FleetEngine], Sandbox]) -> Sandbox:
        """``make`` on the best engine; on another one while the chosen engine turns out to be down."""
        image = self.image_for(spec.image).name
        tried: set[str] = set()
        while True:
            engine = self._reserve(image, tried)
            try:
                sandbox = make(engine)
            except SandboxError as exc:
                if engine.answers():  # the engine is fine: the failure is this sandbox's
                    raise
                self._mark(engine, up=False, why=str(exc))
                tried.add(engine.name)
                continue
            finally:
                with self._cond:
                    engine.pending -= 1
                    self._cond.notify_all()
            engine.placed += 1
            return sandbox

    def _reserve(self, image: str, tried: set[str]) -> FleetEngine:
        """The engine for a new sandbox of ``image``: up, not yet tried, a free slot; its image first, then the
        most free slots. Waits (up to ``capacity_wait_s``) while every engine that is up is full."""
        deadline = time.monotonic() + self.capacity_wait_s
        with self._cond:
            while True:
                up = [e for e in self.engines if e.up and e.name not in tried]
                if not up:
                    raise SandboxError(f"no engine of the fleet can take a sandbox: {self._summary()}", cause="engine")
                free = [e for e in up if e.free() > 0]
                if free:
                    chosen = max(free, key=lambda e: (e.backend.has_image(image), e.free()))
                    chosen.pending += 1
                    return chosen
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(
                        f"every engine that answers is full after {self.capacity_wait_s:.0f}s: {self._summary()}",
                        cause="capacity",
                    )
                self.waiting += 1
                try:
                    self._cond.wait(timeout=left)
                finally:
                    self.waiting -= 1

    def _summary(self) -> str:
        return "; ".join(
            f"{e.name}: {'up' if e.up else 'down'} {e.backend.live}/{e.endpoint.capacity}"
            + (f" ({e.last_error})" if e.last_error and not e.up else "")
            for e in self.engines
        )


def open_fleet(
    endpoints: list[EngineEndpoint],
    image: Image,
    stack: contextlib.ExitStack,
    *,
    allow_host_uids: bool = False,
    allow_unlimited: bool = False,
    health_s: float = 5.0,
    registry: RegistryParams | None = None,
) -> EngineFleet:
    """Connect to every engine, reap what crashed runs left there, import the image everywhere; closed by ``stack``.

    An engine that does not answer now starts out of placement (and joins when it answers); none answering
    is an error.
    """
    engines = []
    for endpoint in endpoints:
        tunnel = SshTunnel(endpoint) if endpoint.scheme == "ssh" else None
        url = tunnel.url if tunnel is not None else endpoint.url
        if tunnel is not None:
            stack.callback(tunnel.close)
        client = endpoint.client(url)
        stack.callback(client.close)
        probe = endpoint.client(url, PROBE_TIMEOUT_S).api
        backend = DockerBackend(
            client, image, allow_host_uids=allow_host_uids, registry=registry, allow_unlimited=allow_unlimited
        )
        engine = FleetEngine(endpoint, backend, probe, tunnel)
        try:
            if tunnel is not None:
                tunnel.ensure()
            client.ping()
            reap_containers(client)  # containers of crashed runs (dead owner or deadline passed)
            backend.ensure_image()  # now: the same content (checked by digest) on every engine, imported or pulled
        except (SandboxError, *_ENGINE_DOWN) as exc:
            engine.up, engine.downs, engine.last_error = False, 1, str(exc)
            log.warning("engine unavailable at start", extra={"engine": endpoint.label, "error": str(exc)})
        engines.append(engine)
    if not any(e.up for e in engines):
        for engine in engines:
            engine.probe.close()
        raise SandboxError(
            "no engine of sandbox.engines answers: "
            + "; ".join(f"{e.name} ({e.endpoint.url}): {e.last_error}" for e in engines),
            cause="engine",
        )
    fleet = EngineFleet(engines, health_s=health_s)
    stack.callback(fleet.close)
    return fleet


def survey(endpoints: list[EngineEndpoint], image: Image) -> list[dict[str, Any]]:
    """What each engine of a fleet says now, touching nothing: whether it answers (and why not), what it is,
    whether it holds ``image`` by digest, and how many trialforge sandboxes it runs."""
    rows = []
    for endpoint in endpoints:
        row: dict[str, Any] = {"engine": endpoint.label, "capacity": endpoint.capacity}
        with contextlib.ExitStack() as stack:
            try:
                client = stack.enter_context(contextlib.closing(endpoint.client(_reach(endpoint, stack), 30)))
                client.ping()
                version = client.version()
                images = client.api.images(filters={"label": f"{LABEL_DIGEST}={image.digest}"})
                sandboxes = client.api.containers(filters={"label": LABEL_OWNER})
            except (SandboxError, *_ENGINE_DOWN) as exc:
                row |= {"answers": False, "error": str(exc)}
            else:
                row |= {
                    "answers": True,
                    "version": f"{(version.get('Platform') or {}).get('Name', '')} {version.get('Version')}".strip(),
                    "image": image.name if images else None,
                    "sandboxes": len(sandboxes),
                }
        rows.append(row)
    return rows


def _reach(endpoint: EngineEndpoint, stack: contextlib.ExitStack) -> str:
    """The url to talk to ``endpoint`` at: its own, or a tunnel's (closed by ``stack``)."""
    if endpoint.scheme != "ssh":
        return endpoint.url
    tunnel = SshTunnel(endpoint)
    stack.callback(tunnel.close)
    return tunnel.ensure()
