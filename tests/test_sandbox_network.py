"""bwrap sandboxes with ``network: true``: a user-mode stack of their own (slirp4netns), never the host's.

Loopback only: no test sends traffic off this machine. The host-side server binds 127.0.0.1.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import HOST_WIDE
from support.normal_user import running

from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.bwrap import usernet

pytestmark = [pytest.mark.sandbox, HOST_WIDE]  # its networked sandboxes count every slirp4netns

LIMITS = Limits(memory_mb=256, pids=64, disk_mb=16, exec_timeout_s=20, output_cap_bytes=16384)
NETWORKED = Limits(**{**vars(LIMITS), "network": True})

needs_slirp = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("slirp4netns") is None,
    reason="sandbox network on bwrap needs root and slirp4netns (scripts/setup-system.sh)",
)


@pytest.fixture
def host_server():
    """A TCP server on the host's loopback that records whether anyone connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    reached: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            reached.append(conn.getpeername())
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], reached
    stop.set()
    thread.join()
    server.close()


def _probe(sandbox, port: int):
    code = textwrap.dedent(
        f"""
        import socket
        for host in ('127.0.0.1', '10.0.2.2'):  # its own loopback; slirp's alias of the host's
            try:
                socket.create_connection((host, {port}), timeout=3).close()
                print('reached', host)
            except OSError as exc:
                print('refused', host, exc.strerror or exc)
        for line in open('/proc/net/dev').read().splitlines()[2:]:
            print('interface', line.split(':')[0].strip())
        """
    )
    return sandbox.exec(["python3", "-c", code])


def _slirps() -> set[int]:
    """Live slirp4netns processes (a zombie holds nothing: it waits only for its parent to collect it)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
            if name == "slirp4netns" and state != "Z":
                found.add(int(proc.name))
    return found


@needs_slirp
def test_network_gives_an_interface_of_its_own_but_not_the_hosts_loopback(bwrap_backend, base_image, host_server):
    port, reached = host_server
    before = _slirps()
    sb = bwrap_backend.create(SandboxSpec(image=base_image.name, limits=NETWORKED))
    try:
        result = _probe(sb, port)
        resolv = sb.exec(["cat", "/etc/resolv.conf"]).stdout
    finally:
        sb.close()
    assert result.exit_code == 0, result.stderr
    interfaces = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("interface")}
    assert interfaces == {"lo", "tap0"}
    assert "reached" not in result.stdout, result.stdout
    assert sum(line.startswith("refused") for line in result.stdout.splitlines()) == 2
    assert reached == []
    assert resolv == "nameserver 10.0.2.3\n"
    assert _slirps() <= before, "a slirp4netns outlived its command"


def test_without_network_there_is_only_loopback(bwrap_backend, base_image, host_server):
    port, reached = host_server
    sb = bwrap_backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    try:
        result = _probe(sb, port)
    finally:
        sb.close()
    interfaces = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("interface")}
    assert interfaces == {"lo"}
    assert "reached" not in result.stdout and reached == []


REFUSAL = """
from trialforge.errors import SandboxError
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
backend = BwrapBackend(base_image(build=False))
try:
    backend.create(SandboxSpec(image="", limits=Limits(network=True)))
except SandboxError as exc:
    print(exc.cause, "needs trialforge to run as root" in str(exc))
finally:
    backend.close()
