"""Processes a run starts on its own behalf (an inference server): recorded with their owner, stopped by reap.

The run starts such a process in a session of its own (its process group holds whatever it spawns) and
writes ``proc-<pgid>.json`` to the private state dir: its pid, start time and argv, and the owner's pid and
start time. A run that ends stops the group and removes the record. One killed with SIGKILL leaves both;
``reap`` finds records whose owner is gone and kills the group: while its leader runs (the same pid and
start time), or once the leader is gone while what it spawned lives on (Linux hands out no pid that is still
some group's id, so the group is still that one). A pid now held by another process means the group ended
and the pid was given out again: that process is left alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trialforge.owners import process_start, still_running
from trialforge.sandbox.host.statedir import check_private, private_dir, state_root

log = logging.getLogger(__name__)

STOP_S = 15.0  # how long a stopped group may take to exit before it is killed


@dataclass(frozen=True)
class OwnedProcess:
    pid: int  # the group's leader (its pgid)
    start: str
    argv: list[str]
    owner_pid: int
    owner_start: str

    def alive(self) -> bool:
        return still_running(self.pid, self.start)

    def owner_alive(self) -> bool:
        return still_running(self.owner_pid, self.owner_start)

    def reused(self) -> bool:
        """Another process holds the leader's pid now."""
        return Path(f"/proc/{self.pid}").exists() and not self.alive()


def record(pid: int, argv: list[str], state_dir: Path | None = None) -> Path:
    """Record process group ``pid`` (started with ``argv``) as this process's; returns the record's path."""
    root = private_dir(state_dir or state_root())
    me = os.getpid()
    entry = OwnedProcess(pid, process_start(pid), argv, me, process_start(me))
    path = root / f"proc-{pid}.json"
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(asdict(entry)))
    tmp.replace(path)
    return path


def stop_group(pid: int, timeout_s: float = STOP_S) -> None:
    """SIGTERM process group ``pid``, then SIGKILL it if it has not exited within ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            os.killpg(pid, 0)  # raises once no member is left
            time.sleep(0.05)  # poll interval while the group shuts down
        os.killpg(pid, signal.SIGKILL)


def reap_owned(state_dir: Path | None = None, *, everything: bool = False) -> list[str]:
    """Stop the recorded process groups whose owner is dead (all with ``everything``); returns what was stopped."""
    root = state_dir or state_root()
    paths = sorted(root.glob("proc-*.json")) if root.is_dir() else []
    if not paths:
        return []
    check_private(root)  # a record names a process group to kill: only our own may be trusted
    stopped: list[str] = []
    for path in paths:
        try:
            entry = OwnedProcess(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being written, or not ours to judge
        if entry.owner_alive() and not everything:
            continue
        if entry.reused():
            log.info("process group %d of %s is gone (its pid is another process's now)", entry.pid, entry.argv[0])
        elif _group_exists(entry.pid):
            stop_group(entry.pid)
            stopped.append(f"{Path(entry.argv[0]).name} {entry.pid}")
        path.unlink(missing_ok=True)
    return stopped


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
