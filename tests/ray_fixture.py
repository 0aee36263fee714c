"""A local Ray instance for the test session, on loopback, without dashboard or usage stats.

Registered from conftest.py with ``pytest_plugins = ["ray_fixture"]``. It starts after ``state_dir``:
Ray workers inherit this process's environment when Ray starts, so the sandboxes they open live where
the session's leak check looks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_local(state_dir) -> Iterator[None]:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray

    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        yield
    finally:
        ray.shutdown()
