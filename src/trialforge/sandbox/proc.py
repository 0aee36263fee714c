"""Run a host process with a deadline and bounded output capture.

A sandboxed command may print without end; we keep the first and last halves of
the cap and count what we dropped, so memory stays bounded whatever it does.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trialforge.sandbox.base import TRUNCATION_MARK


class _Capture:
    """Head and tail of a byte stream, at most ``cap`` bytes in all."""

    def __init__(self, cap: int) -> None:
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(len(self.tail) - self.half, 0)]

    def text(self) -> tuple[str, bool]:
        dropped = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", errors="replace")
        if dropped <= 0:
            return head + self.tail.decode("utf-8", errors="replace"), False
        return head + TRUNCATION_MARK.format(dropped=dropped) + self.tail.decode("utf-8", errors="replace"), True


@dataclass(frozen=True)
class ProcResult:
    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool
    truncated: bool


def run_capped(
    argv: Sequence[str],
    *,
    timeout: float,
    cap: int,
    env: dict[str, str],
    pass_fds: Sequence[int] = (),
    started: Callable[[subprocess.Popen], None] | None = None,
    kill: Callable[[subprocess.Popen], None] | None = None,
) -> ProcResult:
    """Run ``argv`` with exactly ``env`` (and ``pass_fds`` open) in its own process group, in ``/``.

    ``started(proc)`` runs once the process exists (the whole group dies if it raises). The
    whole group is killed at ``timeout`` seconds (by ``kill(proc)`` when given: a process that
    changed its uid is not ours to signal).
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd="/",
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )
    killer = kill or _kill_group
    if started is not None:
        try:
            started(proc)
        except BaseException:
            killer(proc)
            proc.communicate()
            raise
    captures = {proc.stdout: _Capture(cap), proc.stderr: _Capture(cap)}
    timed_out = _pump(proc, captures, deadline=start + timeout, kill=killer)
    returncode = proc.wait()
    out, out_cut = captures[proc.stdout].text()
    err, err_cut = captures[proc.stderr].text()
    return ProcResult(returncode, out, err, time.monotonic() - start, timed_out, out_cut or err_cut)


def _pump(proc: subprocess.Popen, captures: dict, *, deadline: float, kill: Callable[[subprocess.Popen], None]) -> bool:
    """Copy output into the captures until both pipes close; True when the deadline killed it."""
    sel = selectors.DefaultSelector()
    for stream in captures:
        sel.register(stream, selectors.EVENT_READ)
    timed_out = False
    while sel.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0 and not timed_out:
            timed_out = True
            kill(proc)
            deadline = time.monotonic() + 5  # drain what the dying group already wrote
            continue
        if remaining <= 0:
            break
        for key, _ in sel.select(timeout=min(remaining, 1.0)):
            chunk = os.read(key.fd, 65536)
            if chunk:
                captures[key.fileobj].feed(chunk)
            else:
                sel.unregister(key.fileobj)
    sel.close()
    for stream in captures:
        stream.close()
    return timed_out


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
