"""The bubblewrap backend: every escape attempt fails, limits hold, state snapshots and restores."""

from __future__ import annotations

import http.server
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import HOST_WIDE

from trialforge.errors import SandboxError
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.bwrap import cgroups
from trialforge.sandbox.host.reaper import reap

pytestmark = pytest.mark.sandbox

LIMITS = Limits(memory_mb=256, pids=64, disk_mb=16, exec_timeout_s=20, output_cap_bytes=4096)


@pytest.fixture
def sandbox(bwrap_backend, base_image, tmp_path):
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "hello.txt").write_text("hello\n")
    sb = bwrap_backend.create(SandboxSpec(image=base_image.name, workspace=tmp_path / "seed", limits=LIMITS))
    yield sb
    sb.close()


def test_workspace_is_seeded_and_writable(sandbox):
    result = sandbox.exec(["sh", "-c", "cat hello.txt && echo more > new.txt && pwd"])
    assert result.exit_code == 0
    assert result.stdout == "hello\n/work\n"
    assert sandbox.read_file("new.txt") == b"more\n"


def test_failing_command_is_an_observation_not_an_error(sandbox):
    result = sandbox.exec(["sh", "-c", "echo oops >&2; exit 3"])
    assert (result.exit_code, result.stderr, result.timed_out) == (3, "oops\n", False)


def test_cannot_reach_a_server_on_host_loopback(sandbox):
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('reached')"
        result = sandbox.exec(["python3", "-c", probe])
    finally:
        server.shutdown()
    assert "reached" not in result.stdout
    assert result.exit_code != 0


def test_cannot_read_host_home_or_environment(sandbox, monkeypatch):
    canary = Path.home() / f".trialforge-canary-{os.getpid()}"
    canary.write_text("secret-canary")
    monkeypatch.setenv("TRIALFORGE_CANARY_SECRET", "hunter2")
    try:
        result = sandbox.exec(["sh", "-c", f"cat {canary}; env; cat /proc/1/environ"])
    finally:
        canary.unlink()
    assert "secret-canary" not in result.stdout
    assert "hunter2" not in result.stdout + result.stderr
    assert "AWS_" not in result.stdout


def test_cannot_see_or_signal_host_processes(sandbox):
    host = subprocess.Popen(["sleep", "30"])
    try:
        result = sandbox.exec(["sh", "-c", f"ls /proc | grep -x {host.pid}; kill -9 {host.pid}; echo rc=$?"])
        assert host.poll() is None, "the sandbox killed a host process"
        assert str(host.pid) + "\n" not in result.stdout.split("rc=")[0]
        assert "rc=0" not in result.stdout
    finally:
        host.kill()


def test_cannot_reach_the_container_engine_socket(sandbox):
    result = sandbox.exec(["sh", "-c", "ls /run/podman/podman.sock /var/run/docker.sock 2>&1; echo done"])
    assert "No such file" in result.stdout
    assert "srw" not in result.stdout


def test_fork_bomb_is_contained(sandbox):
    bomb = "import os\nfor _ in range(10000):\n    os.fork()\n"
    result = sandbox.exec(["python3", "-c", bomb], timeout=10)
    assert result.exit_code != 0
    assert sandbox.exec(["true"]).exit_code == 0  # the sandbox (and the host) still work


def test_memory_limit_reports_oom(sandbox):
    result = sandbox.exec(["python3", "-c", "x = bytearray(600 * 1024 * 1024)"])
    assert result.exit_code != 0
    assert result.oom


def test_disk_quota_holds(sandbox):
    result = sandbox.exec(["sh", "-c", "head -c 40000000 /dev/zero > big; echo rc=$?"])
    assert "rc=0" not in result.stdout
    assert "No space left" in result.stderr


def test_command_that_never_ends_is_killed_with_its_children(sandbox):
    pause = f"sleep 300.{secrets.randbelow(10**9):09d}"  # unique: no other process on the machine matches
    script = f"({pause}; echo background ended) & echo started; {pause}; echo foreground ended"
    result = sandbox.exec(["sh", "-c", script], timeout=1.5)
    assert result.timed_out and result.exit_code == 137
    # Killed, not waited out: a sleep that ran to its end would have said so on the same pipe.
    assert "started" in result.stdout and "ended" not in result.stdout
    leftovers = subprocess.run(["pgrep", "-f", pause], capture_output=True, text=True).stdout
    assert leftovers == ""


