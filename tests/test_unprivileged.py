"""Limits in every mode: trialforge run as a normal user, for real (a user this suite creates, ``normal_user.py``).

With a cgroup subtree delegated to it, a normal user's bwrap sandboxes get what root's get: memory,
process and CPU limits from a cgroup, the disk quota's tmpfs (inside a namespace of the sandbox's own),
and a host uid of their own from the user's subordinate range, given back at close and after
``trialforge reap``. Without one, the backend refuses to start, naming what is missing, unless
``allow_unlimited`` accepts per-process rlimits. A container engine that applies no limits (rootless
Podman on cgroup v1) is refused the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from conftest import HOST_WIDE
from support.normal_user import running

from trialforge.sandbox.base import Limits

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="creates a normal user and delegates cgroups to it"),
]
LIMITS = Limits(cpus=0.5, memory_mb=192, pids=32, disk_mb=16, exec_timeout_s=60)

LIMITS_HOLD = f"""
import json, threading, time
from pathlib import Path
def _cmdline(proc):
    try:
        return proc.joinpath("cmdline").read_bytes().replace(bytes(1), b" ").decode().strip()
    except OSError:
        return ""
from trialforge.errors import SandboxError
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
limits = Limits(**{LIMITS.__dict__!r})
backend = BwrapBackend(base_image(build=False))
out = {{}}
first, second = (backend.create(SandboxSpec(image="", limits=limits)) for _ in range(2))
out["oom"] = first.exec(["python3", "-c", "x = bytearray(400 * 1024 * 1024)"]).oom
bomb = first.exec(["python3", "-c", "import os\\nwhile True:\\n    os.fork()"], timeout=5)
out["bomb_contained"] = bomb.exit_code != 0 and first.exec(["true"]).exit_code == 0
out["quota_us"] = int((first.cgroup.dirs[2] / "cpu.cfs_quota_us").read_text())
before = first.cpu_s()
first.exec(["python3", "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass"])
out["cpu_s"] = first.cpu_s() - before
full = first.exec(["sh", "-c", "head -c 40M /dev/zero > /work/big; echo rc=$?"])
out["disk_full"] = "rc=0" not in full.stdout and "No space left" in full.stderr
tag = "sleep 30.%d" % time.time_ns()
runner = threading.Thread(target=lambda: first.exec(tag.split(), timeout=2))
runner.start()
for _ in range(2000):
    found = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p) == tag]
    if found:
        break
    time.sleep(0.01)
out["process_uid"] = found[0].stat().st_uid if found else None
runner.join()
out["leases"] = [first.lease.uid, second.lease.uid]
out["lease_paths"] = [str(first.lease.path), str(second.lease.path)]
first.export_workspace(Path(backend.state_dir) / "export")
out["exported"] = sorted(p.name for p in (Path(backend.state_dir) / "export").iterdir())
first.close(); second.close(); backend.close()
out["given_back"] = [Path(p).is_symlink() for p in out["lease_paths"]]
print(json.dumps(out))
"""


def _subordinate(user) -> tuple[int, int]:
    for line in Path("/etc/subuid").read_text().splitlines():
        name, first, count = line.split(":")
        if name in (user.name, str(user.uid)):
            return int(first), int(count)
    raise AssertionError(f"useradd gave {user.name} no subordinate ids")


def test_a_normal_user_with_a_delegated_cgroup_gets_the_limits_root_gets(normal_user, delegated_cgroup):
    done = normal_user.run(LIMITS_HOLD, cgroup=delegated_cgroup)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["oom"] and out["bomb_contained"] and out["disk_full"]
    assert out["quota_us"] == int(LIMITS.cpus * 100_000) and out["cpu_s"] >= 0.3
    first_sub, count = _subordinate(normal_user)
    assert out["process_uid"] == out["leases"][0]  # the command ran as the sandbox's leased id, not the user
    assert len(set(out["leases"])) == 2 and all(first_sub <= uid < first_sub + count for uid in out["leases"])
    assert normal_user.uid not in out["leases"] and out["given_back"] == [False, False]
    assert out["exported"] == ["big"]


REFUSED = """
from trialforge.errors import SandboxError
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
try:
    BwrapBackend(base_image(build=False))
except SandboxError as exc:
    print("refused", exc.cause, exc)
backend = BwrapBackend(base_image(build=False), allow_unlimited=True)
with backend.create(SandboxSpec(image="", limits=Limits(disk_mb=16))) as sb:
    full = sb.exec(["sh", "-c", "head -c 40M /dev/zero > /work/big; echo rc=$?"])
    print("unlimited ran", sb.cgroup is None, "rc=0" not in full.stdout)
