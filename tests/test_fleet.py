"""A fleet of container engines: placement, capacity, health, failover, images by digest, TLS.

Two real Podman services on this machine stand for two hosts: the session's engine (the host's store) and a
second one with a store of its own (``podman --root``), so it holds none of the first one's images or
containers. The failover test kills the second service with SIGKILL in the middle of a run that goes through
the same door as ``trialforge run`` (params -> ``open_runtime`` -> ``make_rollout``).
"""

from __future__ import annotations

import datetime
import getpass
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path

import docker
import pytest
import yaml
from conftest import HOST_WIDE
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.cli_runner import invoke
from support.processes import wait_for
from support.worlds import Wander, bundled_world

from trialforge.config import load_params
from trialforge.errors import ConfigError, SandboxError
from trialforge.pipeline import make_rollout, store_episodes
from trialforge.rollout.loop import Lineage, episode_id, plan_jobs, run_jobs
from trialforge.rollout.policies import Decision, EpisodePolicy, GoldPolicy, NoopPolicy, TaskView
from trialforge.runtime import open_runtime
from trialforge.sandbox.base import SandboxSpec
from trialforge.sandbox.container.backend import LABEL_DIGEST, LABEL_OWNER, DockerBackend, owner_label
from trialforge.sandbox.container.endpoints import EngineEndpoint
from trialforge.sandbox.container.engine import PodmanService, mounts_under, remove_home, store_dir
from trialforge.sandbox.container.fleet import EngineFleet, FleetEngine
from trialforge.sandbox.container.registry import push as push_image
from trialforge.sandbox.host.leftovers import reap_containers
from trialforge.sandbox.host.statedir import private_dir
from trialforge.store import datasets

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK = "ledgerlite-3"


@pytest.fixture
def own_store_engine(state_dir) -> Iterator[PodmanService]:
    """A second engine with its own image and container store, removed with everything it holds."""
    home = Path(tempfile.mkdtemp(prefix="podman-", dir=private_dir(state_dir)))  # where `trialforge reap` looks
    service = PodmanService(home, use_docker_host=False, own_storage=True)
    service.start()
    try:
        yield service
    finally:
        service.stop()
        with PodmanService(home, use_docker_host=False, own_storage=True) as again:  # its containers, if it was killed
            client = again.client()
            reap_containers(client, everything=True)
            client.close()
        remove_home(home)
        assert not home.exists() and not store_dir(home).exists() and mounts_under(store_dir(home)) == []


def ours(url: str) -> list[dict]:
    """This test process's sandboxes on the engine at ``url``."""
    return ours_of_any(url, f"{LABEL_OWNER}={owner_label()}")


def ours_of_any(url: str, label: str = LABEL_OWNER) -> list[dict]:
    """Sandboxes of any trialforge process on the engine at ``url``."""
    client = docker.APIClient(base_url=url, version="1.41", timeout=30)
    try:
        return client.containers(all=True, filters={"label": label})
    finally:
        client.close()


class KillOnce:
    """Wander's actions under its name; before an action, once the second engine holds a sandbox, kills it."""

    def __init__(self, inner: Wander, fleet: EngineFleet, service: PodmanService) -> None:
        self.inner, self.fleet, self.service = inner, fleet, service
        self.name, self.version = inner.name, inner.version
        self.fired = threading.Event()
        self.on_b_at_kill: list[str] = []  # ids of the containers the engine held when it died
        self.episodes_on_b: set[str] = set()  # the episodes whose sandbox was one of them
        self._lock = threading.Lock()

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        return _Killing(self.inner.begin(view, seed), self)

    def maybe_kill(self) -> None:
        with self._lock:
            if self.fired.is_set():
                return
            held = [c for c in ours(self.service.base_url) if c["State"] == "running"]
            if not any("episode" in (c["Labels"] or {}) for c in held):
                return  # wait until an episode's own sandbox is there
            self.on_b_at_kill = [c["Id"] for c in held]
            self.episodes_on_b = {c["Labels"]["episode"] for c in held if "episode" in (c["Labels"] or {})}
            assert self.service.proc is not None
            os.kill(self.service.proc.pid, signal.SIGKILL)  # the engine dies; its containers stay, unreachable
            self.service.proc.wait()
            self.fired.set()


