"""A backend whose sandboxes run nothing: every latency is drawn from a distribution fitted to a real backend.

For load and scale studies of what sits above the backend (the pool, the agent loop, the grader's host side,
the store writer) at sizes no test machine holds. What is real and what is drawn:

- files are real: a sandbox's /work is an in-memory tree (read, write, reset, export, snapshot and restore
  work as on any backend), so an episode's edit tools, checkpoints and final diff run for real;
- commands are not run: ``exec`` returns exit code 0 and no output after a drawn latency (``test`` for a
  test run, ``exec`` for any other command), or a timeout when the draw passes the command's limit. A graded
  run therefore brings back no report: the grader scores it 0 (``no_report``);
- create, reset and close take drawn latencies; the host-side copy of a workspace comes on top.

``Recorder`` wraps a real backend and records those latencies from real work; ``LatencyModel.fit`` turns them
into the lognormal distributions drawn here (maximum likelihood: the mean and spread of the logs).
``BWRAP_2CORE`` and ``PODMAN_2CORE`` are such fits, stored with how and when they were measured.

Draws are deterministic for a seed: sandbox n of a backend draws from its own generator, seeded by (seed, n),
so the same calls in the same order take the same times whatever other sandboxes do meanwhile.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import random
import statistics
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

from trialforge.errors import SandboxError
from trialforge.sandbox.base import WORKDIR, Backend, ExecResult, Sandbox, SandboxSpec
from trialforge.sandbox.images import Image

OPS = ("create", "reset", "exec", "test", "close")
TEST_PURPOSES = frozenset({"validate", "verify"})  # sandboxes started to run a task's tests
_SHORTEST_S = 1e-6  # a clock reading of 0 (coarse timers) still has a logarithm


def command_kind(argv: Sequence[str], *, test_sandbox: bool) -> str:
    """``test`` for a test run (pytest, or any command in a sandbox started to run tests), else ``exec``."""
    return "test" if test_sandbox or any("pytest" in arg for arg in argv) else "exec"


@dataclass(frozen=True)
class Lognormal:
    """A latency in seconds: log(latency) ~ Normal(mu, sigma)."""

    mu: float
    sigma: float
    samples: int  # how many measurements it was fitted to

    @classmethod
    def fit(cls, seconds: Sequence[float]) -> Lognormal:
        if len(seconds) < 2:
            raise ValueError(f"fitting a latency needs at least 2 measurements, got {len(seconds)}")
        logs = [math.log(max(s, _SHORTEST_S)) for s in seconds]
        return cls(statistics.fmean(logs), statistics.stdev(logs), len(logs))

    def draw(self, rng: random.Random) -> float:
        return rng.lognormvariate(self.mu, self.sigma)

    def quantile(self, q: float) -> float:
        return math.exp(self.mu + self.sigma * NormalDist().inv_cdf(q))

    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)


@dataclass(frozen=True)
class LatencyModel:
    """What each operation of a sandbox takes, and where the numbers come from."""

    create: Lognormal
    reset: Lognormal
    exec: Lognormal
    test: Lognormal
    close: Lognormal
    source: str

    @classmethod
    def fit(cls, samples: Mapping[str, Sequence[float]], source: str) -> LatencyModel:
        """One lognormal per operation, from ``samples`` (seconds, by operation: see ``OPS``)."""
        missing = [op for op in OPS if len(samples.get(op, ())) < 2]
        if missing:
            raise ValueError(f"too few measurements of {missing} to fit them: run more real work through a Recorder")
        return cls(**{op: Lognormal.fit(samples[op]) for op in OPS}, source=source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyModel:
        """The inverse of ``dataclasses.asdict``: a fit saved as JSON."""
        return cls(**{op: Lognormal(**data[op]) for op in OPS}, source=data["source"])

    def of(self, op: str) -> Lognormal:
        if op not in OPS:
            raise ValueError(f"no latency for {op!r}: one of {OPS}")
        return getattr(self, op)

    def table(self) -> str:
        lines = [f"latencies ({self.source})", f"{'op':<7} {'n':>5} {'median ms':>10} {'p95 ms':>9} {'mean ms':>9}"]
        for op in OPS:
            d = self.of(op)
            p50, p95, mean = (1000 * x for x in (d.quantile(0.5), d.quantile(0.95), d.mean()))
            lines.append(f"{op:<7} {d.samples:>5} {p50:>10.1f} {p95:>9.1f} {mean:>9.1f}")
        return "\n".join(lines)


# Fitted on 2026-12-05 on this project's 2-core VM (as root: tmpfs workspaces and cgroups), load average 0.4-0.6.
# Bubblewrap: `benchmarks/scale_sim.py --measure-only`: 4 bundled tasks validated and 16 episodes of its agent
# (grep, view, the gold edits, a note, pytest, submit) run and graded on real sandboxes.
BWRAP_2CORE = LatencyModel(
    create=Lognormal(-5.1165, 0.3056, 26),  # median 6.0 ms, p95 9.9 ms
    reset=Lognormal(-6.2996, 0.0949, 14),  # 1.8 ms
    exec=Lognormal(-3.8942, 0.3597, 16),  # 20.4 ms (grep)
    test=Lognormal(-1.3295, 0.1124, 40),  # 265 ms (validations, the agent's and the graded test runs)
    close=Lognormal(-5.4426, 0.5386, 26),  # 4.3 ms
    source="bubblewrap, stored fit of 2026-12-05 (2-core VM)",
)
# Podman 4.3 (crun, a private service) through the Docker API backend: `benchmarks/elastic_pool.py`'s lifecycle()
# over 30 containers, each created with a one-test workspace, `ls -la`, `pytest -q`, a reset, a close.
PODMAN_2CORE = LatencyModel(
    create=Lognormal(-2.0479, 0.3497, 30),  # median 129 ms, p95 229 ms
    reset=Lognormal(-2.7785, 0.2115, 30),  # 62 ms
    exec=Lognormal(-2.9041, 0.2690, 30),  # 55 ms
    test=Lognormal(-0.5997, 0.0572, 30),  # 549 ms (one test)
    close=Lognormal(-2.3787, 0.4402, 30),  # 93 ms
    source="Podman, stored fit of 2026-12-05 (2-core VM)",
)


@dataclass(frozen=True)
class SimulatedSnapshot:
    id: str
    files: dict[str, bytes]


class SimulatedBackend:
    """Sandboxes that run nothing, their latencies drawn from ``model`` (the module's docstring says what is real)."""

    name = "simulated"

    def __init__(self, model: LatencyModel, seed: int = 0, image: Image | None = None) -> None:
        self.model = model
        self.seed = seed
        self.image = image or Image("simulated", Path("/nonexistent"), Path("/nonexistent"), "sha256:" + "0" * 64)
        self._lock = threading.Lock()
        self._made = 0
        self.live: dict[str, SimulatedSandbox] = {}  # the sandboxes open now, by id
        self.peak_live = 0
        self.sandbox_s: dict[str, float] = defaultdict(float)  # closed sandboxes' lifetimes, by purpose label
        self.closed: dict[str, int] = defaultdict(int)  # closed sandboxes, by purpose label

    def image_for(self, name: str) -> Image:
        """Any name is an image here; the backend's own keeps its digest."""
        if not name or name == self.image.name:
            return self.image
        return replace(self.image, name=name, digest="sha256:" + hashlib.sha256(name.encode()).hexdigest())

    def create(self, spec: SandboxSpec) -> SimulatedSandbox:
        return self._start(spec, read_tree(spec.workspace) if spec.workspace is not None else {})

    def from_snapshot(self, snap: SimulatedSnapshot, spec: SandboxSpec) -> SimulatedSandbox:
        return self._start(spec, dict(snap.files))

    def release(self, snap: SimulatedSnapshot) -> None:
        """A snapshot is plain memory, dropped with its last reference."""

    def _start(self, spec: SandboxSpec, files: dict[str, bytes]) -> SimulatedSandbox:
        with self._lock:
            number = self._made
            self._made += 1
        rng = random.Random(f"{self.seed}:{number}")
        time.sleep(self.model.create.draw(rng))
        sandbox = SimulatedSandbox(self, spec, f"sim-{number}", rng, files)
        with self._lock:
            self.live[sandbox.id] = sandbox
            self.peak_live = max(self.peak_live, len(self.live))
        return sandbox

    def _closed(self, sandbox: SimulatedSandbox) -> None:
        with self._lock:
            del self.live[sandbox.id]
            self.sandbox_s[sandbox.purpose] += time.monotonic() - sandbox.opened
            self.closed[sandbox.purpose] += 1


class SimulatedSandbox:
    backend = "simulated"

    def __init__(
        self, owner: SimulatedBackend, spec: SandboxSpec, sandbox_id: str, rng: random.Random, files: dict[str, bytes]
    ) -> None:
        self.owner = owner
        self.id = sandbox_id
        self.limits = spec.limits
        self.image_digest = owner.image_for(spec.image).digest
        self.deadline = spec.deadline()
        self.purpose = spec.labels.get("purpose", "")
        self.opened = time.monotonic()
        self.closed = False
        self._rng = rng
        self._files = files

    def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str = WORKDIR,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        self._require_alive()
        limit = timeout if timeout is not None else self.limits.exec_timeout_s
        seconds = self._draw(command_kind(argv, test_sandbox=self.purpose in TEST_PURPOSES))
        if seconds > limit:
            time.sleep(limit)
            return ExecResult(exit_code=137, stdout="", stderr="", duration_s=limit, timed_out=True)
        time.sleep(seconds)
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=seconds)

    def read_file(self, path: str) -> bytes:
        key = self._key(path)
        try:
            return self._files[key]
        except KeyError:
            raise FileNotFoundError(f"{path}: No such file or directory") from None

    def write_file(self, path: str, data: bytes) -> None:
        self._files[self._key(path)] = bytes(data)

    def snapshot(self) -> SimulatedSnapshot:
        self._require_alive()
        return SimulatedSnapshot(uuid.uuid4().hex[:12], dict(self._files))

    def restore(self, snap: SimulatedSnapshot) -> None:
        self._require_alive()
        self._files = dict(snap.files)

    def reset(self, workspace: Path | None) -> None:
        self._require_alive()
        time.sleep(self._draw("reset"))
        self._files = read_tree(workspace) if workspace is not None else {}

    def alive(self) -> bool:
        return not self.closed

    def cpu_s(self) -> float | None:
        return None  # nothing runs here: the simulation measures the controller, not the sandboxes

    def export_workspace(self, dest: Path) -> None:
        self._require_alive()
        write_tree(self._files, dest)

    def close(self) -> None:
        if self.closed:
            return
        time.sleep(self._draw("close"))
        self.closed = True
        self.owner._closed(self)

    def _draw(self, op: str) -> float:
        return self.owner.model.of(op).draw(self._rng)

    def _require_alive(self) -> None:
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed", cause="closed")

    def _key(self, path: str) -> str:
        """The workspace-relative name of ``path``, refusing anything outside /work (as every backend does)."""
        self._require_alive()
        full = posixpath.normpath(posixpath.join(WORKDIR, path))
        if not full.startswith(WORKDIR + "/"):
            raise SandboxError(f"path {path!r} is outside {WORKDIR}", cause="path")
        return full[len(WORKDIR) + 1 :]


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by its relative path."""
    files = (p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in files}


def write_tree(files: Mapping[str, bytes], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


class Recorder:
    """A real backend, its sandboxes' latencies recorded by the operations a ``LatencyModel`` draws."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.samples: dict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()

    def image_for(self, name: str) -> Image:
        return self.inner.image_for(name)

    def create(self, spec: SandboxSpec) -> Sandbox:
        begun = time.perf_counter()
        sandbox = self.inner.create(spec)
        self.record("create", time.perf_counter() - begun)
        return _Recorded(sandbox, self, spec.labels.get("purpose", "") in TEST_PURPOSES)

    def from_snapshot(self, snap: Any, spec: SandboxSpec) -> Sandbox:
        return _Recorded(self.inner.from_snapshot(snap, spec), self, spec.labels.get("purpose", "") in TEST_PURPOSES)

    def release(self, snap: Any) -> None:
        self.inner.release(snap)

    def record(self, op: str, seconds: float) -> None:
        with self._lock:
            self.samples[op].append(seconds)

    def model(self, source: str) -> LatencyModel:
        return LatencyModel.fit(self.samples, source)


class _Recorded:
    """A real sandbox whose exec, reset and close are timed; everything else is the sandbox's own."""

    def __init__(self, inner: Sandbox, recorder: Recorder, test_sandbox: bool) -> None:
        self.inner = inner
        self.recorder = recorder
        self.test_sandbox = test_sandbox
        self.closed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def exec(self, argv: Sequence[str], **kwargs: Any) -> ExecResult:
        begun = time.perf_counter()
        result = self.inner.exec(argv, **kwargs)
        self.recorder.record(command_kind(argv, test_sandbox=self.test_sandbox), time.perf_counter() - begun)
        return result

    def reset(self, workspace: Path | None) -> None:
        begun = time.perf_counter()
        self.inner.reset(workspace)
        self.recorder.record("reset", time.perf_counter() - begun)

    def close(self) -> None:
        if self.closed:  # a second close costs nothing: no measurement
            return
        self.closed = True
        begun = time.perf_counter()
        self.inner.close()
        self.recorder.record("close", time.perf_counter() - begun)
