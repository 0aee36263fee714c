"""Warm capacity on a bursty load: acquire latency and idle sandbox-seconds of fixed pools against the elastic
pool, on the same backend and the same seeded load, in the same run.

    .venv/bin/python benchmarks/elastic_pool.py [--cycles 3] [--real-cycles 1] [--reps 20] [--seed 0]
                                                [--measure-podman]

The load has an RL run's shape. A rollout phase (``--busy-s``) brings bursts of acquires at exponential gaps
(mean ``--gap-s``): a batch's episodes starting together, 1 to ``--max-burst`` at once on the base image, or 1 to
half that on a task environment's image; each sandbox is held a lognormal time (median ``--hold-s``, sigma 0.5).
A quiet phase follows (``--quiet-s``: the training step), in which nothing is asked. Every pool sees the same
arrivals and holds (seeded), all pools side by side in one process, each over its own backend.

Pools: fixed with ``warm`` 0 (params.yaml's default: every acquire starts a sandbox), 2, and ``--max-burst`` (sized
for the biggest burst, prewarmed), and elastic (``min_warm`` 0, ``max_warm`` ``--max-burst``, ``--window-s``,
``--idle-s``). Per pool: acquire latency p50, p95 and max; idle sandbox-seconds (``PoolStats.idle_s``: time
sandboxes sat warm and unused, until the pool closed after the last quiet phase) against held ones; creates.

Backends: simulated with bubblewrap's lifecycle latencies measured at the start of this run (``--reps`` sandboxes
created, a command, a test run, a reset and a close each) and, side by side, simulated with a container engine's
(``simulated_sandbox.PODMAN_2CORE``, Podman measured the same way; ``--measure-podman`` measures it again
now); then real bubblewrap sandboxes, ``--real-cycles`` of the load.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from simulated_sandbox import PODMAN_2CORE, LatencyModel, Recorder, SimulatedBackend

from trialforge.sandbox.base import Backend, Limits, SandboxSpec
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
from trialforge.sandbox.pool import ElasticConfig, PoolConfig, SandboxPool

LIMITS = Limits(memory_mb=512, pids=128, disk_mb=64)
HOLD_SIGMA = 0.5
ENV_IMAGE = "env"  # a second image with smaller bursts: warm capacity is per image


@dataclass(frozen=True)
class Acquire:
    at_s: float  # after the load's start
    image: int  # 0: the base image, 1: a task environment's
    hold_s: float


@dataclass(frozen=True)
class Load:
    cycles: int
    busy_s: float
    quiet_s: float
    gap_s: float
    max_burst: int
    hold_s: float

    def acquires(self, seed: int) -> list[Acquire]:
        rng = random.Random(seed)
        out: list[Acquire] = []
        for cycle in range(self.cycles):
            start = cycle * (self.busy_s + self.quiet_s)
            at = start + rng.expovariate(1 / self.gap_s)
            while at < start + self.busy_s:
                image = rng.randrange(2)
                size = rng.randint(1, self.max_burst if image == 0 else max(1, self.max_burst // 2))
                out += [Acquire(at, image, rng.lognormvariate(math.log(self.hold_s), HOLD_SIGMA)) for _ in range(size)]
                at += rng.expovariate(1 / self.gap_s)
        return out

    @property
    def length_s(self) -> float:
        return self.cycles * (self.busy_s + self.quiet_s)


@dataclass
class Result:
    name: str
    latencies_ms: list[float]
    idle_s: float
    held_s: float
    created: int
    warmed: int


def pools(backend: Backend, max_burst: int, window_s: float, idle_s: float) -> dict[str, SandboxPool]:
    fixed = {f"fixed, warm {w}": PoolConfig(max_sandboxes=256, warm_per_image=w) for w in (0, 2, max_burst)}
    elastic = ElasticConfig(enabled=True, min_warm=0, max_warm=max_burst, window_s=window_s, idle_s=idle_s)
    configs = {**fixed, f"elastic 0..{max_burst}": PoolConfig(max_sandboxes=256, elastic=elastic)}
    return {name: SandboxPool(backend, LIMITS, cfg) for name, cfg in configs.items()}


def replay(pool: SandboxPool, load: Load, acquires: list[Acquire], images: tuple[str, str]) -> list[float]:
    """Play ``acquires`` against ``pool`` in real time (each at its moment, held, released) to the load's end;
    the acquire latencies in ms."""
    if not pool.cfg.elastic.enabled:
        for image in set(images):
            pool.prewarm(image)
    latencies: list[float] = []
    start = time.monotonic()

    def one(acquire: Acquire) -> None:
        time.sleep(max(0.0, start + acquire.at_s - time.monotonic()))
        begun = time.monotonic()
        sandbox = pool.acquire(images[acquire.image])
        latencies.append(1000 * (time.monotonic() - begun))
        time.sleep(acquire.hold_s)
        pool.release(sandbox, images[acquire.image])

    with ThreadPoolExecutor(len(acquires)) as threads:
        list(threads.map(one, acquires))
    time.sleep(max(0.0, start + load.length_s - time.monotonic()))  # the last quiet phase: warm ones still cost
    return latencies


def run(backend: Backend, images: tuple[str, str], load: Load, args: argparse.Namespace) -> list[Result]:
    """Every pool over ``backend``, side by side, on the same acquires."""
    acquires = load.acquires(args.seed)
    held = sum(a.hold_s for a in acquires)
    by_name = pools(backend, load.max_burst, args.window_s, args.idle_s)
    with ThreadPoolExecutor(len(by_name)) as side_by_side:
        futures = [side_by_side.submit(replay, pool, load, acquires, images) for pool in by_name.values()]
        latencies = [future.result() for future in futures]
    results = []
    for (name, pool), lat in zip(by_name.items(), latencies, strict=True):
        pool.close()  # counts the idle time of what was still warm
        results.append(Result(name, lat, pool.stats.idle_s, held, pool.stats.created, pool.stats.warmed))
    return results


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(title: str, results: list[Result], load: Load) -> None:
    count = len(results[0].latencies_ms)
    print(f"\n== {title}: {count} acquires in bursts over {load.length_s:.0f} s ({load.cycles} cycles)")
    print(f"{'pool':<16} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'idle s':>8} {'held s':>8} {'idle %':>7} "
          f"{'created':>8} {'ahead':>6}")  # fmt: skip
    for r in results:
        lat = r.latencies_ms
        share = 100 * r.idle_s / (r.idle_s + r.held_s)
        print(f"{r.name:<16} {pct(lat, 0.5):>8.1f} {pct(lat, 0.95):>8.1f} {max(lat):>8.1f} {r.idle_s:>8.1f} "
              f"{r.held_s:>8.1f} {share:>7.1f} {r.created:>8} {r.warmed:>6}")  # fmt: skip


def lifecycle(backend: Backend, image: str, workspace: Path, reps: int, what: str) -> LatencyModel:
    """Fit a backend's latencies from ``reps`` sandboxes: created, a command, a test run, a reset, closed."""
    recorder = Recorder(backend)
    spec = SandboxSpec(image=image, workspace=workspace, limits=LIMITS)
    for _ in range(reps):
        sandbox = recorder.create(spec)
        sandbox.exec(["ls", "-la"])
        sandbox.exec(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"])
        sandbox.reset(workspace)
        sandbox.close()
    return recorder.model(f"{what}, measured now: {reps} sandboxes")


@contextlib.contextmanager
def podman() -> Iterator[Backend]:
    """A Docker-API backend over a private Podman service (as ``benchmarks/sandbox.py`` starts one)."""
    from trialforge.sandbox.container.backend import DockerBackend
    from trialforge.sandbox.container.engine import PodmanService, engine_client

    with PodmanService() as service:
        backend = DockerBackend(engine_client(service.base_url), base_image())
        try:
            yield backend
        finally:
            backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=3, help="rollout + quiet cycles on the simulated backends")
    parser.add_argument("--real-cycles", type=int, default=1, help="cycles on real bubblewrap (0: none)")
    parser.add_argument("--busy-s", type=float, default=15.0)
    parser.add_argument("--quiet-s", type=float, default=20.0)
    parser.add_argument("--gap-s", type=float, default=1.5, help="mean gap between bursts in a rollout phase")
    parser.add_argument("--max-burst", type=int, default=8)
    parser.add_argument("--hold-s", type=float, default=3.0, help="median time a sandbox is held")
    parser.add_argument("--window-s", type=float, default=10.0, help="elastic: how long a burst is remembered")
    parser.add_argument("--idle-s", type=float, default=2.0, help="elastic: idle time before a surplus closes")
    parser.add_argument("--reps", type=int, default=20, help="sandboxes measured per real backend")
    parser.add_argument("--measure-podman", action="store_true", help="measure Podman now instead of PODMAN_2CORE")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sim = Load(args.cycles, args.busy_s, args.quiet_s, args.gap_s, args.max_burst, args.hold_s)
    real = Load(args.real_cycles, args.busy_s, args.quiet_s, args.gap_s, args.max_burst, args.hold_s)
    image = base_image()
    with tempfile.TemporaryDirectory(prefix="tf-bench-elastic-") as tmp:
        workspace = Path(tmp) / "seed"
        workspace.mkdir()
        (workspace / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
        bwrap = BwrapBackend(image)
        try:
            models = [lifecycle(bwrap, image.name, workspace, args.reps, "bubblewrap")]
            if args.measure_podman:
                with podman() as engine:
                    models.append(lifecycle(engine, image.name, workspace, args.reps, "Podman"))
            else:
                models.append(PODMAN_2CORE)
            for model in models:
                print(model.table())
            with ThreadPoolExecutor(len(models)) as side_by_side:  # sleeps, mostly: they share the CPU unharmed
                images = (image.name, ENV_IMAGE)
                runs = [
                    side_by_side.submit(run, SimulatedBackend(m, seed=args.seed), images, sim, args) for m in models
                ]
                for model, results in zip(models, [r.result() for r in runs], strict=True):
                    report(f"simulated, {model.source}", results, sim)
            if args.real_cycles:
                results = run(bwrap, (image.name, image.name), real, args)
                report("real bubblewrap (one image: both kinds of burst go to the base)", results, real)
        finally:
            bwrap.close()


if __name__ == "__main__":
    main()