class _Killing:
    def __init__(self, agent: EpisodePolicy, killer: KillOnce) -> None:
        self.agent, self.killer, self.acts = agent, killer, 0

    def act(self, observation: str) -> Decision:
        self.acts += 1
        if self.acts >= 3:
            self.killer.maybe_kill()
        return self.agent.act(observation)


def fleet_params(tmp_path: Path, *engines: dict) -> dict:
    return {
        "sandbox.backend": "docker",
        "sandbox.engines": list(engines),
        "sandbox.engine_health_s": 0.5,
        "run.store": f"file://{tmp_path / 'store'}",
    }


@pytest.mark.sandbox
@pytest.mark.slow
def test_an_engine_killed_mid_run_loses_no_episode_and_duplicates_none(
    container_engine, own_store_engine, base_image, tmp_path
) -> None:
    a, b = container_engine.base_url, own_store_engine.base_url
    overrides = fleet_params(tmp_path, {"url": a, "capacity": 2, "name": "a"}, {"url": b, "capacity": 2, "name": "b"})
    params = load_params(REPO_ROOT / "params.yaml", overrides)
    with open_runtime(params) as rt:
        fleet = rt.backend
        assert isinstance(fleet, EngineFleet) and [e.name for e in fleet.engines] == ["a", "b"]
        # the image reached the engine with a store of its own at open, and it is the tarball's content
        (on_b,) = [i for i in docker.APIClient(base_url=b, version="1.41").images() if i["RepoTags"]]
        assert (on_b["Labels"] or {})[LABEL_DIGEST] == base_image.digest

        world = bundled_world(tmp_path / "world", fleet, (TASK,))
        killer = KillOnce(Wander(world.tasks), fleet, own_store_engine)
        lineage = Lineage("fleet-test", 0, "tasks", "params", "code")
        jobs = plan_jobs(world.tasks, [killer, GoldPolicy(world.tasks), NoopPolicy()], group_size=2, seed=3)
        records = run_jobs(make_rollout(rt, lineage), jobs, concurrency=4)

        assert killer.fired.is_set() and killer.on_b_at_kill
        assert [r.episode_id for r in records] == [episode_id(lineage, j) for j in jobs]
        outcome = {(r.policy, r.sample): (r.status, r.reward) for r in records}
        assert outcome == {
            ("wander", 0): ("ok", 1.0),
            ("wander", 1): ("ok", 1.0),
            ("gold", 0): ("ok", 1.0),
            ("gold", 1): ("ok", 1.0),
            ("noop", 0): ("ok", 0.0),
            ("noop", 1): ("ok", 0.0),
        }, [(r.policy, r.cause) for r in records]
        # each episode caught on the dead engine was restored on the survivor (or started again), and ended once
        caught = [r for r in records if r.episode_id in killer.episodes_on_b]
        assert caught and all(json.loads(r.recoveries) or r.attempt > 0 for r in caught), [
            (r.episode_id, r.recoveries, r.attempt) for r in caught
        ]
        status = {s["engine"]: s for s in fleet.status()}
        assert (status["a"]["up"], status["b"]["up"], status["b"]["downs"]) == (True, False, 1)
        assert status["a"]["live"] == 0  # every sandbox placed on the survivor was given back

        store_episodes(rt.store, records, lineage, part="fleet")
        written = datasets.read_pandas(rt.store, "episodes", filters={"run": lineage.run_id})
        assert sorted(written["episode_id"]) == sorted(r.episode_id for r in records)

        # the engine comes back (same store, same socket): the health check puts it back into placement
        assert own_store_engine.proc is None or own_store_engine.proc.poll() is not None
        own_store_engine.proc = None
        own_store_engine.start()
        wait_for(lambda: {s["engine"]: s["up"] for s in fleet.status()}["b"], "the revived engine to be used again")
        stranded = ours(b)  # the sandboxes that were on it when it died: still there, each removed by the reaper
        assert set(killer.on_b_at_kill) <= {c["Id"] for c in stranded}
        client = docker.DockerClient(base_url=b, version="1.41")
        assert len(reap_containers(client, owner=owner_label()).containers) == len(stranded)
        client.close()
    assert ours(a) == [] and ours(b) == []