def test_output_is_capped_with_a_visible_mark(sandbox):
    result = sandbox.exec(["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x"])
    assert result.truncated
    assert "output truncated by trialforge" in result.stdout
    assert len(result.stdout) < 5000


def test_paths_outside_the_workspace_are_refused(sandbox):
    sandbox.exec(["ln", "-s", "/etc", "escape"])
    with pytest.raises(SandboxError):
        sandbox.read_file("../etc/passwd")
    with pytest.raises(SandboxError):
        sandbox.write_file("escape/evil", b"x")


def test_snapshot_restore_returns_state(sandbox):
    snap = sandbox.snapshot()
    sandbox.exec(["sh", "-c", "echo changed > hello.txt; mkdir d; touch d/f; rm -f nothing"])
    sandbox.restore(snap)
    assert sandbox.exec(["sh", "-c", "cat hello.txt; ls"]).stdout == "hello\nhello.txt\n"


def test_fork_from_snapshot_gives_independent_sandboxes(bwrap_backend, base_image, sandbox):
    sandbox.write_file("state.txt", b"setup")
    snap = sandbox.snapshot()
    spec = SandboxSpec(image=base_image.name, limits=LIMITS)
    forks = [bwrap_backend.from_snapshot(snap, spec) for _ in range(3)]
    try:
        for i, fork in enumerate(forks):
            fork.write_file("state.txt", f"fork{i}".encode())
        assert [f.read_file("state.txt") for f in forks] == [b"fork0", b"fork1", b"fork2"]
        assert sandbox.read_file("state.txt") == b"setup"
    finally:
        for fork in forks:
            fork.close()
        bwrap_backend.release(snap)


def test_image_digest_is_recorded_and_has_no_git(sandbox, base_image):
    assert sandbox.image_digest == base_image.digest
    assert base_image.digest.startswith("sha256:")
    assert not list(base_image.rootfs.glob("**/.git"))


def test_closed_sandbox_is_gone(bwrap_backend, base_image, state_dir):
    sb = bwrap_backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    home = sb.home
    sb.close()
    sb.close()  # idempotent
    assert not home.exists()
    with pytest.raises(SandboxError):
        sb.exec(["true"])


@HOST_WIDE
def test_kill_9_of_the_owner_mid_command_leaves_nothing_after_trialforge_reap(base_image, state_dir):
    """A child runs a command in a sandbox and is SIGKILLed; ``trialforge reap`` removes all it held."""
    tag = f"sleep 300.{secrets.randbelow(10**8)}"  # a unique command line to find the sandboxed process by
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from trialforge.sandbox.bwrap.backend import BwrapBackend\n"
        "from trialforge.sandbox.images import base_image\n"
        "from trialforge.sandbox.base import SandboxSpec\n"
        "sb = BwrapBackend(base_image(), state_dir=Path(sys.argv[1])).create(SandboxSpec(image=''))\n"
        "print(sb.id, sb.lease.path, flush=True)\n"
        "sb.exec(sys.argv[2].split(), timeout=400)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(state_dir), tag], stdout=subprocess.PIPE, text=True)
    sandbox_id, lease = child.stdout.readline().split()
    home = state_dir / "sandboxes" / sandbox_id
    for _ in range(500):  # until the sleeper runs inside the sandbox
        if _processes_named(tag):
            break
        time.sleep(0.01)
    assert _processes_named(tag), "the sandboxed command never started"
    held = _held(sandbox_id)
    assert home.exists() and held["mounts"] and Path(lease).is_symlink()
    child.kill()
    child.wait()
    env = {**os.environ, "TRIALFORGE_STATE_DIR": str(state_dir)}
    trialforge = Path(sys.executable).with_name("trialforge")
    done = subprocess.run([str(trialforge), "reap"], env=env, capture_output=True, text=True, check=True)
    assert "1" in done.stdout, done.stdout
    assert not home.exists()
    assert _held(sandbox_id) == {"mounts": [], "cgroups": []}
    assert not _processes_named(tag)
    assert not Path(lease).is_symlink()  # its host uid is back in the range


