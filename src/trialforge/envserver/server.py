"""Running the environment server: its hub built from params, uvicorn on a socket bound first (so port 0
works and the address is known before the first request), and an orderly end that leaves no sandbox behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from trialforge.config import EnvServerParams
from trialforge.envserver.app import make_app
from trialforge.envserver.sessions import EpisodeHub, HubConfig
from trialforge.errors import ConfigError
from trialforge.orchestrate.shards import TASKS, read_taskset
from trialforge.pipeline import make_rollout, new_run_id
from trialforge.rollout.loop import Lineage
from trialforge.runtime import Runtime, code_version
from trialforge.sandbox.statedir import state_root
from trialforge.tasks.envimages import obtain_images
from trialforge.tasks.schema import Task, task_set_version
from trialforge.tasks.taskset import read_tasks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Address:
    url: str
    token: str
    run_id: str  # the partition its episodes are written under (datasets/episodes/run=RUN_ID)
    tasks: int  # served
    token_file: str  # where a generated token was written ("": it came from the environment)


def hub_config(sp: EnvServerParams) -> HubConfig:
    return HubConfig(
        max_live=sp.max_live,
        idle_timeout_s=sp.idle_timeout_s,
        verdict_ttl_s=sp.verdict_ttl_s,
        splits=tuple(sp.splits),
        flush_every=sp.flush_every,
    )


def served_tasks(rt: Runtime) -> tuple[str, list[Task]]:
    """``env_server.tasks``: a Parquet task set, a curated version in the store, or ("") the latest curated one."""
    ref = rt.params.env_server.tasks
    if ref.endswith(".parquet"):
        tasks = read_tasks(Path(ref))
        return task_set_version(tasks), tasks
    return read_taskset(rt.store, TASKS, ref or None)


def open_hub(rt: Runtime, version: str, tasks: list[Task], run_id: str) -> EpisodeHub:
    """A hub over ``tasks`` with the run's sandboxes, grader and store; its episodes are iteration 0 of ``run_id``."""
    sp = rt.params.env_server
    lineage = Lineage(run_id, 0, version, rt.params.digest(), code_version())
    hub = EpisodeHub(make_rollout(rt, lineage), tasks, rt.store, hub_config(sp))  # it keeps the servable ones
    if not hub.tasks:
        raise ConfigError(f"no valid task in splits {sp.splits} among the {len(tasks)} given: nothing to serve")
    obtain_images(rt.store, list(hub.tasks.values()))
    return hub


def bearer_token(sp: EnvServerParams) -> tuple[str, Path | None]:
    """The token from ``$TOKEN_ENV``; else a new one, written to a file only this user can read (its path
    returned, never the token in a log)."""
    if token := os.environ.get(sp.token_env, ""):
        if len(token) < 16:
            raise ConfigError(f"${sp.token_env} holds a token of {len(token)} characters; use 16 or more")
        return token, None
    token = secrets.token_urlsafe(32)
    path = state_root() / "env-server.token"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token, path


@contextlib.contextmanager
def running(hub: EpisodeHub, sp: EnvServerParams, token: str, run_id: str, token_file: str = "") -> Iterator[Address]:
    """The server, serving in a thread of this process until the block ends; then every live episode is
    ended, its sandbox released and every ended episode written."""
    sock = _bind(sp.host, sp.port)
    host, port = sock.getsockname()[:2]
    app = make_app(hub, token, sp.max_body_kb * 1024)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="env-server", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise ConfigError(f"the environment server did not start on {host}:{port} (its log says why)")
            thread.join(timeout=0.05)
        shown = f"[{host}]" if ":" in host else host
        yield Address(f"http://{shown}:{port}", token, run_id, len(hub.tasks), token_file)
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
        hub.shutdown()


@contextlib.contextmanager
def serving(rt: Runtime, version: str, tasks: list[Task]) -> Iterator[Address]:
    """The server of ``rt.params.env_server`` over ``tasks`` (task set ``version``), while the block runs."""
    sp = rt.params.env_server
    run_id = new_run_id(f"{rt.params.run.name}-env")
    token, token_file = bearer_token(sp)
    hub = open_hub(rt, version, tasks, run_id)
    with running(hub, sp, token, run_id, str(token_file or "")) as address:
        log.info("environment server at %s: %d tasks; episodes go to run %s", address.url, address.tasks, run_id)
        yield address


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if not _loopback(host):
        log.warning("the environment server listens on %s, beyond this machine: keep its token secret", host)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: an answer written in two parts is not held back ~40 ms by Nagle's
    # algorithm waiting on the client's delayed ACK (measured: 45 ms of a 69 ms step without it).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.listen(256)
    sock.set_inheritable(False)
    return sock


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