@pytest.mark.sandbox
@pytest.mark.slow
def test_placement_prefers_the_engine_holding_the_image_then_free_slots_and_waits_for_room(
    container_engine, own_store_engine, base_image
) -> None:
    def member(url: str, capacity: int) -> FleetEngine:
        endpoint = EngineEndpoint(url=url, capacity=capacity)
        return FleetEngine(endpoint, DockerBackend(endpoint.client(), base_image), endpoint.client(timeout=5).api)

    a, b = member(container_engine.base_url, 2), member(own_store_engine.base_url, 3)
    a.backend.ensure_image()  # a holds the image; b has never seen it
    fleet = EngineFleet([a, b], health_s=60)
    spec = SandboxSpec(image="")
    boxes = []
    try:
        boxes += [fleet.create(spec), fleet.create(spec)]  # the image's engine first, although b has more room
        assert (a.backend.live, b.backend.live, b.backend.has_image(base_image.name)) == (2, 0, False)
        boxes += [fleet.create(spec) for _ in range(3)]  # a is full: b imports the image and takes the rest
        assert (a.backend.live, b.backend.live, b.backend.has_image(base_image.name)) == (2, 3, True)
        assert (len(ours(container_engine.base_url)), len(ours(own_store_engine.base_url))) == (2, 3)

        waiting: list = []
        waiter = threading.Thread(target=lambda: waiting.append(fleet.create(spec)))
        waiter.start()  # every engine is full: it waits for a slot instead of overfilling one
        wait_for(lambda: fleet.waiting == 1, "the sixth sandbox to wait for room")
        assert waiting == [] and (a.backend.live, b.backend.live) == (2, 3)
        boxes.pop(0).close()  # a slot on a frees
        waiter.join(timeout=300)
        boxes += waiting
        assert (a.backend.live, b.backend.live) == (2, 3) and len(waiting) == 1
    finally:
        for box in boxes:
            box.close()
        fleet.close()
    assert ours(container_engine.base_url) == [] and ours(own_store_engine.base_url) == []


@pytest.mark.sandbox
@pytest.mark.slow
def test_no_engine_answering_is_a_clear_error_and_a_full_fleet_times_out_as_capacity(
    container_engine, base_image, tmp_path
) -> None:
    dead = EngineEndpoint(url=f"unix://{tmp_path}/nobody.sock", name="dead")
    params = load_params(None, fleet_params(tmp_path, dead.model_dump()))
    with pytest.raises(
        SandboxError, match=r"no engine of sandbox\.engines answers: dead \(unix:.*nobody\.sock\): .*No such file"
    ):
        open_runtime(params).__enter__()

    live = EngineEndpoint(url=container_engine.base_url, capacity=1)
    members = [FleetEngine(e, DockerBackend(e.client(), base_image), e.client(timeout=5).api) for e in (live, dead)]
    members[1].up = False
    fleet = EngineFleet(members, health_s=60, capacity_wait_s=0.2)
    first = fleet.create(SandboxSpec(image=""))
    try:
        with pytest.raises(SandboxError, match="every engine that answers is full") as full:
            fleet.create(SandboxSpec(image=""))
        assert full.value.cause == "capacity"
    finally:
        first.close()
        fleet.close()


@pytest.mark.pure
@pytest.mark.parametrize(
    ("engines", "error"),
    [
        ([{"url": "http://127.0.0.1:2375"}], "use unix:///path/to.sock, tcp://host:port or ssh://"),
        ([{"url": "unix:///a.sock", "tls_ca": "ca.pem"}], "TLS needs a tcp:// url and all of"),
        ([{"url": "tcp://10.0.0.2:2376", "tls_ca": "ca.pem", "tls_cert": "c.pem"}], "all of tls_ca, tls_cert, tls_key"),
        ([{"url": "unix:///a.sock"}, {"url": "unix:///a.sock"}], "two engines share a name or url"),
        ([{"url": "unix:///a.sock", "capacity": 0}], "greater than or equal to 1"),
    ],
)
def test_bad_engine_lists_are_refused_with_the_reason(engines, error) -> None:
    with pytest.raises(ConfigError, match=error):
        load_params(None, {"sandbox.backend": "docker", "sandbox.engines": engines})


