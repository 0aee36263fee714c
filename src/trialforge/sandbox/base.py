"""The sandbox protocol every backend implements.

A sandbox is an isolated Linux environment with the task workspace at
``/work``. Backends differ in *where* it lives (bubblewrap, a container
engine); what callers can do in it is this small protocol.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trialforge.section import Section

if TYPE_CHECKING:
    from trialforge.sandbox.images import Image

WORKDIR = "/work"
# The whole environment of a sandboxed command (nothing is inherited from the host); callers may add keys.
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
TRUNCATION_MARK = "\n[... output truncated by trialforge: {dropped} bytes dropped ...]\n"


class Limits(Section):
    """Resource bounds applied to every sandbox: params.yaml's ``sandbox`` section is these and more
    (``sandbox.settings.SandboxParams`` derives from this class)."""

    cpus: float = 1.0
    memory_mb: int = 1024
    pids: int = 256
    disk_mb: int = 256
    exec_timeout_s: float = 60.0
    episode_timeout_s: float = 600.0
    output_cap_bytes: int = 64 * 1024
    network: bool = False


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    oom: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class SandboxSpec:
    """What to start: an image rootfs plus a directory seeded into /work."""

    image: str
    workspace: Path | None = None
    limits: Limits = field(default_factory=Limits)
    labels: dict[str, str] = field(default_factory=dict)
    # How long it may live before a reaper may remove it; None: one episode. A pool that keeps
    # sandboxes warm asks for longer, and retires each one before it could outlive its deadline.
    lifetime_s: float | None = None

    def deadline(self) -> float:
        """Epoch seconds after which the sandbox counts as abandoned (its owner crashed or hung)."""
        return time.time() + (self.lifetime_s if self.lifetime_s is not None else self.limits.episode_timeout_s)


class Snapshot(Protocol):
    """Opaque handle to a saved sandbox state, restorable in the same backend."""

    id: str


class Sandbox(Protocol):
    image_digest: str
    backend: str
    deadline: float  # epoch seconds: past it, a reaper may remove the sandbox

    def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str = WORKDIR,
        env: dict[str, str] | None = None,
    ) -> ExecResult: ...

    def read_file(self, path: str) -> bytes: ...

    def write_file(self, path: str, data: bytes) -> None: ...

    def snapshot(self) -> Snapshot: ...

    def restore(self, snap: Snapshot) -> None: ...

    def reset(self, workspace: Path | None) -> None:
        """Make /work hold exactly the host directory ``workspace`` (empty when None): reuse by a pool."""
        ...

    def alive(self) -> bool:
        """A cheap health check (no command run): the sandbox still exists and can take commands."""
        ...

    def export_workspace(self, dest: Path) -> None:
        """Copy the current /work tree into the host directory ``dest``."""
        ...

    def cpu_s(self) -> float | None:
        """CPU seconds used so far by everything that ran in the sandbox, read where its code cannot write (its
        cgroup's counter, the engine's stats); None where it cannot be measured. Callers take differences."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str

    def image_for(self, name: str) -> Image:
        """The built image called ``name`` ("": the backend's default); a SandboxError when it is not built."""
        ...

    def create(self, spec: SandboxSpec) -> Sandbox: ...

    def from_snapshot(self, snap: Snapshot, spec: SandboxSpec) -> Sandbox:
        """A new sandbox starting from ``snap`` (a snapshot taken in this backend): the fork of a group."""
        ...

    def release(self, snap: Snapshot) -> None:
        """Drop a snapshot nobody needs any more."""
        ...
