"""A two-node Ray cluster for the test session: a head and a worker node, each a ``ray start --block`` in a
session (and process group) of its own, the way a real cluster's nodes are separate machines.

Registered from conftest.py with ``pytest_plugins = ["support.ray_fixture"]``. It starts after ``state_dir``: Ray
workers inherit their raylet's environment, not the driver's, so the nodes start with this process's
environment and the session's state dir, and the sandboxes their workers open live where the session's
leak check looks.

- Each node has a loopback address of its own (``127.0.0.2``, ``127.0.0.3``): Ray turns ``127.0.0.1`` into
  the host's outward address, and two addresses tell the nodes apart. Ray's gRPC servers still listen on every
  interface (Ray has no setting for that), so the cluster requires the session's token (``RAY_AUTH_TOKEN``,
  set by conftest.py before anything imports ray): nobody else on the host can submit work to it.
- One CPU per node (two shards run at once, one per node), a small object store, no dashboard, no usage stats;
  every node's files under one scratch dir of this session.
- Teardown: the driver disconnects, each ``ray start`` stops its node (no drain: nothing to hand over), its
  process group is killed, and no process of either node may be left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.prefect_server import free_port
from trialforge.scratch import scratch_dir

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
OBJECT_STORE_BYTES = 100 * 1024**2  # Ray's minimum is 75 MiB; the default (30% of memory) is for real machines
START_TIMEOUT_S = 180.0  # two cores shared with other test sessions: a node starts in 5-10 s when idle


@dataclass(frozen=True)
class RayNode:
    ip: str
    leader: int  # pid of its ``ray start --block``: the session of every process of the node (raylet, workers)
    node_id: str


@dataclass(frozen=True)
class RayCluster:
    address: str  # the head's GCS, as ``ray.init`` and the flows' ``ray_address`` take it
    nodes: dict[str, RayNode]  # by Ray node id

    def node_running(self, pid: int) -> RayNode | None:
        """The node whose processes include ``pid`` now; None for another process (this driver, say)."""
        try:
            session = os.getsid(pid)
        except ProcessLookupError:
            return None
        return next((node for node in self.nodes.values() if node.leader == session), None)


@pytest.fixture(scope="session")
def ray_cluster(state_dir: Path) -> Iterator[RayCluster]:
    import ray

    port = free_port()
    address = f"{HEAD_IP}:{port}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {
        "TRIALFORGE_STATE_DIR": str(state_dir),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # SIGTERM stops a node at once (a drain waits 30 s)
    }
    head_args = ["--head", f"--port={port}", "--include-dashboard=false", f"--ray-client-server-port={free_port()}"]
    with scratch_dir("ray") as scratch, contextlib.ExitStack() as stack:
        root = Path(scratch)
        head = stack.enter_context(ray_node(HEAD_IP, root / "head", env, head_args))
        started = root / "head" / "ray_current_cluster"  # written once the node is up
        wait_until(started.exists, "the head node to start", head, root / "head.log")
        worker = stack.enter_context(ray_node(WORKER_IP, root / "worker", env, [f"--address={address}"]))
        ray.init(address=address, _node_ip_address=HEAD_IP)
        stack.callback(ray.shutdown)

        def alive() -> dict[str, str]:
            return {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}

        wait_until(lambda: len(alive()) == 2, "both nodes to be alive", worker, root / "worker.log")
        leaders = {HEAD_IP: head.pid, WORKER_IP: worker.pid}
        nodes = {node_id: RayNode(ip, leaders[ip], node_id) for ip, node_id in alive().items()}
        yield RayCluster(address, nodes)


@contextlib.contextmanager
def ray_node(ip: str, temp_dir: Path, env: dict[str, str], role: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """``ray start --block`` of one node, in a new session; stopped, with everything it started, on exit."""
    argv = [str(Path(sys.executable).parent / "ray"), "start", "--block", *role, f"--node-ip-address={ip}"]
    argv += ["--num-cpus=1", f"--object-store-memory={OBJECT_STORE_BYTES}", f"--temp-dir={temp_dir}"]
    argv += [f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"]  # its default is one fixed port
    temp_dir.mkdir()
    with (temp_dir.parent / f"{temp_dir.name}.log").open("wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        process.terminate()  # ``ray start`` stops its node's processes on SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever outlived it (workers still exiting, a stuck node)
        process.wait()
        left = node_processes(process.pid, temp_dir)
        deadline = time.monotonic() + 30  # SIGKILLed processes are gone once the kernel has torn them down
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = node_processes(process.pid, temp_dir)
        assert not left, f"ray node {ip} left processes behind: {left}"


def node_processes(session: int, temp_dir: Path) -> list[str]:
    """Live processes of a node: in its session, or naming its temp dir (``pgrep -s SESSION; pgrep -f DIR``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        state, _ppid, _pgrp, sid = stat.rsplit(")", 1)[1].split()[:4]
        if state != "Z" and (int(sid) == session or str(temp_dir) in argv):  # a zombie holds nothing
            found.append(f"{proc.name} {argv[:200]}")
    return found


def wait_until(condition: Callable[[], bool], what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            ended = f"exited ({process.returncode})" if process.returncode is not None else "timed out"
            tail = log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{' '.join(map(str, process.args))} {ended} before {what}:\n{tail}")
        time.sleep(0.1)
