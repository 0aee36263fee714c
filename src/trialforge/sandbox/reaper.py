"""Leak protection for host-side sandboxes: a record per sandbox, and a reaper for what crashes leave.

Every bwrap sandbox writes ``record.json`` (owner pid and start time, deadline,
labels, cgroups, mounts) next to its workspace before it holds any resource.
The reaper removes sandboxes whose owner process is gone or whose deadline has
passed; the pool runs it at start, and ``trialforge reap`` runs it by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trialforge.sandbox import cgroups
from trialforge.sandbox.statedir import state_root


def _start_time(pid: int) -> str:
    """The kernel's start time of ``pid``: with the pid it identifies one process, even after pid reuse."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


@dataclass
class SandboxRecord:
    id: str
    backend: str
    owner_pid: int
    owner_start: str
    deadline: float
    labels: dict[str, str] = field(default_factory=dict)
    cgroups: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)

    @classmethod
    def for_current_process(
        cls, sandbox_id: str, *, backend: str, labels: dict[str, str], deadline: float
    ) -> SandboxRecord:
        pid = os.getpid()
        return cls(sandbox_id, backend, pid, _start_time(pid), deadline, dict(labels))

    def save(self, home: Path) -> None:
        tmp = home / "record.json.tmp"
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(home / "record.json")

    def owner_alive(self) -> bool:
        return _start_time(self.owner_pid) == self.owner_start != ""


def _release(record: SandboxRecord, home: Path) -> None:
    cgroups.SandboxCgroup(name=record.id, dirs=[Path(p) for p in record.cgroups], v1=True).remove()
    for mount in record.mounts:
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    shutil.rmtree(home, ignore_errors=True)


def reap(state_dir: Path | None = None, *, everything: bool = False) -> list[str]:
    """Remove abandoned sandboxes (owner dead or deadline passed; all of them with ``everything``).

    Returns the ids removed.
    """
    root = state_dir or state_root()
    removed: list[str] = []
    now = time.time()
    for home in sorted((root / "sandboxes").glob("tf-*")):
        try:
            record = SandboxRecord(**json.loads((home / "record.json").read_text()))
        except (OSError, ValueError, TypeError):
            try:
                if now - home.stat().st_mtime < 60:  # still being created by a live process
                    continue
            except FileNotFoundError:  # its owner closed it meanwhile
                continue
            shutil.rmtree(home, ignore_errors=True)
            removed.append(home.name)
            continue
        if everything or not record.owner_alive() or record.deadline < now:
            _release(record, home)
            removed.append(record.id)
    for snaps in (root / "snapshots").glob("*-*"):
        pid = int(snaps.name.split("-", 1)[0]) if snaps.name.split("-", 1)[0].isdigit() else -1
        if everything or not Path(f"/proc/{pid}").exists():
            shutil.rmtree(snaps, ignore_errors=True)
    return removed
