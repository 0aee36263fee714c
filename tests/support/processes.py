"""Waiting for a condition while a process the test started may die first, and stopping its group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen | None = None, timeout=300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"process exited ({process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def stop_group(process: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to the process group a process leads (``start_new_session``), then SIGKILL after ``timeout``."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
