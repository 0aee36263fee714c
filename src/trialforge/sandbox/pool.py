"""A pool of sandboxes over one backend: warm reuse, bounded concurrency, health checks, creation retries.

A released sandbox is reset and kept warm for its image, so the next episode pays a reset, not a start; bounds keep
a batch from starting more than the machine can hold. The reaper removes any sandbox past its deadline, so warm ones
start with ``warm_lifetime_s`` and are retired once an episode could outlive them. Warm capacity is fixed
(``warm_per_image``) or elastic (``PoolConfig.elastic``: ``DemandMeter``, ``SandboxPool._wanted``). How the elastic
pool sizes and queues: docs/scale.md, "The elastic pool (`sandbox.elastic`)".
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field, model_validator
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
from trialforge.section import Section

log = logging.getLogger(__name__)

CREATE_SMOOTHING = 0.3  # weight of the newest create latency in an image's running estimate


class ElasticConfig(Section):
    """Warm sandboxes that follow demand, per image (``sandbox.elastic`` in params.yaml, docs/scale.md). Never part
    of a run's digest: when a sandbox starts changes nothing an episode computes."""

    enabled: bool = False  # off: a fixed pool of `warm` idle sandboxes per image
    min_warm: int = Field(0, ge=0)  # idle sandboxes kept per image however quiet it is
    max_warm: int = Field(8, ge=1)  # most sandboxes idle or starting ahead of demand, per image (max_live bounds all)
    window_s: float = Field(60.0, gt=0)  # how long peak demand (in use + waiting) is remembered: the target follows it
    idle_s: float = Field(10.0, ge=0)  # an idle sandbox above the target is closed after this long

    @model_validator(mode="after")
    def _bounds(self) -> ElasticConfig:
        if self.min_warm > self.max_warm:
            raise ValueError(f"min_warm ({self.min_warm}) is above max_warm ({self.max_warm}): lower one of them")
        return self


@dataclass(frozen=True)
class PoolConfig:
    max_sandboxes: int = 8  # live sandboxes, handed out or warm
    max_starting: int = 2  # sandboxes being created at once (engines choke on start storms)
    warm_per_image: int = 2  # idle sandboxes kept per image (a fixed pool; ignored when elastic)
    warm_lifetime_s: float = 3600.0  # deadline of a sandbox that may be reused (warm_per_image > 0, or elastic)
    create_retries: int = 3  # attempts at creating one sandbox
    backoff_s: float = 0.2  # the first wait between them; each next one doubles, plus jitter up to as much again
    elastic: ElasticConfig = field(default_factory=ElasticConfig)  # off: a fixed pool; on: follows demand per image


@dataclass
class PoolStats:
    created: int = 0
    reused: int = 0
    create_failures: int = 0
    create_wait_s: float = 0.0  # waited between creation attempts (the backoff chosen, not a clock reading)
    unhealthy: int = 0
    retired: int = 0  # warm sandboxes closed because another episode could outlive their deadline
    acquire_wait_s: float = 0.0
    idle_s: float = 0.0  # sandbox-seconds spent idle in the pool: what warm capacity costs
    warmed: int = 0  # sandboxes started ahead of demand (elastic)
    scaled_down: int = 0  # idle sandboxes closed above the warm target (elastic)