backend.close()
"""


def test_without_a_delegated_cgroup_a_normal_user_is_refused_unless_unlimited_is_accepted(normal_user):
    done = normal_user.run(REFUSED)
    assert done.returncode == 0, done.stderr[-3000:]
    refusal, accepted = done.stdout.splitlines()[-2:]
    assert refusal.startswith("refused cgroup") and "sandbox.allow_unlimited: true" in refusal
    assert "memory:" in refusal and "pids:" in refusal and "not writable" in refusal  # names what is missing
    assert accepted == "unlimited ran True True"  # the disk quota holds regardless: a tmpfs in its own namespace


KILLED = """
import sys
from trialforge.sandbox.base import SandboxSpec
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
sb = BwrapBackend(base_image(build=False)).create(SandboxSpec(image=""))
print(sb.id, sb.lease.path, sb.holder.proc.pid, *sb.cgroup.dirs, flush=True)
sb.exec(sys.argv[1].split(), timeout=400)
"""


@HOST_WIDE
def test_kill_9_of_a_normal_users_owner_leaves_nothing_after_trialforge_reap(normal_user, delegated_cgroup):
    tag = f"sleep 300.{secrets.randbelow(10**8)}"
    child = normal_user.run(KILLED, tag, cgroup=delegated_cgroup, background=True)
    sandbox_id, lease, holder, *groups = child.stdout.readline().split()
    for _ in range(1000):
        if running(tag):
            break
        time.sleep(0.01)
    assert running(tag) and Path(lease).is_symlink() and all(Path(g).is_dir() for g in groups)
    child.kill()
    child.wait()
    for _ in range(1000):  # the holder sees its owner's pipe close; bwrap dies with its parent
        if not running(tag) and not Path(f"/proc/{holder}").exists():
            break
        time.sleep(0.01)
    assert not running(tag) and not Path(f"/proc/{holder}").exists()  # the namespace and its mounts are gone
    reap = "import sys; sys.argv = ['trialforge', 'reap']; from trialforge.cli import app; app()"  # the CLI's door
    done = normal_user.run(reap, cgroup=delegated_cgroup)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 bwrap sandboxes" in done.stdout, done.stdout
    assert not (normal_user.home / "state" / "sandboxes" / sandbox_id).exists()
    assert not any(Path(g).exists() for g in groups)
    assert not Path(lease).is_symlink()  # the id is back in the user's range


# --- the docker backend: an engine that applies no limits ------------------------------------------------------
TOOLS = ("sh", "cat", "sleep", "timeout", "head", "stat", "realpath", "mkdir", "rm", "chmod", "find", "tar", "ipcrm")


@pytest.fixture(scope="session")
def small_image(base_image, normal_user) -> dict[str, str]:
    """An image of the few programs the docker backend's own scripts run, with their libraries: quick to import."""
    rootfs = base_image.rootfs

    def inside(*argv: str) -> str:
        return subprocess.run(["chroot", str(rootfs), *argv], capture_output=True, text=True, check=True).stdout

    wanted: set[str] = set()
    for tool in TOOLS:
        program = inside("sh", "-c", f"command -v {tool}").strip()
        wanted |= {program, *(w for line in inside("ldd", program).splitlines() for w in line.split() if w[0] == "/")}
    tarball = normal_user.home / "small-image.tar"  # where the user can read it
    with tarfile.open(tarball, "w") as tar:
        for top in ("bin", "lib", "lib64", "sbin"):  # merged-/usr links
            if (rootfs / top).is_symlink():
                tar.add(rootfs / top, arcname=top)
        for name in ("dev", "proc", "sys", "tmp", "work", "run", "var/tmp", "etc", "usr/bin"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if "tmp" in name else 0o755
            tar.addfile(info)
        for path in sorted(wanted):
            real = inside("readlink", "-f", path).strip()  # resolved in the image, whose links are absolute
            tar.add(rootfs / real.lstrip("/"), arcname=real.lstrip("/"))
            named = f"{inside('readlink', '-f', os.path.dirname(path)).strip()}/{os.path.basename(path)}"
            if named != real:  # the name a program or the loader asks for, as a link to the file
                link = tarfile.TarInfo(named.lstrip("/"))
                link.type, link.linkname = tarfile.SYMTYPE, real
                tar.addfile(link)
    os.chmod(tarball, 0o644)
    digest = "sha256:" + hashlib.sha256(tarball.read_bytes()).hexdigest()
    return {"name": f"localhost/trialforge-small:{digest[7:19]}", "tarball": str(tarball), "digest": digest}


ENGINE = """
import json, os, sys
from pathlib import Path
from trialforge.errors import SandboxError
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.container.backend import DockerBackend
from trialforge.sandbox.container.engine import PodmanService, engine_client
from trialforge.sandbox.images import Image
small = json.loads(sys.argv[1])
image = Image(small["name"], Path("/nonexistent"), Path(small["tarball"]), small["digest"])
with PodmanService() as service:
    for unlimited in (False, True):
        backend = DockerBackend(engine_client(service.base_url), image, allow_unlimited=unlimited)
        try:
            with backend.create(SandboxSpec(image=image.name, limits=Limits(disk_mb=16))) as box:
                print("ran", box.exec(["cat", "/proc/self/status"]).exit_code)
        except SandboxError as exc:
            print("refused", exc.cause, exc)
"""


def test_an_engine_that_applies_no_limits_is_refused_unless_unlimited_is_accepted(normal_user, small_image):
    """Rootless Podman on cgroup v1 (this host) cannot limit a container: the first sandbox finds out from inside."""
    runtime = normal_user.home / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.chown(runtime, normal_user.uid, normal_user.gid)
    done = normal_user.run(ENGINE, json.dumps(small_image), env={"XDG_RUNTIME_DIR": str(runtime)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    refusal, accepted = done.stdout.splitlines()[-2:]
    assert refusal.startswith("refused cgroup") and "sandbox.allow_unlimited: true" in refusal, refusal
    assert "memory" in refusal and "pids" in refusal  # names what the engine did not apply
    assert accepted == "ran 0"
