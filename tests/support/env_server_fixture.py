"""An environment server over bundled tasks, as `trialforge serve env` runs it: real runtime, real bubblewrap
sandboxes, uvicorn on 127.0.0.1 (a free port), a bearer token from the environment."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from support.worlds import bundled_world
from trialforge.config import load_params
from trialforge.envserver.server import serving
from trialforge.runtime import open_runtime

TOKEN_ENV = "TRIALFORGE_TEST_ENV_TOKEN"


def live(server: SimpleNamespace) -> int:
    """Episodes the server is running now (its health route)."""
    return httpx.get(f"{server.url}/health").json()["live"]


@contextlib.contextmanager
def serve_bundled(
    root: Path,
    backend: Any,
    task_ids: tuple[str, ...] = ("ledgerlite-3",),
    params: dict[str, Any] | None = None,
    **env_server: Any,
) -> Iterator[SimpleNamespace]:
    """The server, with ``env_server`` params (and other ``params``) over the defaults; yields url, token, tasks,
    store, run_id."""
    world = bundled_world(root, backend, task_ids)
    token = secrets.token_urlsafe(24)
    overrides = {
        "run.store": f"file://{root / 'store'}",
        "env_server": {"port": 0, "token_env": TOKEN_ENV, **env_server},
        **(params or {}),
    }
    old = os.environ.get(TOKEN_ENV)
    os.environ[TOKEN_ENV] = token
    try:
        with open_runtime(load_params(None, overrides)) as rt, serving(rt, "bundled", world.tasks) as address:
            yield SimpleNamespace(
                url=address.url, token=token, tasks=world.tasks, store=rt.store, run_id=address.run_id, rt=rt, root=root
            )
    finally:
        if old is None:
            os.environ.pop(TOKEN_ENV, None)
        else:
            os.environ[TOKEN_ENV] = old
