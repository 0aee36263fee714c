"""The elastic pool: warm capacity follows each image's bursts within min..max, falls back when idle, never passes
max_sandboxes, and leaves nothing behind on close; the simulated backend behind it (files real, latencies drawn,
the same draws for the same seed); the params door.

Waits are on conditions, never on the clock: every assertion holds however loaded the machine is.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from simulated_sandbox import LatencyModel, Lognormal, SimulatedBackend
from support.processes import wait_for

from trialforge.config import load_params
from trialforge.errors import ConfigError, SandboxError
from trialforge.runtime import open_runtime
from trialforge.sandbox.base import Limits, Sandbox
from trialforge.sandbox.pool import DemandMeter, ElasticConfig, PoolConfig, SandboxPool

LIMITS = Limits(memory_mb=256, pids=64, disk_mb=16, exec_timeout_s=20)
QUICK = Lognormal(-9.0, 0.1, 0)  # ~0.1 ms: sleeps that cost the tests nothing
FAST = LatencyModel(QUICK, QUICK, QUICK, QUICK, QUICK, source="tests: ~0.1 ms each, not a measurement")
SLOW_START = LatencyModel(Lognormal(-3.0, 0.1, 0), QUICK, QUICK, QUICK, QUICK, source="tests: ~50 ms starts")


def elastic_pool(backend, max_sandboxes: int = 32, **elastic) -> SandboxPool:
    return SandboxPool(
        backend, LIMITS, PoolConfig(max_sandboxes=max_sandboxes, elastic=ElasticConfig(enabled=True, **elastic))
    )


def burst(pool: SandboxPool, image: str, n: int) -> list[Sandbox]:
    """``n`` acquires of ``image`` at once, all held."""
    with ThreadPoolExecutor(n) as threads:
        return [f.result(timeout=120) for f in [threads.submit(pool.acquire, image) for _ in range(n)]]


class Gated(SimulatedBackend):
    """Its starts wait for the gate: a burst's acquires have all arrived before any sandbox starts, as on a busy
    engine, whatever the machine's load."""

    def __init__(self) -> None:
        super().__init__(FAST)
        self.gate = threading.Event()

    def create(self, spec):
        self.gate.wait()
        return super().create(spec)


def gated_burst(pool: SandboxPool, backend: Gated, bursts: dict[str, int]) -> list[tuple[str, Sandbox]]:
    """All of ``bursts`` (image -> acquires) queued at once, then let through; every sandbox held."""
    backend.gate.clear()
    with ThreadPoolExecutor(sum(bursts.values())) as threads:
        futures = [(image, threads.submit(pool.acquire, image)) for image, n in bursts.items() for _ in range(n)]
        wait_for(lambda: all(pool.waiting(image) == n for image, n in bursts.items()), "the whole burst to wait")
        backend.gate.set()
        return [(image, future.result(timeout=120)) for image, future in futures]


def pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("pool-elastic", "pool-warm"))]


# --- the demand it follows ----------------------------------------------------------------------------------------
@pytest.mark.pure
def test_demand_is_the_peak_in_use_plus_waiting_over_the_window_and_is_forgotten_after_it():
    meter = DemandMeter(window_s=10.0)
    for t, in_demand in ((0.0, 1), (0.1, 2), (0.2, 5), (3.0, 3)):  # in use plus waiting, at each arrival
        meter.arrive(t, in_demand)
    assert meter.peak(3.0) == 5 and meter.rate(3.0) == pytest.approx(0.4)
    assert meter.peak(10.1) == 5 and meter.expires() == pytest.approx(10.1)
    assert meter.peak(10.5) == 3 and meter.rate(10.5) == pytest.approx(0.1)  # the burst left the window
    assert meter.peak(13.5) == 0 and meter.rate(13.5) == 0 and meter.expires() is None


# --- scaling --------------------------------------------------------------------------------------------------
@pytest.mark.pure
def test_warm_capacity_follows_the_peak_backlog_and_serves_the_next_burst_warm():
    backend = Gated()
    pool = elastic_pool(backend, max_warm=8, idle_s=0)
    try:
        for image, sandbox in gated_burst(pool, backend, {"a": 5}):
            pool.release(sandbox, image)
        # Five were in demand at once, plus one for the acquires expected while a sandbox starts (Little's law).
        wait_for(lambda: len(backend.live) == 6, "the peak demand kept warm, and one spare")
        before = pool.stats.reused
        again = burst(pool, "a", 5)
        assert pool.stats.reused == before + 5  # the next burst of five starts warm
        for sandbox in again:
            pool.release(sandbox, "a")
    finally:
        pool.close()
    assert not backend.live


