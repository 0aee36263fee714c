"""Sandboxes and backends that book the time spent in them: running commands apart from lifecycle.

``TimedBackend`` wraps any backend so that every sandbox it makes (the caller's own, or one a step it calls
makes) is a ``TimedSandbox``: ``exec`` counts as test time, creating, snapshotting, restoring, copying and
closing as sandbox time, summed over threads into one ``Timings``, with the CPU each sandbox used. Synthesis
reports where its time went with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from trialforge.sandbox.base import WORKDIR, Backend, ExecResult, Sandbox, SandboxSpec, Snapshot


@dataclass
class Timings:
    """Seconds spent, summed over workers: sandbox lifecycle, test execution, and the rest (ours)."""

    wall_s: float = 0.0
    busy_s: float = 0.0  # time inside the caller's units of work (synthesis: screen a candidate, make a task)
    sandbox_s: float = 0.0  # create / snapshot / restore / write / close
    tests_s: float = 0.0  # commands run in sandboxes (the test suite)
    sandbox_cpu_s: float = 0.0  # CPU used inside the sandboxes (each one's own counter, read as it closes)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + seconds)

    @contextmanager
    def measure(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    @property
    def ours_s(self) -> float:
        """Host-side work of the caller and of the steps it calls (synthesis: enumeration, diffs, statements)."""
        return max(self.busy_s - self.sandbox_s - self.tests_s, 0.0)

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in {
            "wall_s": self.wall_s, "busy_s": self.busy_s, "sandbox_s": self.sandbox_s,
            "tests_s": self.tests_s, "ours_s": self.ours_s, "sandbox_cpu_s": self.sandbox_cpu_s,
        }.items()}  # fmt: skip

    def merge(self, other: Timings) -> None:
        for name in ("wall_s", "busy_s", "sandbox_s", "tests_s", "sandbox_cpu_s"):
            self.add(name, getattr(other, name))


class TimedSandbox:
    """A sandbox that books its calls: ``exec`` as test time, everything else as sandbox lifecycle."""

    def __init__(self, inner: Sandbox, timings: Timings) -> None:
        self.inner = inner
        self.timings = timings
        self.image_digest = inner.image_digest
        self.backend = inner.backend
        self.deadline = inner.deadline

    def exec(self, argv: Sequence[str], *, timeout: float | None = None, cwd: str = WORKDIR,
             env: dict[str, str] | None = None) -> ExecResult:  # fmt: skip
        with self.timings.measure("tests_s"):
            return self.inner.exec(argv, timeout=timeout, cwd=cwd, env=env)

    def read_file(self, path: str) -> bytes:
        with self.timings.measure("sandbox_s"):
            return self.inner.read_file(path)

    def write_file(self, path: str, data: bytes) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.write_file(path, data)

    def snapshot(self) -> Snapshot:
        with self.timings.measure("sandbox_s"):
            return self.inner.snapshot()

    def restore(self, snap: Snapshot) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.restore(snap)

    def reset(self, workspace: Path | None) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.reset(workspace)

    def alive(self) -> bool:
        return self.inner.alive()

    def cpu_s(self) -> float | None:
        return self.inner.cpu_s()

    def export_workspace(self, dest: Path) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.export_workspace(dest)

    def close(self) -> None:
        self.timings.add("sandbox_cpu_s", self.inner.cpu_s() or 0.0)  # None: the backend cannot count it
        with self.timings.measure("sandbox_s"):
            self.inner.close()


class TimedBackend:
    """Wraps a backend so every sandbox it makes (ours or ``validate_task``'s) is timed the same way."""

    def __init__(self, inner: Backend, timings: Timings) -> None:
        self.inner = inner
        self.timings = timings
        self.name = inner.name
        self.image_for = inner.image_for

    def create(self, spec: SandboxSpec) -> TimedSandbox:
        with self.timings.measure("sandbox_s"):
            return TimedSandbox(self.inner.create(spec), self.timings)

    def from_snapshot(self, snap: Snapshot, spec: SandboxSpec) -> TimedSandbox:
        with self.timings.measure("sandbox_s"):
            return TimedSandbox(self.inner.from_snapshot(snap, spec), self.timings)

    def release(self, snap: Snapshot) -> None:
        with self.timings.measure("sandbox_s"):
            self.inner.release(snap)