class DemandMeter:
    """One image's demand over the last ``window_s``: its peak (sandboxes in use plus acquires waiting, taken at
    each arrival) and its arrival rate."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._arrivals: deque[float] = deque()
        self._peaks: deque[tuple[float, int]] = deque()  # (time, demand then), demands decreasing: the max first

    def arrive(self, now: float, in_demand: int) -> None:
        self._arrivals.append(now)
        while self._peaks and self._peaks[-1][1] <= in_demand:
            self._peaks.pop()  # smaller and older: never the max again
        self._peaks.append((now, in_demand))
        self._forget(now)

    def peak(self, now: float) -> int:
        self._forget(now)
        return self._peaks[0][1] if self._peaks else 0

    def rate(self, now: float) -> float:
        """Arrivals per second over the window."""
        self._forget(now)
        return len(self._arrivals) / self.window_s

    def expires(self) -> float | None:
        """When the oldest thing remembered leaves the window (the target may fall then)."""
        return self._arrivals[0] + self.window_s if self._arrivals else None

    def _forget(self, now: float) -> None:
        while self._arrivals and self._arrivals[0] < now - self.window_s:
            self._arrivals.popleft()
        while self._peaks and self._peaks[0][0] < now - self.window_s:
            self._peaks.popleft()


@dataclass(eq=False)
class _Ticket:
    """An acquire queued for its image; answered with a sandbox, the right to start one, or nothing (closed)."""

    since: float
    ready: threading.Event = field(default_factory=threading.Event)
    sandbox: Sandbox | None = None  # an idle sandbox handed over
    start: bool = False  # a start slot and a live slot are held for it
    evict: Sandbox | None = None  # an idle sandbox of another image to close first: its live slot passed on


@dataclass(eq=False)
class _Demand:
    """One image's side of an elastic pool."""

    meter: DemandMeter
    queue: deque[_Ticket] = field(default_factory=deque)
    in_use: int = 0  # handed out and not yet given back
    creating: int = 0  # acquires starting their own sandbox
    warming: int = 0  # background starts in flight: each goes to the queue's head, or idle
    create_s: float = 0.0  # observed create latency, smoothed (0 until one is seen)
    paused: bool = False  # a background start failed: none until a start succeeds (acquires still try)

    def started(self, seconds: float) -> None:
        self.create_s = seconds if not self.create_s else self.create_s + CREATE_SMOOTHING * (seconds - self.create_s)
        self.paused = False