@pytest.mark.pure
def test_warm_capacity_never_passes_max_warm():
    backend = Gated()
    pool = elastic_pool(backend, max_warm=3, idle_s=0)
    try:
        held = gated_burst(pool, backend, {"a": 6})
        wait_for(lambda: len(backend.live) == 7, "one spare started ahead of the six held")
        for image, sandbox in held:
            pool.release(sandbox, image)
        wait_for(lambda: len(backend.live) == 3, "max_warm idle: the released ones beyond it closed")
    finally:
        pool.close()
    assert backend.peak_live == 7 and not backend.live


@pytest.mark.pure
def test_idle_sandboxes_fall_back_to_min_warm_once_the_burst_leaves_the_window():
    backend = SimulatedBackend(FAST)
    pool = elastic_pool(backend, min_warm=1, max_warm=4, window_s=0.05, idle_s=0)
    try:
        for sandbox in burst(pool, "a", 4):
            pool.release(sandbox, "a")
        wait_for(lambda: len(backend.live) == 1, "the pool to scale down to min_warm")
        assert pool.stats.scaled_down >= 3
        before = pool.stats.reused
        with pool.sandbox("a"):
            pass
        assert pool.stats.reused == before + 1  # the one kept is warm
    finally:
        pool.close()
    assert not backend.live


@pytest.mark.pure
def test_min_warm_is_kept_warm_ahead_of_any_demand_per_image():
    backend = SimulatedBackend(FAST)
    pool = elastic_pool(backend, min_warm=2, max_warm=4)
    try:
        first = pool.acquire("a")  # the image is known from now on
        wait_for(lambda: len(backend.live) == 3, "two warm sandboxes beside the one held")
        two = burst(pool, "a", 2)
        assert pool.stats.reused == 2
        for sandbox in [first, *two]:
            pool.release(sandbox, "a")
    finally:
        pool.close()
    assert not backend.live


@pytest.mark.pure
def test_each_image_keeps_the_warm_capacity_of_its_own_bursts():
    backend = Gated()
    pool = elastic_pool(backend, max_warm=4, idle_s=0)
    try:
        for image, sandbox in gated_burst(pool, backend, {"a": 4, "b": 1}):
            pool.release(sandbox, image)
        digests = {backend.image_for(image).digest: image for image in "ab"}
        live = lambda: sorted(digests[s.image_digest] for s in list(backend.live.values()))  # noqa: E731
        # a: its peak of four, max_warm; b: its peak of one and a spare.
        wait_for(lambda: live() == ["a", "a", "a", "a", "b", "b"], "four warm for image a, two for image b")
    finally:
        pool.close()
    assert not backend.live


@pytest.mark.pure
def test_traffic_over_two_images_never_holds_more_than_max_sandboxes():
    backend = SimulatedBackend(FAST, seed=3)
    pool = elastic_pool(backend, max_sandboxes=4, min_warm=4, max_warm=8, idle_s=0)

    def episodes(worker: int) -> int:
        image = "ab"[worker % 2]
        for _ in range(5):
            with pool.sandbox(image) as sandbox:
                sandbox.exec(["true"])
        return worker

    try:
        with ThreadPoolExecutor(8) as threads:
            done = [f.result(timeout=120) for f in [threads.submit(episodes, w) for w in range(8)]]
    finally:
        pool.close()
    assert sorted(done) == list(range(8))
    assert backend.peak_live == 4  # min_warm asks for eight per image; max_sandboxes holds
    assert not backend.live


# --- closing --------------------------------------------------------------------------------------------------
@pytest.mark.pure
def test_close_answers_a_queued_acquire_stops_its_threads_and_leaves_no_sandbox():
    backend = SimulatedBackend(SLOW_START)
    pool = elastic_pool(backend, max_sandboxes=1, min_warm=1)
    held = pool.acquire("a")
    with ThreadPoolExecutor(1) as threads:
        waiting = threads.submit(pool.acquire, "a")  # no room: it queues (or finds the pool closed)
        pool.close()
        with pytest.raises(SandboxError) as err:
            waiting.result(timeout=120)
    assert err.value.cause == "closed"
    pool.release(held, "a")  # given back after close: closed, not kept
    assert not backend.live and not pool_threads()


@pytest.mark.pure
def test_close_with_warm_starts_in_flight_closes_them_when_they_land():
    backend = SimulatedBackend(SLOW_START)
    pool = elastic_pool(backend, min_warm=4, max_warm=4)
    with pool.sandbox("a"):
        pass  # the image is known: four warm starts begin
    pool.close()
    assert not backend.live and not pool_threads()
    with pytest.raises(SandboxError, match="closed"):
        pool.acquire("a")


