"""An inference server the run starts itself (``train.inference.command``), kept up while the run lasts.

``serving(params)`` starts the command (``{model}``, ``{name}`` filled in) in a session of its own, waits until
``url`` answers ``GET /models`` and stops the whole process group when the run ends. A supervisor thread starts a
server that exited again, up to ``max_restarts`` times, with the latest full weights
(``train.served.current_full_weights``); lost adapters are loaded again by ``train.served.WeightSync``. The server
is this run's: one already answering at ``url`` is refused, its output goes to ``OUT_DIR/inference-server.log``, and
``trialforge reap`` (state dir) or the kernel's parent-death signal stops it after a kill -9.
Its life in detail: docs/inference-server.md, "Training through a server: `train.inference`".
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from trialforge.config import Params
from trialforge.errors import ConfigError
from trialforge.sandbox.host import owned
from trialforge.train.served import current_full_weights, weights_root
from trialforge.train.settings import InferenceParams

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
READY_POLL_S = 0.25  # how often a starting server is asked whether it answers
LOG_TAIL = 2000  # characters of the server's log quoted when it fails to start


@contextlib.contextmanager
def serving(params: Params) -> Iterator[ManagedServer | None]:
    """The run's inference server, started for the ``with`` block (None when ``train.inference.command`` is
    empty: no server, or one the user runs)."""
    spec = params.train.inference
    if not spec.command:
        yield None
        return
    out = Path(params.run.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    server = ManagedServer(
        spec, params.train.model, weights_root(params.train, params.run.out_dir), out / "inference-server.log"
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


class ManagedServer:
    def __init__(self, spec: InferenceParams, model: str, weights: Path, log_path: Path) -> None:
        self.spec = spec
        self.model = model
        self.name = spec.model_name or model  # what it serves the model under (train.served.WeightSync's base_name)
        self.weights = weights
        self.log_path = log_path
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._record: Path | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._supervise, name="inference-server", daemon=True)

    def start(self) -> None:
        """Start the server and return once it answers (``ConfigError`` with its log's tail if it never does)."""
        if _answers(self.spec):
            raise ConfigError(
                f"something already answers at {self.spec.url}: train.inference.command would start a second server "
                "there; stop it, or leave command empty to use it"
            )
        self._thread.start()  # it starts the process: the kernel's parent-death signal follows that thread
        self._started.wait()
        if self._failure is not None:
            self.stop()
            raise self._failure

    def stop(self) -> None:
        """Stop the server's whole process group and forget its record."""
        self._stopping.set()
        self._halt()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _supervise(self) -> None:
        try:
            self._launch()
        except BaseException as exc:
            self._failure = exc
            self._started.set()
            return
        self._started.set()
        while not self._stopping.is_set():
            assert self._proc is not None
            code = self._proc.wait()
            if self._stopping.is_set():
                return
            self._forget()
            if self.restarts >= self.spec.max_restarts:
                log.error("the inference server exited (%s) %d times: it stays down", code, self.restarts + 1)
                return
            self.restarts += 1
            log.warning("the inference server exited (%s); starting it again (restart %d)", code, self.restarts)
            try:
                self._launch()
            except Exception as exc:
                log.error("the inference server did not come back: %s", exc)
                return

    def _launch(self) -> None:
        serve = current_full_weights(self.weights) or self.model
        argv = [part.replace("{model}", serve).replace("{name}", self.name) for part in shlex.split(self.spec.command)]
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        self._record = owned.record(self._proc.pid, argv)
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while not _answers(self.spec):
            if self._proc.poll() is not None:
                self._halt()
                raise ConfigError(f"the inference server exited ({self._proc.returncode}) before it answered "
                                  f"at {self.spec.url}: {' '.join(argv)}\n{self._tail()}")  # fmt: skip
            if time.monotonic() > deadline or self._stopping.is_set():
                self._halt()
                raise ConfigError(f"the inference server did not answer at {self.spec.url} within "
                                  f"{self.spec.ready_timeout_s:g} s: {' '.join(argv)}\n{self._tail()}")  # fmt: skip
            time.sleep(READY_POLL_S)
        log.info("inference server %d answers at %s (%s)", self._proc.pid, self.spec.url, serve)

    def _halt(self) -> None:
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(owned.STOP_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # what it spawned and left behind, or itself if it hung
            proc.wait()
        self._forget()

    def _forget(self) -> None:
        if self._record is not None:
            self._record.unlink(missing_ok=True)
            self._record = None

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL:]
        except OSError:
            return ""


def _answers(spec: InferenceParams) -> bool:
    try:
        return httpx.get(f"{spec.url}/models", headers=spec.headers(), timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it dies (the whole run, after kill -9)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