class SandboxPool:
    def __init__(self, backend: Backend, limits: Limits, cfg: PoolConfig | None = None) -> None:
        self.backend = backend
        self.limits = limits
        self.cfg = cfg or PoolConfig()
        self.stats = PoolStats()
        self._idle: dict[str, list[Sandbox]] = defaultdict(list)  # oldest first
        self._parked: dict[int, float] = {}  # id of an idle sandbox -> when it became idle
        self._held: dict[int, str] = {}  # id of a sandbox handed out -> its image (elastic)
        self._live = 0
        self._cond = threading.Condition()
        self._starting = threading.BoundedSemaphore(self.cfg.max_starting)
        self._closed = False
        self._elastic = self.cfg.elastic if self.cfg.elastic.enabled else None
        self._demand: dict[str, _Demand] = {}
        self._starts = 0  # creations in flight, acquires' and background ones (elastic)
        self._warmers: ThreadPoolExecutor | None = None
        self._controller: threading.Thread | None = None
        if self._elastic is not None:
            self._warmers = ThreadPoolExecutor(self.cfg.max_starting, thread_name_prefix="pool-warm")
            self._controller = threading.Thread(
                target=self._control, args=(self._warmers,), name="pool-elastic", daemon=True
            )
            self._controller.start()

    # --- hand-out ------------------------------------------------------------------------
    def acquire(self, image: str, workspace: Path | None = None, labels: dict[str, str] | None = None) -> Sandbox:
        """A healthy sandbox of ``image`` whose /work holds exactly ``workspace`` (empty when None).

        ``labels`` mark a sandbox when it starts; a reused one keeps those of its first holder.
        """
        start = time.monotonic()
        if self._elastic is None:
            sandbox = self._acquire_fixed(image, workspace, labels)
        else:
            sandbox = self._acquire_elastic(image, workspace, labels)
        self.stats.acquire_wait_s += time.monotonic() - start
        return sandbox

    def release(self, sandbox: Sandbox, image: str) -> None:
        """Return a sandbox: kept warm when there is room and it is still healthy, else closed."""
        if self._elastic is not None:
            self._release_elastic(sandbox, image, self._elastic)
            return
        with self._cond:
            keep = not self._closed and len(self._idle[image]) < self.cfg.warm_per_image
        if keep and self._healthy(sandbox):
            with self._cond:
                self._park(image, sandbox)
                self._cond.notify_all()
            return
        self.discard(sandbox)

    def discard(self, sandbox: Sandbox) -> None:
        """Close a sandbox that must not be reused (it failed, or its owner says so) and free its slot."""
        try:
            sandbox.close()
        finally:
            self._free_slot(returned=sandbox)

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

    def waiting(self, image: str) -> int:
        """Acquires of ``image`` still waiting for a sandbox, queued or starting their own: the backlog an elastic
        pool follows (0 in a fixed pool)."""
        with self._cond:
            demand = self._demand.get(image)
            return len(demand.queue) + demand.creating if demand is not None else 0

    def close(self) -> None:
        """Close every idle sandbox and stop the elastic controller; queued acquires get a SandboxError."""
        with self._cond:
            self._closed = True
            for demand in self._demand.values():
                while demand.queue:
                    demand.queue.popleft().ready.set()  # answered with nothing: closed
            self._cond.notify_all()
        if self._controller is not None and self._warmers is not None:
            self._controller.join()
            self._warmers.shutdown(wait=True)  # a start still in flight is closed when it lands
        with self._cond:
            idle = [self._unpark(image) for image, group in self._idle.items() for _ in range(len(group))]
        for sandbox in idle:
            self.discard(sandbox)

    # --- a fixed pool --------------------------------------------------------------------
    def _acquire_fixed(self, image: str, workspace: Path | None, labels: dict[str, str] | None) -> Sandbox:
        while (sandbox := self._take_idle(image)) is not None:
            if self._reusable(sandbox, workspace):
                self.stats.reused += 1
                return sandbox
        self._reserve_slot()
        try:
            return self._create(self._spec(image, workspace, labels))
        except BaseException:
            self._free_slot()
            raise

    def _take_idle(self, image: str) -> Sandbox | None:
        with self._cond:
            if self._closed:
                raise SandboxError("the sandbox pool is closed", cause="closed")
            return self._unpark(image) if self._idle[image] else None

    def _reserve_slot(self) -> None:
        """Wait for room under max_sandboxes, evicting an idle sandbox of another image if that makes room."""
        victim = None
        with self._cond:
            while self._live >= self.cfg.max_sandboxes:
                victim = self._any_idle()
                if victim is not None:
                    break
                self._cond.wait(timeout=1.0)
            if victim is None:
                self._live += 1
        if victim is not None:
            victim.close()  # its slot passes to us: _live is unchanged

    # --- an elastic pool -----------------------------------------------------------------
    def _acquire_elastic(self, image: str, workspace: Path | None, labels: dict[str, str] | None) -> Sandbox:
        arriving = True
        while True:
            ticket = self._enqueue(image, arriving)
            ticket.ready.wait()  # every ticket is answered: by _dispatch, or by close
            arriving = False  # a retry after an unusable sandbox is the same demand
            if ticket.sandbox is not None:
                if self._reusable(ticket.sandbox, workspace):
                    self.stats.reused += 1
                    return self._hand_out(image, ticket.sandbox)
            elif ticket.start:
                return self._hand_out(image, self._start(image, self._spec(image, workspace, labels), ticket.evict))
            else:
                raise SandboxError("the sandbox pool is closed", cause="closed")

    def _hand_out(self, image: str, sandbox: Sandbox) -> Sandbox:
        with self._cond:
            self._held[id(sandbox)] = image
            self._demand[image].in_use += 1
        return sandbox

    def _given_back(self, sandbox: Sandbox) -> None:
        """Under the lock: ``sandbox`` is no longer in use (released, or discarded by its holder)."""
        image = self._held.pop(id(sandbox), None)
        if image is not None:
            self._demand[image].in_use -= 1

    def _enqueue(self, image: str, arriving: bool) -> _Ticket:
        with self._cond:
            if self._closed:
                raise SandboxError("the sandbox pool is closed", cause="closed")
            demand = self._demand_of(image)
            ticket = _Ticket(time.monotonic())
            demand.queue.append(ticket)
            if arriving:
                demand.meter.arrive(ticket.since, demand.in_use + demand.creating + len(demand.queue))
            self._dispatch()
            self._cond.notify_all()  # the controller sees the demand
        return ticket

    def _start(self, image: str, spec: SandboxSpec, evict: Sandbox | None) -> Sandbox:
        """A queued acquire starts its own sandbox (it holds a start slot and a live slot)."""
        if evict is not None:
            evict.close()  # its live slot passed to this start
        begun = time.monotonic()
        try:
            sandbox = self._create(spec)
        except BaseException:
            with self._cond:
                self._demand[image].creating -= 1
                self._starts -= 1
            self._free_slot()
            raise
        with self._cond:
            demand = self._demand[image]
            demand.creating -= 1
            demand.started(time.monotonic() - begun)
            self._starts -= 1
            self._dispatch()
            self._cond.notify_all()
        return sandbox

    def _release_elastic(self, sandbox: Sandbox, image: str, cfg: ElasticConfig) -> None:
        with self._cond:
            self._given_back(sandbox)
        if self._healthy(sandbox):
            with self._cond:
                demand = self._demand_of(image)
                if not self._closed and (demand.queue or len(self._idle[image]) < cfg.max_warm):
                    self._park(image, sandbox)
                    self._dispatch()
                    self._cond.notify_all()
                    return
        self.discard(sandbox)

    def _dispatch(self) -> None:
        """Under the lock: answer queued acquires with an idle sandbox of their image, else the right to start one
        (oldest first, across images), as far as start slots and max_sandboxes allow."""
        for image, demand in self._demand.items():
            while demand.queue and self._idle[image]:
                ticket = demand.queue.popleft()
                ticket.sandbox = self._unpark(image)
                ticket.ready.set()
        while self._starts < self.cfg.max_starting:
            # An acquire that a background start is on its way to waits for it instead of starting another.
            unserved = [d for d in self._demand.values() if len(d.queue) > d.warming]
            if not unserved:
                return
            demand = min(unserved, key=lambda d: d.queue[0].since)
            ticket = demand.queue[0]
            if self._live < self.cfg.max_sandboxes:
                self._live += 1
            elif (victim := self._any_idle()) is not None:
                ticket.evict = victim
            else:
                return
            demand.queue.popleft()
            demand.creating += 1
            self._starts += 1
            ticket.start = True
            ticket.ready.set()

    def _control(self, warmers: ThreadPoolExecutor) -> None:
        """The controller thread: start warm sandboxes up to each image's target, close idle ones above it."""
        while (work := self._await_work()) is not None:
            starts, surplus = work
            for image in starts:
                warmers.submit(self._warm, image)
            for sandbox in surplus:
                self.stats.scaled_down += 1
                self.discard(sandbox)

    def _await_work(self) -> tuple[list[str], list[Sandbox]] | None:
        """Wait until there is something to start or to close (None: the pool closed)."""
        with self._cond:
            while not self._closed:
                starts, surplus, wake_at = self._plan(time.monotonic())
                if starts or surplus:
                    return starts, surplus
                self._cond.wait(None if wake_at is None else max(0.0, wake_at - time.monotonic()))
        return None

    def _plan(self, now: float) -> tuple[list[str], list[Sandbox], float | None]:
        """Under the lock: the background starts to make (their slots taken), the idle sandboxes to close (taken
        out of the pool), and when the next decision falls due (None: on the next event)."""
        assert self._elastic is not None
        idle_s, starts, surplus, wakes = self._elastic.idle_s, [], [], []
        for image, demand in self._demand.items():
            target, idle = self._wanted(demand, now), self._idle[image]
            ahead = len(idle) + demand.warming - len(demand.queue)  # negative: acquires no start is coming for
            while ahead < target and self._can_warm(demand):
                demand.warming += 1
                self._starts += 1
                self._live += 1
                ahead += 1
                starts.append(image)
            while idle and ahead > target:  # oldest first, once idle long enough
                due = self._parked[id(idle[0])] + idle_s
                if due > now:
                    wakes.append(due)
                    break
                surplus.append(self._unpark(image, 0))
                ahead -= 1
            if idle and (expires := demand.meter.expires()) is not None:
                wakes.append(expires)
        return starts, surplus, min(wakes, default=None)

    def _wanted(self, demand: _Demand, now: float) -> int:
        """How many sandboxes an image should have idle or starting: its peak demand in the window plus the acquires
        expected while one starts, above its demand now; within min_warm..max_warm."""
        assert self._elastic is not None
        spare = math.ceil(demand.meter.rate(now) * demand.create_s)
        in_demand = demand.in_use + demand.creating + len(demand.queue)
        return max(self._elastic.min_warm, min(self._elastic.max_warm, demand.meter.peak(now) + spare - in_demand))

    def _can_warm(self, demand: _Demand) -> bool:
        """A background start never evicts: it only takes free slots."""
        free = self._starts < self.cfg.max_starting and self._live < self.cfg.max_sandboxes
        return free and not demand.paused

    def _warm(self, image: str) -> None:
        """A background start: handed to the head of its image's queue, or parked idle."""
        begun = time.monotonic()
        try:
            sandbox = self._create(self._spec(image))
        except Exception:  # no caller to raise to: the acquires that need one start their own
            log.warning("background sandbox start failed; no more until a start succeeds", exc_info=True)
            with self._cond:
                self._demand[image].warming -= 1
                self._demand[image].paused = True
                self._starts -= 1
            self._free_slot()
            return
        with self._cond:
            demand = self._demand[image]
            demand.warming -= 1
            demand.started(time.monotonic() - begun)
            self._starts -= 1
            self.stats.warmed += 1
            if not self._closed:
                self._park(image, sandbox)
                self._dispatch()
                self._cond.notify_all()
                return
        self.discard(sandbox)

    def _demand_of(self, image: str) -> _Demand:
        assert self._elastic is not None
        if image not in self._demand:
            self._demand[image] = _Demand(DemandMeter(self._elastic.window_s))
        return self._demand[image]

    # --- internals -----------------------------------------------------------------------
    def _spec(self, image: str, workspace: Path | None = None, labels: dict[str, str] | None = None) -> SandboxSpec:
        reusable = self._elastic is not None or self.cfg.warm_per_image > 0
        lifetime = self.cfg.warm_lifetime_s if reusable else None
        return SandboxSpec(
            image=image, workspace=workspace, limits=self.limits, labels=labels or {}, lifetime_s=lifetime
        )

    def _reusable(self, sandbox: Sandbox, workspace: Path | None) -> bool:
        """Ready a warm sandbox for its next holder: reset, if it is healthy and far enough from its deadline;
        else closed (False)."""
        if sandbox.deadline - time.time() < self.limits.episode_timeout_s:
            self.stats.retired += 1
            self.discard(sandbox)
            return False
        if not self._healthy(sandbox):
            self.stats.unhealthy += 1
            self.discard(sandbox)
            return False
        try:
            sandbox.reset(workspace)
        except SandboxError:
            self.discard(sandbox)
            return False
        return True

    def _park(self, image: str, sandbox: Sandbox) -> None:
        """Under the lock: keep ``sandbox`` idle for ``image``."""
        self._idle[image].append(sandbox)
        self._parked[id(sandbox)] = time.monotonic()

    def _unpark(self, image: str, index: int = -1) -> Sandbox:
        """Under the lock: take an idle sandbox of ``image`` (the newest unless told), counting its idle time."""
        sandbox = self._idle[image].pop(index)
        self.stats.idle_s += time.monotonic() - self._parked.pop(id(sandbox))
        return sandbox

    def _any_idle(self) -> Sandbox | None:
        """Under the lock: an idle sandbox of any image, to evict (its live slot passes to the evictor)."""
        image = next((image for image, group in self._idle.items() if group), None)
        return None if image is None else self._unpark(image)

    def _free_slot(self, returned: Sandbox | None = None) -> None:
        with self._cond:
            self._live -= 1
            if returned is not None:
                self._given_back(returned)
            self._dispatch()
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
