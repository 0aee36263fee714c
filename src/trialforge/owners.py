"""Who owns a leftover: a process, named by its pid and the kernel's start time of it (pid reuse changes that).

Scratch dirs, sandbox records, Podman services and inference servers are named for their owner this way, so
``trialforge reap`` can tell a live owner's from a dead one's.
"""

from __future__ import annotations

from pathlib import Path


def process_start(pid: int) -> str:
    """The kernel's start time of ``pid``: with the pid it identifies one process, even after pid reuse."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def still_running(pid: int, start: str) -> bool:
    """``pid`` is still the process that started at ``start`` (as ``process_start`` gave it): not dead, not reused."""
    return process_start(pid) == start != ""