@pytest.mark.pure
def test_engines_need_the_docker_backend_and_exclude_docker_host() -> None:
    with pytest.raises(ConfigError, match=r"needs sandbox\.backend: docker"):
        load_params(None, {"sandbox.engines": [{"url": "unix:///a.sock"}]})
    with pytest.raises(ConfigError, match=r"docker_host or sandbox\.engines, not both"):
        load_params(
            None,
            {
                "sandbox.backend": "docker",
                "sandbox.docker_host": "unix:///b",
                "sandbox.engines": [{"url": "unix:///a"}],
            },
        )


# --- tcp with mutual TLS ---------------------------------------------------------------------------------------
def _cert(subject: str, key, issuer=None, issuer_key=None, *, ca: bool = False, server: bool = False) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ip_address("127.0.0.1"))]), False)
    return builder.sign(issuer_key or key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _pki(root: Path, name: str) -> dict[str, Path]:
    """A CA and a certificate it signed for ``name`` (the server's carries 127.0.0.1), as PEM files."""
    root.mkdir(parents=True, exist_ok=True)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    files = {
        "ca": _cert(f"{name} CA", ca_key, ca=True),
        "cert": _cert(name, key, ca_name, ca_key, server=name == "engine"),
        "key": key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    }
    for kind, data in files.items():
        (root / f"{name}-{kind}.pem").write_bytes(data)
    return {kind: root / f"{name}-{kind}.pem" for kind in files}


@pytest.fixture
def tls_engine(container_engine, tmp_path) -> Iterator[tuple[str, dict[str, Path], dict[str, Path]]]:
    """The session's engine behind socat speaking mutual TLS on 127.0.0.1: (url, server PKI, client PKI)."""
    server, client = _pki(tmp_path / "pki", "engine"), _pki(tmp_path / "pki", "trainer")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listen = (
        f"OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={server['cert']},key={server['key']},"
        f"cafile={client['ca']},verify=1"
    )
    target = "UNIX-CONNECT:" + container_engine.base_url.removeprefix("unix://")
    proc = subprocess.Popen(["socat", listen, target], stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _listening(port), "socat to listen", proc)
        yield f"tcp://127.0.0.1:{port}", server, client
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_an_engine_over_tcp_with_mutual_tls_runs_sandboxes_and_refuses_a_stranger(tls_engine, tmp_path) -> None:
    url, server, client = tls_engine
    ours_tls = {"url": url, "name": "tls", "tls_ca": str(server["ca"]), "tls_cert": str(client["cert"])}
    ours_tls["tls_key"] = str(client["key"])
    with open_runtime(load_params(None, fleet_params(tmp_path, ours_tls))) as rt:
        with rt.pool.sandbox(rt.image.name) as box:
            assert box.exec(["sh", "-c", "echo over-tls; id -u"]).stdout.split() == ["over-tls", "1000"]
        assert rt.backend.status()[0]["placed"] == 1

    stranger = _pki(tmp_path / "other", "trainer")  # a client certificate the engine's CA never signed
    forged = {**ours_tls, "tls_cert": str(stranger["cert"]), "tls_key": str(stranger["key"])}
    with pytest.raises(SandboxError, match=r"no engine of sandbox\.engines answers"):
        open_runtime(load_params(None, fleet_params(tmp_path, forged))).__enter__()
    unverified = {**ours_tls, "tls_ca": str(stranger["ca"])}  # we do not trust a server our CA did not sign
    with pytest.raises(SandboxError, match=r"(?i)certificate verify failed"):
        open_runtime(load_params(None, fleet_params(tmp_path, unverified))).__enter__()


# --- ssh -------------------------------------------------------------------------------------------------------
@pytest.fixture
def sshd(tmp_path) -> Iterator[dict[str, str]]:
    """An OpenSSH server on 127.0.0.1 with a key pair of its own and one authorised client key."""
    keys = tmp_path / "ssh"
    keys.mkdir()
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (keys / "known_hosts").write_text(f"[127.0.0.1]:{port} {(keys / 'host.pub').read_text()}")
    config = keys / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
        f"AuthorizedKeysFile {keys / 'authorized_keys'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        "StrictModes no\nPidFile none\nUsePAM no\nAllowStreamLocalForwarding yes\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _listening(port), "sshd to listen", proc)
        yield {"port": str(port), "key": str(keys / "client"), "known_hosts": str(keys / "known_hosts")}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_an_engine_over_ssh_runs_sandboxes_and_a_changed_host_key_is_refused(container_engine, sshd, tmp_path) -> None:
    socket_path = container_engine.base_url.removeprefix("unix://")
    url = f"ssh://{getpass.getuser()}@127.0.0.1:{sshd['port']}{socket_path}"
    over_ssh = {"url": url, "name": "ssh", "ssh_key": sshd["key"], "ssh_known_hosts": sshd["known_hosts"]}
    with open_runtime(load_params(None, fleet_params(tmp_path, over_ssh))) as rt:
        (engine,) = rt.backend.engines
        tunnel = engine.tunnel
        assert tunnel is not None and tunnel.socket.exists()
        with rt.pool.sandbox(rt.image.name) as box:
            assert box.exec(["sh", "-c", "echo over-ssh; id -u"]).stdout.split() == ["over-ssh", "1000"]
        tunnel.close_process()  # the tunnel dies: the health check finds the engine down, restarts it, and it is back
        rt.backend.check()
        assert rt.backend.status()[0]["up"] and tunnel.proc is not None and tunnel.proc.poll() is None
    assert not tunnel.socket.parent.exists()  # the tunnel's directory went with the run

    impostor = tmp_path / "impostor_hosts"  # 127.0.0.1 known under another key: a man in the middle
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    impostor.write_text(f"[127.0.0.1]:{sshd['port']} {(tmp_path / 'other.pub').read_text()}")
    spoofed = load_params(None, fleet_params(tmp_path, {**over_ssh, "ssh_known_hosts": str(impostor)}))
    with pytest.raises(SandboxError, match=r"(?s)no engine of sandbox\.engines answers.*Host key verification failed"):
        open_runtime(spoofed).__enter__()


