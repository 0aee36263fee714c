"""Env server: the curated tasks as online environments for external trainers, for ``duration_s`` seconds.

A deployment of it (prefect.yaml: env-server) runs the server on a worker; trainers reach it at the address of
``env_server.host``/``port`` with the token in ``$TRIALFORGE_ENV_TOKEN`` (docs/env-server.md).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from prefect import flow

from trialforge.config import load_params
from trialforge.envserver.server import served_tasks, serving
from trialforge.runtime import open_runtime


@flow(name="env-server", log_prints=True)
def env_server(
    duration_s: float = 3600.0, params_path: str = "params.yaml", overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Serve for ``duration_s`` seconds, then end the live episodes and write every episode; returns where they are."""
    params = load_params(Path(params_path), overrides)
    with open_runtime(params) as rt:
        version, tasks = served_tasks(rt)
        with serving(rt, version, tasks) as address:
            print(f"serving {address.tasks} tasks of {version} at {address.url}; episodes: run {address.run_id}")
            threading.Event().wait(duration_s)
    return {"url": address.url, "run_id": address.run_id, "task_set": version, "tasks": address.tasks}