@pytest.fixture
def lingering(bwrap_backend, base_image, monkeypatch):
    """A sandbox whose cgroups hold a process that SIGKILL does not remove in time (the double: ``kill_all``
    does nothing and the wait is short; a process that takes over 10 s to exit cannot be made on demand)."""
    monkeypatch.setattr(cgroups, "REMOVE_WAIT_S", 0.2)
    monkeypatch.setattr(cgroups.SandboxCgroup, "kill_all", lambda self: None)
    sb = bwrap_backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    if sb.cgroup is None:
        sb.close()
        pytest.skip("sandbox cgroups need root")
    holder = subprocess.Popen(["sleep", "600"])
    for d in sb.cgroup.dirs:
        (d / "cgroup.procs").write_text(str(holder.pid))
    yield sb, holder
    holder.kill()
    holder.wait()


def test_a_cgroup_still_held_at_close_is_removed_once_its_process_leaves(lingering, state_dir):
    sb, holder = lingering
    groups = list(sb.cgroup.dirs)
    sb.close()
    assert all(d.is_dir() for d in groups) and sb.home.is_dir() and not sb.workspace.exists()
    record = json.loads((sb.home / "record.json").read_text())
    assert sorted(record["cgroups"]) == sorted(map(str, groups)) and record["deadline"] <= time.time()
    holder.kill()
    holder.wait()
    for _ in range(600):  # the background retry runs once a second
        if not sb.home.exists() and not any(d.exists() for d in groups):
            break
        time.sleep(0.1)
    assert not any(d.exists() for d in groups) and not sb.home.exists()


def test_a_cgroup_still_held_is_left_to_trialforge_reap_which_keeps_it_until_it_is_free(
    lingering, state_dir, monkeypatch
):
    """The owner's background retry never runs (it died): ``reap`` finds the record, removes nothing while the
    group is held, and everything once it is free."""
    monkeypatch.setattr(cgroups, "remove_later", lambda group, then: None)
    sb, holder = lingering
    groups = list(sb.cgroup.dirs)
    sb.close()
    assert sb.id not in reap(state_dir)
    assert all(d.is_dir() for d in groups) and (sb.home / "record.json").exists()
    holder.kill()
    holder.wait()
    assert sb.id in reap(state_dir)
    assert not any(d.exists() for d in groups) and not sb.home.exists()


def _processes_named(tag: str) -> list[str]:
    return [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).strip() == tag]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _held(sandbox_id: str) -> dict[str, list[str]]:
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if sandbox_id in line]
    groups = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/**/{sandbox_id}")] if os.geteuid() == 0 else []
    return {"mounts": mounts, "cgroups": groups}


def test_reaper_ignores_records_it_cannot_authenticate(bwrap_backend, base_image, state_dir):
    """A planted record naming someone else's cgroup and mount is left alone, and so is what it names."""
    sb = bwrap_backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    try:
        record = json.loads((sb.home / "record.json").read_text())
        forged = {**record, "owner_pid": 1, "owner_start": "0", "mounts": ["/proc"], "sig": record["sig"]}
        (sb.home / "record.json").write_text(json.dumps(forged))
        assert sb.id not in reap(state_dir)  # (dead owners' sandboxes of other tests may go: that is its job)
        assert sb.exec(["true"]).exit_code == 0  # its real resources are intact
        (sb.home / "record.json").write_text(json.dumps(record))
    finally:
        sb.close()


def test_a_state_dir_someone_else_made_is_refused(base_image, tmp_path):
    from trialforge.sandbox.bwrap.backend import BwrapBackend

    planted = tmp_path / "planted"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    with pytest.raises(SandboxError, match="refusing state directory"):
        BwrapBackend(base_image, state_dir=planted)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_sandbox_killed_between_mounting_and_recording_is_unmounted_by_the_reaper(state_dir):
    """The owner died after mounting the workspace but before a record named the mount: nothing stays mounted."""
    home = state_dir / "sandboxes" / "tf-00c0ffee0001"
    (home / "work").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "trialforge-test", str(home / "work")], check=True)
    try:
        old = time.time() - 3600  # past the grace period for a sandbox still being created
        os.utime(home, (old, old))
        assert home.name in reap(state_dir)
        assert not os.path.ismount(home / "work") and not home.exists()
    finally:
        if os.path.ismount(home / "work"):
            subprocess.run(["umount", "-l", str(home / "work")], check=False)