# --- the doors: `trialforge engines`, `trialforge reap` over a fleet -------------------------------------------
OWNER = """
import sys
from trialforge.config import load_params
from trialforge.runtime import open_runtime
from pathlib import Path

with open_runtime(load_params(Path(sys.argv[1]))) as rt:
    boxes = [rt.pool.acquire(rt.image.name) for _ in range(4)]  # two per engine: placement by free slots
    print(" ".join(sorted(e.name + "=" + str(e.backend.live) for e in rt.backend.engines)), flush=True)
    sys.stdin.read()  # until killed
"""


@HOST_WIDE
@pytest.mark.sandbox
@pytest.mark.slow
def test_the_cli_surveys_the_fleet_and_reap_clears_every_engine_after_a_kill_9(
    container_engine, own_store_engine, base_image, tmp_path
) -> None:
    a, b = container_engine.base_url, own_store_engine.base_url
    dead = f"unix://{tmp_path}/nobody.sock"
    engines = [{"url": a, "capacity": 2, "name": "a"}, {"url": b, "capacity": 2, "name": "b"}]
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump({"sandbox": {"backend": "docker", "engines": engines}, "run": {"store": f"file://{tmp_path}/s"}})
    )
    child = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(params)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().split() == ["a=2", "b=2"]
    finally:
        child.kill()
        child.wait()

    def the_dead_runs(url: str) -> list[dict]:  # the host's store holds other sessions' (and workers') too
        return [c for c in ours_of_any(url) if c["Labels"][LABEL_OWNER].split(":")[1:2] == [str(child.pid)]]

    assert (len(the_dead_runs(a)), len(the_dead_runs(b))) == (2, 2)  # a dead run's sandboxes on both engines

    with_dead = tmp_path / "with-dead.yaml"
    with_dead.write_text(
        yaml.safe_dump({"sandbox": {"backend": "docker", "engines": [*engines, {"url": dead, "name": "gone"}]}})
    )
    surveyed = invoke("engines", "-p", str(with_dead))
    assert surveyed.exit_code == 1, surveyed.output
    rows = {row["engine"]: row for row in map(json.loads, surveyed.output.splitlines())}
    assert (rows["a"]["answers"], rows["b"]["answers"], rows["gone"]["answers"]) == (True, True, False)
    assert rows["a"]["image"] == rows["b"]["image"] == base_image.name and rows["b"]["sandboxes"] == 2
    assert "No such file or directory" in rows["gone"]["error"]

    reaped = invoke("reap", "-p", str(with_dead))
    assert reaped.exit_code == 0, reaped.output
    assert "engines not reached: gone" in reaped.output
    assert the_dead_runs(a) == [] and ours_of_any(b) == []  # b's store is its own


