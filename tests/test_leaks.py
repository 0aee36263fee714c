"""Leftovers: scratch dirs name their owner, `trialforge reap` removes a dead one's, the leak check sees leaks.

The docker kill -9 test is tests/test_reap_docker.py; the bwrap one is in tests/test_sandbox_bwrap.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import HOST_WIDE
from support.leaks import HostState, reap_dead_sessions, settled_leftovers, snapshot

from trialforge.owners import process_start
from trialforge.sandbox.bwrap import cgroups
from trialforge.sandbox.host.leftovers import reap_services
from trialforge.scratch import owner_of, reap_scratch, scratch_dir

HOLDER = """
import signal
from trialforge.scratch import scratch_dir
with scratch_dir("final") as tmp:
    (__import__("pathlib").Path(tmp) / "work").mkdir()
    print(tmp, flush=True)
    signal.pause()  # until the test kills it
"""


@pytest.mark.pure
def test_a_scratch_dir_names_its_owner_and_goes_on_a_normal_exit() -> None:
    with scratch_dir("diff") as tmp:
        assert owner_of(Path(tmp).name) == (os.getpid(), process_start(os.getpid()))
    assert not Path(tmp).exists()


@HOST_WIDE
@pytest.mark.sandbox
def test_reap_removes_a_killed_owners_scratch_dir_and_keeps_a_live_ones(
    state_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    # A temp dir of the test's own: another test session's leak check on the host reaps no dir of this test first.
    env = {**os.environ, "TRIALFORGE_STATE_DIR": str(state_dir), "TMPDIR": str(tmp_path)}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=env)
    left = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert left.is_dir() and left.parent == tmp_path, "SIGKILL runs no cleanup: the dir stays (the leak)"
    with scratch_dir("final") as live:
        trialforge = Path(sys.executable).with_name("trialforge")
        done = subprocess.run([str(trialforge), "reap"], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not left.exists()
        assert left.name in done.stdout and "temp dirs" in done.stdout
        assert Path(live).is_dir()


@pytest.mark.pure
def test_reap_leaves_alone_scratch_names_it_does_not_own(tmp_path: Path) -> None:
    """The temp dir is world-writable: a planted link or another user's directory is never followed or removed."""
    dead = f"{2**22 + 1}.1"  # above any pid_max: a dead owner
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / f"tf-diff-{dead}-link"
    link.symlink_to(target)
    foreign = tmp_path / f"tf-diff-{dead}-foreign"
    foreign.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    os.chown(foreign, 65534, 65534)
    mine = tmp_path / f"tf-diff-{dead}-mine"
    (mine / "ro").mkdir(parents=True)
    (mine / "ro" / "f").write_text("x")
    (mine / "ro").chmod(0o500)  # a read-only directory inside does not stop the removal

    assert reap_scratch(tmp_path) == [mine.name]
    assert (target / "keep").exists() and link.is_symlink() and foreign.is_dir()