# --- the simulated backend ------------------------------------------------------------------------------------
@pytest.mark.pure
def test_the_simulated_backend_draws_the_same_latencies_for_the_same_seed(tmp_path):
    def draws(seed: int) -> list[float]:
        backend = SimulatedBackend(FAST, seed=seed)
        out = []
        for _ in range(3):
            sandbox = backend.create(_spec(tmp_path))
            out += [sandbox.exec(["true"]).duration_s, sandbox.exec(["python3", "-m", "pytest"]).duration_s]
            sandbox.close()
        return out

    assert draws(0) == draws(0)
    assert draws(0) != draws(1)


@pytest.mark.pure
def test_the_simulated_sandbox_holds_real_files_and_refuses_paths_outside_work(tmp_path):
    seed = tmp_path / "seed"
    (seed / "pkg").mkdir(parents=True)
    (seed / "pkg" / "mod.py").write_text("x = 1\n")
    backend = SimulatedBackend(FAST)
    sandbox = backend.create(_spec(seed))
    assert sandbox.read_file("pkg/mod.py") == b"x = 1\n"
    snap = sandbox.snapshot()
    sandbox.write_file("pkg/new.py", b"y = 2\n")
    sandbox.export_workspace(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "pkg").iterdir()) == ["mod.py", "new.py"]
    sandbox.restore(snap)
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("pkg/new.py")
    with pytest.raises(SandboxError) as err:
        sandbox.write_file("../etc/passwd", b"")
    assert err.value.cause == "path"
    sandbox.reset(None)
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("pkg/mod.py")
    sandbox.close()
    assert not backend.live and not sandbox.alive()


@pytest.mark.pure
def test_a_latency_model_is_fitted_to_measurements_and_refuses_too_few():
    samples = {op: [0.01, 0.02, 0.04] for op in ("create", "reset", "exec", "test", "close")}
    model = LatencyModel.fit(samples, source="three samples each")
    assert model.create.samples == 3 and model.create.quantile(0.5) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="test"):
        LatencyModel.fit({**samples, "test": [0.3]}, source="one test run")


# --- over real sandboxes --------------------------------------------------------------------------------------
@pytest.mark.sandbox
def test_an_elastic_pool_of_bubblewrap_sandboxes_reuses_them_with_a_clean_workspace(
    bwrap_backend, base_image, tmp_path
):
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "task.txt").write_text("base\n")
    image = base_image.name
    pool = SandboxPool(
        bwrap_backend, LIMITS, PoolConfig(max_sandboxes=8, elastic=ElasticConfig(enabled=True, max_warm=3, idle_s=3600))
    )
    try:
        first = burst(pool, image, 3)
        for sandbox in first:
            sandbox.write_file("junk.txt", b"left over")
            pool.release(sandbox, image)
        reused = pool.stats.reused
        with ThreadPoolExecutor(3) as threads:
            listings = list(threads.map(lambda _: _listing(pool, image, seed), range(3)))
        assert pool.stats.reused == reused + 3  # the second burst started warm
        assert listings == ["task.txt\n"] * 3
    finally:
        pool.close()
    assert not list((bwrap_backend.state_dir / "sandboxes").glob("tf-*"))


def _listing(pool: SandboxPool, image: str, seed: Path) -> str:
    with pool.sandbox(image, seed) as sandbox:
        return sandbox.exec(["ls"]).stdout


def _spec(workspace: Path):
    from trialforge.sandbox.base import SandboxSpec

    return SandboxSpec(image="a", workspace=workspace, limits=LIMITS)


# --- params ---------------------------------------------------------------------------------------------------
@pytest.mark.pure
def test_elastic_params_are_checked_and_never_change_a_runs_digest():
    on = load_params(None, {"sandbox.elastic": {"enabled": True, "min_warm": 2, "max_warm": 6}})
    assert on.sandbox.elastic == ElasticConfig(enabled=True, min_warm=2, max_warm=6)
    assert not load_params(None).sandbox.elastic.enabled  # off by default: a fixed pool
    assert on.digest() == load_params(None).digest()
    for bad in ({"min_warm": 5, "max_warm": 2}, {"max_warm": 0}, {"window_s": 0}, {"idle_s": -1}):
        with pytest.raises(ConfigError, match=r"sandbox\.elastic"):
            load_params(None, {"sandbox.elastic": bad})


@pytest.mark.sandbox
def test_the_runtime_builds_its_pool_from_sandbox_elastic(tmp_path):
    overrides = {"run.store": f"file://{tmp_path / 'store'}", "sandbox.elastic": {"enabled": True, "max_warm": 5}}
    with open_runtime(load_params(None, overrides)) as rt:
        assert rt.pool.cfg.elastic == ElasticConfig(enabled=True, max_warm=5)
        assert pool_threads()
    assert not pool_threads()