# --- a registry between the engines ----------------------------------------------------------------------------
@pytest.fixture
def registry(tmp_path) -> Iterator[str]:
    """A Docker registry (distribution, Debian's docker-registry) on 127.0.0.1, storing under tmp_path."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "error"},
                "storage": {"filesystem": {"rootdirectory": str(tmp_path / "registry")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _listening(port), "the registry to listen", proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _tags(registry: str, repo: str) -> list[str]:
    with urllib.request.urlopen(f"http://{registry}/v2/{repo}/tags/list", timeout=30) as answer:
        return json.loads(answer.read())["tags"] or []


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_with_a_registry_one_engine_imports_and_pushes_the_others_pull_and_a_forgery_is_not_run(
    container_engine, own_store_engine, base_image, registry, tmp_path, caplog
) -> None:
    a, b = container_engine.base_url, own_store_engine.base_url
    overrides = fleet_params(tmp_path, {"url": a, "name": "a"}, {"url": b, "name": "b"})
    overrides["sandbox.registry"] = {"url": f"{registry}/tf", "insecure": True}
    params = load_params(None, overrides)
    ref = params.sandbox.registry.reference(base_image)
    tag = ref.rsplit(":", 1)[1]
    api_b = docker.APIClient(base_url=b, version="1.41", timeout=120)

    def image_on_b() -> dict:
        return api_b.inspect_image(base_image.name)

    with open_runtime(params):  # a had the image; b had nothing: it imported the tarball and pushed it
        assert _tags(registry, "tf/trialforge-base") == [tag]
        assert image_on_b()["Config"]["Labels"][LABEL_DIGEST] == base_image.digest
    api_b.remove_image(base_image.name, force=True)
    api_b.remove_image(ref, force=True)

    with open_runtime(params) as rt:  # b pulls what the registry holds: the same content, by its digest label
        pulled = image_on_b()
        assert pulled["Config"]["Labels"][LABEL_DIGEST] == base_image.digest
        assert any(d.startswith(f"{registry}/tf/trialforge-base@sha256:") for d in pulled["RepoDigests"])
        with rt.pool.sandbox(rt.image.name) as box:
            assert box.exec(["true"]).exit_code == 0
    api_b.remove_image(base_image.name, force=True)
    api_b.remove_image(ref, force=True)

    # someone pushes other content under the tag: the engine that pulls it finds the wrong digest and imports
    forged = tmp_path / "forged.tar"
    with tarfile.open(forged, "w") as tar:
        info = tarfile.TarInfo("evil")
        tar.addfile(info)
    api_a = docker.APIClient(base_url=a, version="1.41", timeout=120)
    mark = f"sha256:forged-{os.getpid()}"
    api_a.import_image(src=str(forged), repository="localhost/forged", changes=[f"LABEL {LABEL_DIGEST}={mark}"])
    (fake,) = api_a.images(filters={"label": f"{LABEL_DIGEST}={mark}"})
    push_image(api_a, params.sandbox.registry, base_image, fake["Id"])  # under the genuine image's tag
    api_a.remove_image(fake["Id"], force=True)
    api_a.close()
    with caplog.at_level(logging.WARNING, logger="trialforge.sandbox.container.backend"), open_runtime(params):
        assert image_on_b()["Config"]["Labels"][LABEL_DIGEST] == base_image.digest  # imported from the tarball
    assert [r.image for r in caplog.records if "not the tarball's content" in r.getMessage()] == [base_image.name]
    api_b.close()