"""


def test_network_is_refused_with_the_reason_when_not_root(normal_user, delegated_cgroup):
    """As a normal user (one this suite makes, with its own delegated cgroup), network is refused, saying why."""
    done = normal_user.run(REFUSAL, cgroup=delegated_cgroup, timeout=120)
    assert done.stdout.split() == ["network", "True"], done.stderr[-3000:]


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
def backend(request, bwrap_backend):
    if request.param == "bwrap" and (os.geteuid() != 0 or shutil.which("slirp4netns") is None):
        pytest.skip("sandbox network on bwrap needs root and slirp4netns (scripts/setup-system.sh)")
    return bwrap_backend if request.param == "bwrap" else request.getfixturevalue("docker_backend")


def test_slirp4netns_holds_no_host_privilege(backend, base_image):
    """A slirp4netns bug must not be a root foothold: it runs as an unprivileged host uid (the sandbox's own, or the
    container's first subordinate one), with no capability in the host's user namespace."""
    before = _slirps()
    tag = f"sleep 30.{secrets.randbelow(10**8)}"
    sb = backend.create(SandboxSpec(image=base_image.name, limits=NETWORKED))
    command = threading.Thread(target=lambda: sb.exec(tag.split(), timeout=3))
    try:
        command.start()
        for _ in range(1000):  # until the command runs, its network attached
            if running(tag) and _slirps() - before:
                break
            time.sleep(0.01)
        slirps = {pid: _identity(pid) for pid in _slirps() - before}
    finally:
        command.join()
        sb.close()
    assert slirps, "no slirp4netns served the sandbox"
    host_userns = os.readlink("/proc/self/ns/user")
    for pid, (uid, capabilities, userns) in slirps.items():
        assert uid != 0, (pid, uid)
        assert capabilities == 0 or userns != host_userns, (pid, hex(capabilities), userns)


def _identity(pid: int) -> tuple[int, int, str]:
    """(host uid, effective capabilities, user namespace) of a process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Uid"].split()[0]), int(fields["CapEff"], 16), os.readlink(f"/proc/{pid}/ns/user")


@needs_slirp
def test_kill_9_of_the_owner_leaves_no_slirp4netns_after_trialforge_reap(base_image, state_dir):
    tag = f"sleep 300.{secrets.randbelow(10**8)}"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from trialforge.sandbox.bwrap.backend import BwrapBackend\n"
        "from trialforge.sandbox.images import base_image\n"
        "from trialforge.sandbox.base import Limits, SandboxSpec\n"
        "backend = BwrapBackend(base_image(), state_dir=Path(sys.argv[1]))\n"
        "sb = backend.create(SandboxSpec(image='', limits=Limits(network=True)))\n"
        "print(sb.id, flush=True)\n"
        "sb.exec(sys.argv[2].split(), timeout=400)\n"
    )
    before = _slirps()
    child = subprocess.Popen([sys.executable, "-c", code, str(state_dir), tag], stdout=subprocess.PIPE, text=True)
    sandbox_id = child.stdout.readline().strip()
    for _ in range(1000):  # until the sleeper runs, its network attached
        if running(tag) and _slirps() - before:
            break
        time.sleep(0.01)
    assert running(tag) and _slirps() - before, "the networked command never started"
    child.kill()
    child.wait()
    trialforge = Path(sys.executable).with_name("trialforge")
    env = {**os.environ, "TRIALFORGE_STATE_DIR": str(state_dir)}
    subprocess.run([str(trialforge), "reap"], env=env, capture_output=True, text=True, check=True)
    assert not (state_dir / "sandboxes" / sandbox_id).exists()
    assert not running(tag)
    assert _slirps() <= before


COUNT_RUN = "echo ran >> /work/runs; echo 'bwrap: loopback: Failed RTM_NEWADDR: No child processes' >&2; exit 1"


@needs_slirp
def test_a_networked_launch_that_dies_before_releasing_its_command_is_started_again(
    bwrap_backend, base_image, monkeypatch, caplog
):
    """bwrap can die setting up (slirp4netns may bring ``lo`` up before bwrap gives it its address): that launch
    never ran the command and is started again. A command that ran is never run twice, even one that prints what
    such a bwrap prints and exits 1 as it does: the held-back go byte, not the output, says which it was."""
    real_attach = usernet.UserNet.attach
    launches = []

    def attach(net, bwrap):
        launches.append(bwrap.pid)
        if len(launches) == 1:  # the first launch dies before its command could take the go byte
            os.killpg(bwrap.pid, signal.SIGKILL)
            bwrap.wait()
            net.release()
            return
        real_attach(net, bwrap)

    sb = bwrap_backend.create(SandboxSpec(image=base_image.name, limits=NETWORKED))
    try:
        monkeypatch.setattr(usernet.UserNet, "attach", attach)
        again = sb.exec(["sh", "-c", "echo ran >> /work/runs; cat /etc/resolv.conf"])
        monkeypatch.setattr(usernet.UserNet, "attach", real_attach)
        imitation = sb.exec(["sh", "-c", COUNT_RUN])
        runs = sb.read_file("runs").decode()
    finally:
        sb.close()
    assert len(launches) == 2 and again.exit_code == 0 and again.stdout == "nameserver 10.0.2.3\n"
    assert "started again" in caplog.text
    assert imitation.exit_code == 1 and "Failed RTM_NEWADDR" in imitation.stderr  # its own output, returned
    assert runs == "ran\nran\n"  # once per exec
