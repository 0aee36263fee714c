"""Sandbox lifecycle costs per backend, and what pooling with snapshot reset saves per episode.

    .venv/bin/python benchmarks/sandbox.py [--reps 30] [--backends bwrap,docker]

Prints median and p95 (ms) of cold start, warm acquire, exec of `true`, snapshot,
restore and close; then a short "episode" (acquire, write a file, run a command,
release) done two ways in the same run: pooled with reset versus a fresh sandbox
per episode, and their ratio. For bwrap it also times, in the same run, `true` under
the bare bubblewrap command line the backend used before it was hardened (no account
switch, no seccomp, no /proc masks): what the confinement costs per command.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trialforge.sandbox.base import Backend, Limits, SandboxSpec
from trialforge.sandbox.images import base_image
from trialforge.sandbox.pool import PoolConfig, SandboxPool

LIMITS = Limits(memory_mb=512, pids=128, disk_mb=64)


def timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """(milliseconds, result) of one call."""
    start = time.perf_counter()
    result = fn(*args)
    return (time.perf_counter() - start) * 1000, result


def stats(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):8.1f} {p95:8.1f}"


@contextlib.contextmanager
def backends(names: list[str]) -> Iterator[list[tuple[str, Backend]]]:
    image = base_image()
    with contextlib.ExitStack() as stack:
        found: list[tuple[str, Backend]] = []
        if "bwrap" in names:
            from trialforge.sandbox.bwrap import BwrapBackend

            backend = BwrapBackend(image)
            stack.callback(backend.close)
            found.append(("bwrap", backend))
        if "docker" in names:
            from trialforge.sandbox.docker import DockerBackend
            from trialforge.sandbox.engine import PodmanService, engine_client

            service = stack.enter_context(PodmanService())
            backend = DockerBackend(engine_client(service.base_url), image)
            stack.callback(backend.close)
            found.append(("docker", backend))
        yield found


def measure(name: str, backend: Backend, image: str, seed: Path, reps: int) -> dict[str, list[float]]:
    spec = SandboxSpec(image=image, workspace=seed, limits=LIMITS)
    out: dict[str, list[float]] = {
        k: [] for k in ("cold start", "warm acquire", "exec true", "snapshot", "restore", "close")
    }
    for _ in range(reps):
        ms, sandbox = timed(backend.create, spec)
        out["cold start"].append(ms)
        out["exec true"].append(timed(sandbox.exec, ["true"])[0])
        ms, snap = timed(sandbox.snapshot)
        out["snapshot"].append(ms)
        sandbox.write_file("scratch.txt", b"dirty")
        out["restore"].append(timed(sandbox.restore, snap)[0])
        backend.release(snap)
        out["close"].append(timed(sandbox.close)[0])
    pool = SandboxPool(backend, LIMITS, PoolConfig(warm_per_image=1))
    pool.prewarm(image, 1)
    for _ in range(reps):
        ms, sandbox = timed(pool.acquire, image, seed)
        out["warm acquire"].append(ms)
        pool.release(sandbox, image)
    pool.close()
    return out


def unhardened_exec(rootfs: Path, workspace: Path, reps: int) -> list[float]:
    """ms of `true` under the pre-hardening command line (a baseline only: trialforge never runs it)."""
    argv = [
        "bwrap", "--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL",
        "--die-with-parent", "--new-session", "--clearenv", "--ro-bind", str(rootfs), "/",
        "--bind", str(workspace), "/work", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--", "true",
    ]  # fmt: skip
    return [timed(subprocess.run, argv)[0] for _ in range(reps)]


def episode_ratio(backend: Backend, image: str, seed: Path, reps: int) -> tuple[float, float]:
    """Mean ms of one short episode: pooled with reset, and a fresh sandbox each time."""

    def work(sandbox) -> None:
        sandbox.write_file("edit.py", b"x = 1\n")
        sandbox.exec(["python3", "-c", "import edit"])

    pool = SandboxPool(backend, LIMITS, PoolConfig(warm_per_image=1))
    pool.prewarm(image, 1)

    def pooled() -> None:
        with pool.sandbox(image, seed) as sandbox:
            work(sandbox)

    def naive() -> None:
        sandbox = backend.create(SandboxSpec(image=image, workspace=seed, limits=LIMITS))
        try:
            work(sandbox)
        finally:
            sandbox.close()

    pooled_ms = statistics.mean(timed(pooled)[0] for _ in range(reps))
    naive_ms = statistics.mean(timed(naive)[0] for _ in range(reps))
    pool.close()
    return pooled_ms, naive_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--backends", default="bwrap,docker")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        seed = Path(tmp) / "seed"
        for i in range(20):  # a task-sized workspace
            (seed / "pkg").mkdir(parents=True, exist_ok=True)
            (seed / "pkg" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
        with backends(args.backends.split(",")) as found:
            for name, backend in found:
                image = base_image().name
                print(f"\n== {name}  ({args.reps} reps; ms)")
                print(f"{'operation':<14} {'median':>8} {'p95':>8}")
                for op, samples in measure(name, backend, image, seed, args.reps).items():
                    print(f"{op:<14} {stats(samples)}")
                if name == "bwrap":
                    bare = unhardened_exec(base_image().rootfs, Path(tmp), args.reps)
                    print(f"{'exec, bare':<14} {stats(bare)}   (unhardened baseline, same run)")
                pooled, naive = episode_ratio(backend, image, seed, args.reps)
                print(f"episode, pooled + reset : {pooled:8.1f} ms")
                print(f"episode, fresh sandbox  : {naive:8.1f} ms")
                print(f"pooled / fresh          : {pooled / naive:8.2f}  ({naive / pooled:.1f}x faster pooled)")


if __name__ == "__main__":
    main()
