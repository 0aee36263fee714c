"""A real Prefect server (`prefect server start`) on 127.0.0.1 for the test session.

Registered from conftest.py with ``pytest_plugins = ["support.prefect_server"]``. SQLite and PREFECT_HOME live in
a temporary directory, analytics are off. ``prefect_server`` yields the API URL; ``prefect_env`` is the
environment a subprocess needs to use it; ``prefect_api`` points this process at it while a test runs.
The benchmarks start one the same way (``PrefectServer``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrefectServer:
    """``prefect server start --host 127.0.0.1 --port P`` with its state under ``home``."""

    def __init__(self, home: Path, port: int = 0) -> None:
        self.home = home
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: this server's API, and the same PREFECT_HOME (result storage)."""
        return {
            "PREFECT_API_URL": self.api_url,
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1",
        }

    def start(self, timeout: float = 180.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | self.env
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{self.home / 'prefect.db'}"
        argv = [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--analytics-off", "--no-ui"]
        log = (self.home / "server.log").open("wb")
        self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.home / "server.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"prefect server on port {self.port} did not become healthy:\n{tail}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture(scope="session")
def prefect_server_process(tmp_path_factory) -> Iterator[PrefectServer]:
    server = PrefectServer(tmp_path_factory.mktemp("prefect-home"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def prefect_server(prefect_server_process: PrefectServer) -> str:
    """The API URL of a Prefect server that lives as long as the session."""
    return prefect_server_process.api_url


@pytest.fixture(scope="session")
def prefect_env(prefect_server_process: PrefectServer) -> dict[str, str]:
    """The environment of a subprocess that uses the session's server (and its PREFECT_HOME)."""
    return {**os.environ, **prefect_server_process.env}


@pytest.fixture(scope="module")
def prefect_api(prefect_server_process: PrefectServer) -> Iterator[str]:
    """Point this process's Prefect at the session's server (and its PREFECT_HOME) for a test module."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(
        {PREFECT_API_URL: prefect_server_process.api_url, PREFECT_HOME: prefect_server_process.home}
    ):
        yield prefect_server_process.api_url