@pytest.mark.sandbox
def test_reap_services_never_kills_a_process_a_record_merely_names(state_dir: Path, tmp_path: Path) -> None:
    """A record whose service pid is not a Podman service on that record's socket is dropped, its process spared."""
    victim = subprocess.Popen(["sleep", "300"])
    try:
        home = state_dir / "podman-forged"
        home.mkdir()
        record = {
            "service_pid": victim.pid,
            "service_start": process_start(victim.pid),
            "owner_pid": 2**22 + 1,
            "owner_start": "1",
            "url": f"unix://{home}/podman.sock",
        }
        (home / "service.json").write_text(json.dumps(record))
        done = reap_services(state_dir)
        assert done.services == ["podman-forged"] and not home.exists()
        assert victim.poll() is None, "the named process was killed"
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.sandbox
@pytest.mark.parametrize("service", ["dead", "pid_reused"])
def test_a_service_that_died_with_its_owner_is_forgotten_without_a_signal(
    service: str, state_dir: Path, tmp_path: Path
) -> None:
    """A killed run's Podman service that is gone already (its socket dead too): the home is removed, nothing is
    signalled, and ``trialforge reap`` ends cleanly; a process that has its pid now is not the service."""
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        home = state_dir / f"podman-{service}"
        home.mkdir()
        pid = bystander.pid if service == "pid_reused" else 2**22 + 2
        record = {
            "service_pid": pid,
            "service_start": "1",  # not the running process's start: the recorded service is gone
            "owner_pid": 2**22 + 1,
            "owner_start": "1",
            "url": f"unix://{home}/podman.sock",
        }
        (home / "service.json").write_text(json.dumps(record))
        done = reap_services(state_dir)
        assert done.services == [f"podman-{service}"] and not home.exists()
        assert bystander.poll() is None, "a process that merely has the recorded pid was signalled"
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.sandbox
def test_the_leak_check_sees_a_temp_dir_and_an_empty_cgroup_and_forgives_what_goes(state_dir: Path) -> None:
    me = os.getpid()
    before = snapshot(state_dir, me=me)
    # named for this live process, so that no reaper running meanwhile (another test session's) takes it
    leaked = Path(tempfile.mkdtemp(prefix=f"tf-leaktest-{me}.{process_start(me)}-"))
    group = None
    if cgroups.available():
        group = cgroups.SandboxCgroup.create(f"tf-leaktest-{me}", memory_mb=64, pids=8, cpus=0.5)
    passing = Path(tempfile.mkdtemp(prefix="tf-passing-"))
    threading.Timer(1.0, passing.rmdir).start()  # in flight: gone within the settle time
    try:
        left = settled_leftovers(before, lambda: snapshot(state_dir, me=me), settle_s=3.0)
        assert leaked.name in left.kinds["temp dirs"]
        assert passing.name not in left.kinds.get("temp dirs", set())
        if group is not None:
            assert {str(d) for d in group.dirs} <= left.kinds["cgroups"]
    finally:
        if group is not None:
            group.remove()
        leaked.rmdir()
    forgiven = settled_leftovers(before, lambda: snapshot(state_dir, me=me), settle_s=3.0).kinds.get("temp dirs", set())
    assert not {leaked.name, passing.name} & forgiven  # another test session's temp dirs may come and go meanwhile


@pytest.mark.pure
def test_host_state_difference_keeps_only_new_entries() -> None:
    before = HostState({"containers": {"a"}, "temp dirs": {"x"}})
    after = HostState({"containers": {"a", "b"}, "temp dirs": {"x"}, "cgroups": set()})
    assert after.minus(before).kinds == {"containers": {"b"}}
    assert not HostState({"cgroups": set()})


SESSION = """
import os, sys
sys.path.insert(0, "tests")
from support.leaks import new_session_root
from trialforge.sandbox.container.engine import PodmanService
from trialforge.sandbox.host.statedir import private_dir

os.environ["TRIALFORGE_STATE_DIR"] = str(private_dir(new_session_root() / "gw0"))  # as conftest's state_dir
service = PodmanService(use_docker_host=False)  # as the container_engine fixture
service.start()
print(service.base_url, flush=True)
sys.stdin.read()  # until killed
"""


@HOST_WIDE  # stopping a service reaps every dead owner's containers in the host's store
@pytest.mark.sandbox
@pytest.mark.slow
def test_a_test_session_killed_with_sigkill_leaves_a_podman_service_the_next_session_stops(monkeypatch) -> None:
    with scratch_dir("ks") as tmp:  # the killed session's temp dir: no other session's start reaps it first
        child = subprocess.Popen(
            [sys.executable, "-c", SESSION],
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "TMPDIR": tmp},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        url = child.stdout.readline().strip()
        [root] = Path(tmp).glob("tf-state-*")
        [home] = root.glob("gw0/podman-*")
        service = json.loads((home / "service.json").read_text())
        engine_tmp = Path(tmp) / f"tf-enginetmp-{home.name.removeprefix('podman-')}"
        monkeypatch.setattr(tempfile, "tempdir", tmp)  # this session's leak check, then the next session, look there
        me = os.getpid()
        assert engine_tmp.name not in snapshot(root, me=me).kinds["temp dirs"]  # a live session's engine: not ours
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdin.close()
        child.stdout.close()
        assert process_start(service["service_pid"]) == service["service_start"], "the kill leaves it (the bug)"
        assert engine_tmp.is_dir() and url == f"unix://{home}/podman.sock"
        assert engine_tmp.name in snapshot(root, me=me).kinds["temp dirs"]  # its owner is gone: a leak

        assert reap_dead_sessions() == [root.name]  # what the next session's start does
        assert process_start(service["service_pid"]) != service["service_start"], "the service still runs"
        assert not root.exists() and not engine_tmp.exists()
