"""Session fixtures: real services started once per test session, and a check that nothing leaks."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The session's Ray cluster (ray_fixture) takes only this token: its ports listen on every interface. Ray reads
# the token once, when first imported, so it is set here, before anything imports ray.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny tensors: torch's thread pool only adds contention on 2 cores
os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest_plugins = [
    "support.s3_server",
    "support.engine_fixture",
    "support.chat_server",
    "support.prefect_server",
    "support.ray_fixture",
    "support.leaks",
    "support.normal_user",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
# Tests that act on or count what is host-wide: `trialforge reap` (it removes any dead owner's leftovers, a killed
# child of a test on another worker included) and counts of every slirp4netns on the host. Under pytest-xdist
# they run on one worker, one after another (pytest_xdist_make_scheduler below).
HOST_WIDE = pytest.mark.xdist_group("host-wide")


@pytest.fixture(scope="session")
def base_image():
    from trialforge.sandbox.images import base_image as build

    return build()


@pytest.fixture(scope="session")
def state_dir() -> Iterator[Path]:
    """Sandboxes of this session live here, so the leak check sees only ours: the session's state dir
    (``support.leaks.session_root``), or, in a pytest-xdist worker, a dir of the worker's own inside it.

    Not under pytest's private temp root: as root, sandboxes run as the sandbox account,
    which must be able to traverse the way to its workspace (the state dir is 0710).
    """
    from support.leaks import session_root

    from trialforge.sandbox.host.statedir import private_dir

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    path = private_dir(session_root() / worker if worker else session_root())
    os.environ["TRIALFORGE_STATE_DIR"] = str(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def bwrap_backend(base_image, state_dir):
    from trialforge.sandbox.bwrap.backend import BwrapBackend

    backend = BwrapBackend(base_image, state_dir=state_dir)
    yield backend
    backend.close()


@pytest.fixture(scope="session", autouse=True)
def no_leaked_sandboxes(state_dir):
    """After the whole session, no bwrap sandbox may remain (each test closes what it opens)."""
    yield
    left = sorted(p.name for p in (state_dir / "sandboxes").glob("tf-*"))
    from trialforge.sandbox.host.reaper import reap

    reap(state_dir, everything=True)
    assert not left, f"sandboxes leaked by the test session: {left}"


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A 2-layer GPT-2 with random weights and a byte-level tokenizer (256 bytes + end of text), saved to disk.

    Torch runs single-threaded meanwhile: on two busy cores its spinning worker threads make these tiny
    models' operations tens of times slower than one thread.
    """
    pytest.importorskip("transformers", reason="transformers is not installed in this environment")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    from support.tiny_models import byte_level_gpt2

    path = tmp_path_factory.mktemp("tiny-lm")
    model, tokenizer = byte_level_gpt2(path)
    yield path, model, tokenizer
    torch.set_num_threads(threads)


# --- what each test needs: pure, sandbox or services (docs/testing.md) ---------------------------------------------

KINDS = ("pure", "sandbox", "services")
# Fixtures that decide a marker: a test using one must carry it. The Podman engine makes a test slow: the
# session's engine takes about a minute to start, import the base image and stop on two busy cores.
IMPLIED_BY = {
    "sandbox": {"base_image", "bwrap_backend", "container_engine", "docker_client", "docker_backend", "normal_user"},
    "services": {"s3_server", "s3_store", "prefect_server_process", "prefect_api", "prefect_env", "ray_cluster"},
    "slow": {"container_engine"},
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is held to it, whatever runs
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test without a true kind marker (or without the slow mark its fixtures imply) fails collection: a new
    test cannot skip being classified."""
    wrong = [f"  {item.nodeid}: {why}" for item in items if (why := kind_error(item))]
    if wrong:
        raise pytest.UsageError(
            "\n".join(["tests must carry the markers of what they need (docs/testing.md):", *wrong])
        )
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _write_groups(items)


def kind_error(item: pytest.Item) -> str:
    marks = {mark.name for mark in item.iter_markers()}
    kinds = marks & set(KINDS)
    if not kinds:
        return "no kind marker"
    if "pure" in kinds and len(kinds) > 1:
        return f"marked pure and {' and '.join(sorted(kinds - {'pure'}))}"
    used = set(getattr(item, "fixturenames", ()))
    for mark, fixtures in IMPLIED_BY.items():
        if mark not in marks and used & fixtures:
            return f"uses {', '.join(sorted(used & fixtures))} but is not marked {mark}"
    return ""


# --- parallel runs: pytest-xdist (make test runs `-n 2 --dist loadfile`, docs/testing.md) ---------------------------
# xdist's own `loadgroup` marks a test's group in its node id, which pytest 9 no longer lets a plugin change; so each
# worker writes the groups it collected into the session's state dir, and the controller's scheduler reads them.


def _write_groups(items: list[pytest.Item]) -> None:
    from support.leaks import session_root

    from trialforge.sandbox.host.statedir import private_dir

    groups = {item.nodeid: mark.args[0] for item in items if (mark := item.get_closest_marker("xdist_group"))}
    part = private_dir(session_root()) / f"groups-{os.environ['PYTEST_XDIST_WORKER']}.part"
    part.write_text(json.dumps(groups))
    part.replace(part.with_suffix(".json"))


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, where a file is the unit of work (a module's fixtures, a whole pipeline run, are made
    once, on one worker), except that the tests of an ``xdist_group`` (``HOST_WIDE``) are one unit of their own:
    they run on one worker, one after another."""
    if config.getvalue("dist") != "loadfile":
        return None
    from support.leaks import session_root
    from xdist.scheduler import LoadFileScheduling

    class FileOrGroup(LoadFileScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker has collected (and written its groups) before scheduling starts
                self.groups = {}
                for written in sorted(session_root().glob("groups-*.json")):
                    self.groups |= json.loads(written.read_text())
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return FileOrGroup(config, log)
