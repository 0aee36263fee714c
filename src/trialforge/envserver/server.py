"""Running the environment server: its hub built from params, uvicorn on a socket bound first (so port 0
works and the address is known before the first request), and an orderly end that leaves no sandbox behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from trialforge.config import EnvServerParams
from trialforge.envserver.app import make_app
from trialforge.envserver.sessions import EpisodeHub
from trialforge.errors import ConfigError
from trialforge.httpserve import bind, in_thread
from trialforge.pipeline import make_rollout, new_run_id
from trialforge.rollout.loop import Lineage
from trialforge.runtime import Runtime, code_version
from trialforge.sandbox.host.statedir import state_root
from trialforge.tasks.envimages import obtain_images
from trialforge.tasks.schema import Task, task_set_version
from trialforge.tasks.taskset import TASKS, read_published, read_tasks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Address:
    url: str
    token: str
    run_id: str  # the partition its episodes are written under (datasets/episodes/run=RUN_ID)
    tasks: int  # served
    token_file: str  # where a generated token was written ("": it came from the environment)


def served_tasks(rt: Runtime) -> tuple[str, list[Task]]:
    """``env_server.tasks``: a Parquet task set, a curated version in the store, or ("") the latest curated one."""
    ref = rt.params.env_server.tasks
    if ref.endswith(".parquet"):
        tasks = read_tasks(Path(ref))
        return task_set_version(tasks), tasks
    return read_published(rt.store, TASKS, ref or None)


def open_hub(rt: Runtime, version: str, tasks: list[Task], run_id: str) -> EpisodeHub:
    """A hub over ``tasks`` with the run's sandboxes, grader and store; its episodes are iteration 0 of ``run_id``."""
    sp = rt.params.env_server
    lineage = Lineage(run_id, 0, version, rt.params.digest(), code_version())
    hub = EpisodeHub(make_rollout(rt, lineage), tasks, rt.store, sp)  # it keeps the servable ones
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
    sock = bind(sp.host, sp.port, "the environment server listens on %s, beyond this machine: keep its token secret")
    app = make_app(hub, token, sp.max_body_kb * 1024)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    try:
        with in_thread(config, sock, "environment server") as url:
            yield Address(url, token, run_id, len(hub.tasks), token_file)
    finally:
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
