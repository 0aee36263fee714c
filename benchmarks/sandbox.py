"""Sandbox lifecycle costs per backend, and what pooling with snapshot reset saves per episode.

    .venv/bin/python benchmarks/sandbox.py [--reps 30] [--backends bwrap,docker] [--baseline REV]

Prints median and p95 (ms) of cold start, warm acquire, exec of `true`, snapshot,
restore, export and close; then a short "episode" (acquire, write a file, run a command,
release) done two ways in the same run: pooled with reset versus a fresh sandbox
per episode, and their ratio. For bwrap it also times, in the same run, `true` under
the bare bubblewrap command line the backend used before it was hardened (no account
switch, no seccomp, no /proc masks): what the confinement costs per command.

``--baseline REV`` compares with the code of git revision REV instead, in the same run: REV's
``src`` and ``images`` (``git archive``, nothing checked out) and this tree's are each timed in a
process of their own, alternately (``--rounds``), and the medians are printed side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trialforge.sandbox.base import Backend, Limits, SandboxSpec
from trialforge.sandbox.images import base_image
from trialforge.sandbox.pool import PoolConfig, SandboxPool

LIMITS = Limits(memory_mb=512, pids=128, disk_mb=64)
OPERATIONS = ("cold start", "warm acquire", "exec true", "snapshot", "restore", "export", "close")
REPO = Path(__file__).resolve().parents[1]


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
            from trialforge.sandbox.bwrap.backend import BwrapBackend

            backend = BwrapBackend(image)
            stack.callback(backend.close)
            found.append(("bwrap", backend))
        if "docker" in names:
            from trialforge.sandbox.container.backend import DockerBackend
            from trialforge.sandbox.container.engine import PodmanService, engine_client

            service = stack.enter_context(PodmanService())
            backend = DockerBackend(engine_client(service.base_url), image)
            stack.callback(backend.close)
            found.append(("docker", backend))
        yield found


def measure(name: str, backend: Backend, image: str, seed: Path, reps: int) -> dict[str, list[float]]:
    spec = SandboxSpec(image=image, workspace=seed, limits=LIMITS)
    out: dict[str, list[float]] = {k: [] for k in OPERATIONS}
    with tempfile.TemporaryDirectory() as exports:
        for rep in range(reps):
            ms, sandbox = timed(backend.create, spec)
            out["cold start"].append(ms)
            out["exec true"].append(timed(sandbox.exec, ["true"])[0])
            ms, snap = timed(sandbox.snapshot)
            out["snapshot"].append(ms)
            sandbox.write_file("scratch.txt", b"dirty")
            out["restore"].append(timed(sandbox.restore, snap)[0])
            out["export"].append(timed(sandbox.export_workspace, Path(exports) / str(rep))[0])
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


def make_seed(root: Path) -> Path:
    seed = root / "seed"
    for i in range(20):  # a task-sized workspace
        (seed / "pkg").mkdir(parents=True, exist_ok=True)
        (seed / "pkg" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    return seed


def worker(names: list[str], reps: int) -> None:
    """One side of a comparison: the samples of ``measure`` per backend, as JSON on stdout (the last line)."""
    with tempfile.TemporaryDirectory() as tmp, backends(names) as found:
        seed = make_seed(Path(tmp))
        samples = {name: measure(name, backend, base_image().name, seed, reps) for name, backend in found}
    print(json.dumps(samples))


def compare(baseline: str, names: list[str], reps: int, rounds: int) -> None:
    """Time REV's code and this tree's alternately, ``rounds`` times each, and print their medians side by side."""
    merged: dict[str, dict[str, dict[str, list[float]]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", baseline, "src", "images"], capture_output=True)
        if archive.returncode != 0:
            raise SystemExit(f"cannot read revision {baseline}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        sides = {"before": Path(tmp) / "src", "after": REPO / "src"}
        for _ in range(rounds):
            for side, src in sides.items():
                env = {**os.environ, "PYTHONPATH": str(src)}
                argv = [sys.executable, __file__, "--worker", "--reps", str(reps), "--backends", ",".join(names)]
                done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"the {side} side failed:\n{done.stderr[-3000:]}")
                for name, ops in json.loads(done.stdout.splitlines()[-1]).items():
                    for op, values in ops.items():
                        merged[side].setdefault(name, {}).setdefault(op, []).extend(values)
    for name in names:
        print(f"\n== {name}: {baseline} (before) against this tree (after), {reps * rounds} reps each, ms")
        print(f"{'operation':<14} {'before':>8} {'after':>8} {'change':>8}")
        for op in OPERATIONS:
            before, after = (statistics.median(merged[s][name].get(op) or [0.0]) for s in ("before", "after"))
            change = f"{(after - before) / before * 100:+7.1f}%" if before else "       -"
            print(f"{op:<14} {before:8.1f} {after:8.1f} {change}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--baseline", help="a git revision to compare with, timed in the same run")
    parser.add_argument("--rounds", type=int, default=3, help="with --baseline: alternations of the two sides")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.backends.split(","), args.reps)
    if args.baseline:
        return compare(args.baseline, args.backends.split(","), max(args.reps // args.rounds, 1), args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        seed = make_seed(Path(tmp))
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
