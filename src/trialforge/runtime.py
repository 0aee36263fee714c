"""The resources a run holds: object store, snapshot cache, sandbox backend and image.

Built once from params; every door (flow, CLI step, test) opens one and closes it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trialforge.config import Params
from trialforge.sandbox.base import Backend
from trialforge.sandbox.images import Image, base_image, cache_root
from trialforge.sandbox.pool import PoolConfig, SandboxPool
from trialforge.store.objstore import ObjectStore, open_store
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.synthesize import SynthesisConfig, Synthesizer
from trialforge.verify.grader import Grader


@dataclass
class Runtime:
    params: Params
    store: ObjectStore
    snapshots: SnapshotStore
    backend: Backend
    image: Image
    image_digest: str
    pool: SandboxPool  # the episodes' sandboxes (bounded, warm when ``sandbox.warm``)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)

    def grader(self) -> Grader:
        return Grader(
            backend=self.backend,
            image=self.image.name,
            image_digest=self.image_digest,
            snapshots=self.snapshots,
            limits=self.params.sandbox,
            suite=self.params.validate_,
            timing=self.params.verify,
        )

    def synthesizer(self, **settings: Any) -> Synthesizer:
        """Bug synthesis on this run's sandboxes, seed, validation and environment settings; ``settings``: more
        ``SynthesisConfig`` fields (``max_total``, ``families``...)."""
        p = self.params
        cfg = SynthesisConfig(seed=p.run.seed, validate=p.validate_, concurrency=p.sandbox.concurrency, **settings)
        return Synthesizer(self.backend, cfg, p.env.repos, p.env.build_timeout_s)

    def close(self) -> None:
        self._stack.close()


def store_url(params: Params) -> str:
    """``file://relative/path`` is resolved against the working directory."""
    url = params.run.store
    if url.startswith("file://") and not url.startswith("file:///"):
        return "file://" + str(Path(url[len("file://") :]).resolve())
    return url


@contextlib.contextmanager
def open_runtime(params: Params) -> Iterator[Runtime]:
    stack = contextlib.ExitStack()
    try:
        store = open_store(store_url(params))
        snapshots = SnapshotStore(store, cache_root() / "snapshots")
        image = base_image()
        backend, digest = _backend(params, image, stack)
        sp = params.sandbox
        pool = SandboxPool(
            backend,
            sp,
            PoolConfig(
                max_sandboxes=sp.max_live,
                warm_per_image=sp.warm,
                warm_lifetime_s=sp.warm_lifetime_s,
                elastic=sp.elastic,
            ),
        )
        stack.callback(pool.close)  # before the backend's own cleanup (the stack unwinds in reverse)
        runtime = Runtime(params, store, snapshots, backend, image, digest, pool, stack)
        yield runtime
    finally:
        stack.close()


def _backend(params: Params, image: Image, stack: contextlib.ExitStack) -> tuple[Backend, str]:
    if params.sandbox.backend == "bwrap":
        from trialforge.sandbox.bwrap.backend import BwrapBackend
        from trialforge.sandbox.host.reaper import reap

        reap()  # sandboxes a crashed run left behind
        backend = BwrapBackend(image, allow_unlimited=params.sandbox.allow_unlimited)
        stack.callback(backend.close)
        return backend, image.digest
    if params.sandbox.engines:
        from trialforge.sandbox.container.fleet import open_fleet

        fleet = open_fleet(
            params.sandbox.engines,
            image,
            stack,
            allow_host_uids=params.sandbox.allow_host_uids,
            allow_unlimited=params.sandbox.allow_unlimited,
            health_s=params.sandbox.engine_health_s,
            registry=params.sandbox.registry,
        )
        return fleet, image.digest
    from trialforge.sandbox.container.backend import DockerBackend
    from trialforge.sandbox.container.engine import PodmanService, engine_client
    from trialforge.sandbox.host.leftovers import reap_containers, reap_services

    host = params.sandbox.docker_host or os.environ.get("DOCKER_HOST", "")
    engine_tmp = None
    if not host:
        reap_services()  # Podman services (and their containers) of crashed runs
        service = stack.enter_context(PodmanService())
        host, engine_tmp = service.base_url, service.tmp_dir
    client = engine_client(host)
    reap_containers(client)  # containers of crashed runs (dead owner or deadline passed)
    backend = DockerBackend(
        client,
        image,
        allow_host_uids=params.sandbox.allow_host_uids,
        registry=params.sandbox.registry,
        allow_unlimited=params.sandbox.allow_unlimited,
        engine_tmp=engine_tmp,
    )
    stack.callback(backend.close)
    backend.ensure_image()  # imported now: a broken engine fails here, not in the first episode
    return backend, image.digest  # the content digest, the same on every backend


def code_version() -> str:
    """The git commit of the code that ran (with ``-dirty`` when uncommitted changes were in play)."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        from trialforge import __version__

        return f"release-{__version__}"
    return f"{sha}-dirty" if dirty else sha
