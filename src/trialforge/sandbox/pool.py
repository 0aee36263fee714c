"""A pool of sandboxes over one backend: warm reuse, bounded concurrency, health checks, creation retries.

Reuse is what makes rollouts cheap: a released sandbox is reset to an empty
workspace and kept warm for its image, so the next episode pays a workspace
reset instead of a sandbox start. Bounds keep a batch from starting more
sandboxes than the machine (or the engine) can hold.

A reaper removes any sandbox past its deadline, in use or not. A pool that keeps
sandboxes warm therefore starts them with a longer life (``warm_lifetime_s``) and
retires a warm one, instead of reusing it, once another episode could outlive it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tenacity import (
    RetryCallState,
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)

from trialforge.errors import SandboxError
from trialforge.sandbox.base import Backend, Limits, Sandbox, SandboxSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolConfig:
    max_sandboxes: int = 8  # live sandboxes, handed out or warm
    max_starting: int = 2  # sandboxes being created at once (engines choke on start storms)
    warm_per_image: int = 2  # idle sandboxes kept per image
    warm_lifetime_s: float = 3600.0  # deadline of a sandbox that may be reused (warm_per_image > 0)
    create_retries: int = 3  # attempts at creating one sandbox
    backoff_s: float = 0.2  # the first wait between them; each next one doubles, plus jitter up to as much again


@dataclass
class PoolStats:
    created: int = 0
    reused: int = 0
    create_failures: int = 0
    create_wait_s: float = 0.0  # waited between creation attempts (the backoff chosen, not a clock reading)
    unhealthy: int = 0
    retired: int = 0  # warm sandboxes closed because another episode could outlive their deadline
    acquire_wait_s: float = 0.0


class SandboxPool:
    def __init__(self, backend: Backend, limits: Limits, cfg: PoolConfig | None = None) -> None:
        self.backend = backend
        self.limits = limits
        self.cfg = cfg or PoolConfig()
        self.stats = PoolStats()
        self._idle: dict[str, list[Sandbox]] = defaultdict(list)
        self._live = 0
        self._cond = threading.Condition()
        self._starting = threading.BoundedSemaphore(self.cfg.max_starting)
        self._closed = False

    # --- hand-out ------------------------------------------------------------------------
    def acquire(self, image: str, workspace: Path | None = None, labels: dict[str, str] | None = None) -> Sandbox:
        """A healthy sandbox of ``image`` whose /work holds exactly ``workspace`` (empty when None).

        ``labels`` mark a sandbox when it starts; a reused one keeps those of its first holder.
        """
        start = time.monotonic()
        while True:
            sandbox = self._take_idle(image)
            if sandbox is None:
                break
            if sandbox.deadline - time.time() < self.limits.episode_timeout_s:
                self.stats.retired += 1
                self.discard(sandbox)
                continue
            if self._healthy(sandbox):
                try:
                    sandbox.reset(workspace)
                except SandboxError:
                    self.discard(sandbox)
                    continue
                self.stats.reused += 1
                self.stats.acquire_wait_s += time.monotonic() - start
                return sandbox
            self.stats.unhealthy += 1
            self.discard(sandbox)
        self._reserve_slot()
        try:
            sandbox = self._create(self._spec(image, workspace, labels))
        except BaseException:
            self._free_slot()
            raise
        self.stats.acquire_wait_s += time.monotonic() - start
        return sandbox

    def release(self, sandbox: Sandbox, image: str) -> None:
        """Return a sandbox: kept warm when there is room and it is still healthy, else closed."""
        with self._cond:
            keep = not self._closed and len(self._idle[image]) < self.cfg.warm_per_image
        if keep and self._healthy(sandbox):
            with self._cond:
                self._idle[image].append(sandbox)
                self._cond.notify_all()
            return
        self.discard(sandbox)

    def discard(self, sandbox: Sandbox) -> None:
        """Close a sandbox that must not be reused (it failed, or its owner says so) and free its slot."""
        try:
            sandbox.close()
        finally:
            self._free_slot()

    @contextlib.contextmanager
    def sandbox(
        self, image: str, workspace: Path | None = None, labels: dict[str, str] | None = None
    ) -> Iterator[Sandbox]:
        sandbox = self.acquire(image, workspace, labels)
        broken = False
        try:
            yield sandbox
        except SandboxError:
            broken = True
            raise
        finally:
            if broken:
                self.discard(sandbox)
            else:
                self.release(sandbox, image)

    def fork_group(
        self, image: str, workspace: Path | None, n: int, setup: Callable[[Sandbox], None] | None = None
    ) -> list[Sandbox]:
        """N sandboxes that all start from one post-setup state (the members of a GRPO group)."""
        first = self.acquire(image, workspace)
        try:
            if setup is not None:
                setup(first)
            snap = first.snapshot()
        except BaseException:
            self.discard(first)
            raise
        group = [first]
        try:
            for _ in range(n - 1):
                self._reserve_slot()
                try:
                    group.append(self.backend.from_snapshot(snap, self._spec(image)))
                except BaseException:
                    self._free_slot()
                    raise
                self.stats.created += 1
        except BaseException:
            for sandbox in group:
                self.discard(sandbox)
            raise
        finally:
            self.backend.release(snap)
        return group

    def prewarm(self, image: str, count: int | None = None) -> None:
        for _ in range(count if count is not None else self.cfg.warm_per_image):
            self.release(self.acquire(image), image)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle = [s for group in self._idle.values() for s in group]
            self._idle.clear()
        for sandbox in idle:
            self.discard(sandbox)

    # --- internals -----------------------------------------------------------------------
    def _spec(self, image: str, workspace: Path | None = None, labels: dict[str, str] | None = None) -> SandboxSpec:
        lifetime = self.cfg.warm_lifetime_s if self.cfg.warm_per_image > 0 else None
        return SandboxSpec(
            image=image, workspace=workspace, limits=self.limits, labels=labels or {}, lifetime_s=lifetime
        )

    def _take_idle(self, image: str) -> Sandbox | None:
        with self._cond:
            if self._closed:
                raise SandboxError("the sandbox pool is closed", cause="closed")
            return self._idle[image].pop() if self._idle[image] else None

    def _reserve_slot(self) -> None:
        """Wait for room under max_sandboxes, evicting an idle sandbox of another image if that makes room."""
        victim = None
        with self._cond:
            while self._live >= self.cfg.max_sandboxes:
                victim = next((group.pop() for group in self._idle.values() if group), None)
                if victim is not None:
                    break
                self._cond.wait(timeout=1.0)
            if victim is None:
                self._live += 1
        if victim is not None:
            victim.close()  # its slot passes to us: _live is unchanged

    def _free_slot(self) -> None:
        with self._cond:
            self._live -= 1
            self._cond.notify_all()

    def _create(self, spec: SandboxSpec) -> Sandbox:
        """``backend.create``, retried on a ``SandboxError``: the n-th wait is d + U(0, d), d = backoff_s * 2**(n-1)
        (the jitter keeps the retries of a batch from aligning)."""
        backoff = self.cfg.backoff_s
        retrying = Retrying(
            retry=retry_if_exception_type(SandboxError),
            stop=stop_after_attempt(self.cfg.create_retries),
            wait=wait_exponential(multiplier=backoff) + wait_random_exponential(multiplier=backoff),
            after=self._creation_failed,
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        try:
            sandbox = retrying(self._create_once, spec)
        except SandboxError as exc:
            attempts = retrying.statistics["attempt_number"]
            raise SandboxError(f"could not create a sandbox after {attempts} attempts: {exc}", cause=exc.cause) from exc
        finally:
            self.stats.create_wait_s += retrying.statistics["idle_for"]
        self.stats.created += 1
        return sandbox

    def _create_once(self, spec: SandboxSpec) -> Sandbox:
        with self._starting:
            return self.backend.create(spec)

    def _creation_failed(self, _state: RetryCallState) -> None:
        self.stats.create_failures += 1

    @staticmethod
    def _healthy(sandbox: Sandbox) -> bool:
        try:
            return sandbox.alive()
        except SandboxError:
            return False
