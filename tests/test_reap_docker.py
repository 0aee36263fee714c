"""kill -9 of a process that owns a docker-backend run: ``trialforge reap`` leaves nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
from conftest import HOST_WIDE

from trialforge.owners import process_start
from trialforge.sandbox.container.backend import LABEL_SANDBOX
from trialforge.sandbox.container.engine import API_VERSION, temp_dir
from trialforge.sandbox.host.leftovers import cmdline

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

OWNER = """
import sys
from trialforge.sandbox.base import SandboxSpec
from trialforge.sandbox.container.backend import DockerBackend
from trialforge.sandbox.container.engine import PodmanService
from trialforge.sandbox.images import base_image

service = PodmanService(use_docker_host=False)
service.start()
print(service.base_url, flush=True)
backend = DockerBackend(service.client(), base_image(build=False))
sandboxes = [backend.create(SandboxSpec(image="")) for _ in range(2)]
print(" ".join(sb.id for sb in sandboxes), flush=True)
sandboxes[0].exec(sys.argv[1].split(), timeout=400)
"""


@HOST_WIDE
@pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman")
def test_kill_9_of_a_docker_run_owner_then_reap_leaves_no_container_volume_service_or_state(state_dir, base_image):
    tag = f"sleep 300.{os.getpid()}{time.monotonic_ns() % 10**6}"
    env = {**os.environ, "TRIALFORGE_STATE_DIR": str(state_dir)}
    env.pop("DOCKER_HOST", None)
    child = subprocess.Popen([sys.executable, "-c", OWNER, tag], stdout=subprocess.PIPE, text=True, env=env)
    url = child.stdout.readline().strip()
    ids = child.stdout.readline().split()
    assert url.startswith("unix://") and len(ids) == 2
    for _ in range(1000):  # until the long command runs inside the first sandbox
        if _pids_withcmdline(tag):
            break
        time.sleep(0.01)
    assert _pids_withcmdline(tag), "the sandboxed command never started"
    service_dirs = [p for p in state_dir.glob("podman-*") if f'"owner_pid": {child.pid},' in _read(p / "service.json")]
    assert len(service_dirs) == 1
    engine_tmp = temp_dir(service_dirs[0])
    assert engine_tmp.is_dir()  # the service's TMPDIR: where Podman leaves the uploads of image imports
    service = json.loads(_read(service_dirs[0] / "service.json"))
    child.send_signal(signal.SIGKILL)
    child.wait()

    client = docker.DockerClient(base_url=url, version=API_VERSION, timeout=30)
    left = client.api.containers(all=True, filters={"label": LABEL_SANDBOX})
    assert {c["Names"][0].lstrip("/") for c in left} >= set(ids), "the kill should have left them (the bug)"
    full_ids = [c["Id"] for c in left if c["Names"][0].lstrip("/") in ids]
    client.close()

    trialforge = Path(sys.executable).with_name("trialforge")
    done = subprocess.run([str(trialforge), "reap"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 containers" in done.stdout and "1 podman services" in done.stdout, done.stdout
    assert "podman-" in done.stdout and all(i in done.stdout for i in ids), done.stdout

    assert not _pids_withcmdline(tag)
    assert process_start(service["service_pid"]) != service["service_start"], "the Podman service still runs"
    assert not [p for p in state_dir.glob("podman-*") if p in service_dirs]
    assert not engine_tmp.exists()
    socket_path = url.removeprefix("unix://")
    assert not Path(socket_path).exists()
    listed = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={LABEL_SANDBOX}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
        env={**env, "CONTAINERS_CONF": str(Path(__file__).resolve().parents[1] / "images/podman/containers.conf")},
    ).stdout.split()
    assert not set(ids) & set(listed)
    volumes = subprocess.run(
        ["podman", "volume", "ls", "--filter", f"label={LABEL_SANDBOX}", "--format", "{{.Labels}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert not [i for i in ids if i in volumes]
    assert not [pid for pid in _pids_withcmdline("conmon") if any(i in cmdline(pid) for i in ids)]
    mounts = Path("/proc/self/mounts").read_text()
    assert not [cid for cid in full_ids if cid in mounts], "the containers' storage is still mounted"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _pids_withcmdline(needle: str) -> list[str]:
    return [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and needle in cmdline(p.name)]
