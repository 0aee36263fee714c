"""A sandbox cannot exhaust its host: each attempt a runaway or hostile policy makes, on both backends.

Every writable place is a tmpfs of its share of the disk quota (bytes and inodes); whatever the
host copies out (exports, snapshots, restores, file reads) is charged to that quota as it is read,
so a sparse file, a file under many hard links, a flood of files or a deep tree cannot make the
host write or hold more; each sandbox is a host uid of its own, so per-user kernel limits never
cross sandboxes; IPC objects never outlive a reset; no host environment reaches a sandbox's pid 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trialforge.errors import SandboxError
from trialforge.sandbox import disk
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.hostcopy import MAX_DEPTH
from trialforge.sandbox.oci_limits import PTYS, USERNS_LIMITS

LIMITS = Limits(memory_mb=256, pids=64, disk_mb=16, exec_timeout_s=60, output_cap_bytes=65536)
MIB = 1 << 20


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
def backend(request, bwrap_backend):
    return bwrap_backend if request.param == "bwrap" else request.getfixturevalue("docker_backend")


@pytest.fixture
def sandbox(backend, base_image):
    sb = backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    yield sb
    sb.close()


def py(sandbox, code: str, **kwargs):
    return sandbox.exec(["python3", "-c", textwrap.dedent(code)], **kwargs)


def host_bytes(tree: Path) -> int:
    """What a tree holds on the host: each inode's size once (hard links share one)."""
    seen: dict[tuple[int, int], int] = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in [*dirnames, *filenames]:
            info = os.lstat(Path(dirpath) / name)
            seen[(info.st_dev, info.st_ino)] = info.st_size
    return sum(seen.values())


# --- every writable place is inside the disk budget ---------------------------------------------------------
FIND_WRITABLE = """
import os
mounts = sorted((l.split()[4] for l in open('/proc/self/mountinfo')), key=len, reverse=True)
def mount_of(path):
    return next(m for m in mounts if path == m or path.startswith(m.rstrip('/') + '/'))
found = set()
for top, dirs, files in os.walk('/'):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in ('/proc', '/sys')]
    if os.access(top, os.W_OK):
        found.add(mount_of(top))
print('\\n'.join(sorted(found)))
"""
FILL = """
import os, sys
written = files = 0
for place in sys.argv[1:]:
    fd = os.open(os.path.join(place, 'fill'), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            written += os.write(fd, b'x' * 65536)
    except OSError:
        pass
    try:
        while True:
            open(os.path.join(place, f'f{files}'), 'w').close()
            files += 1
    except OSError:
        pass
print(written, files)
"""


@pytest.mark.pure
def test_the_disk_plan_sums_inside_the_quota_at_any_size():
    for disk_mb in (1, 4, 16, 100, 256, 4096):
        places = disk.places(Limits(disk_mb=disk_mb))
        assert sum(p.size_bytes for p in places) == disk_mb * MIB
        assert sum(p.inodes for p in places) <= disk_mb * disk.INODES_PER_MIB
        assert [p.path for p in places] == ["/work", "/tmp", "/var/tmp", "/dev/shm", "/run"]


@pytest.mark.sandbox
def test_every_writable_place_is_inside_the_disk_budget(sandbox):
    """The sandbox user can write in the four places only (and the kernel's message queues), and everything it can
    write there, bytes and files together, stays inside the quota: /dev/shm, /tmp, /var/tmp, /work included."""
    writable = set(py(sandbox, FIND_WRITABLE, timeout=120).stdout.split())
    places = {p.path for p in disk.scratch(LIMITS)} | {"/work"}
    assert writable - {"/dev/mqueue"} == places, writable  # no other mount: not /dev, /run, the image
    result = sandbox.exec(["python3", "-c", FILL, *sorted(places)], timeout=120)
    written, files = map(int, result.stdout.split())
    assert written <= LIMITS.disk_mb * MIB, result
    assert files <= LIMITS.disk_mb * disk.INODES_PER_MIB, result
    assert written >= disk.workspace(LIMITS).size_bytes // 2 and files > 100  # it did write: the bounds stopped it
    if "/dev/mqueue" in writable:  # a queue holds no file data; their number and bytes are the kernel's per-user
        queues = sandbox.exec(
            ["sh", "-c", "i=0; while touch /dev/mqueue/q$i 2>/dev/null; do i=$((i+1)); done; echo $i"]
        )
        assert int(queues.stdout) <= 256  # fs.mqueue.queues_max per IPC namespace; RLIMIT_MSGQUEUE stops it sooner


@pytest.mark.sandbox
def test_a_sandbox_holds_no_more_than_its_share_of_the_hosts_terminals(sandbox):
    """The kernel's terminals are one pool for the host (kernel.pty.max): each sandbox's /dev/pts has its own limit."""
    code = "import os\nn = 0\ntry:\n    while True:\n        os.openpty(); n += 1\nexcept OSError:\n    print(n)"
    assert py(sandbox, code).stdout.split() == [str(PTYS)]


# --- host-side copies are bounded by the quota as they are read ---------------------------------------------
SHAPED = "truncate -s 1G sparse && head -c 4M /dev/urandom > big && for i in $(seq 31); do ln big l$i; done"


@pytest.mark.sandbox
def test_a_sparse_file_stops_exports_snapshots_and_reads_at_the_quota(sandbox, backend, tmp_path):
    assert sandbox.exec(["sh", "-c", SHAPED]).exit_code == 0
    snapshots = list(backend.snapshot_dir.glob("*")) if backend.snapshot_dir.exists() else []
    for copy in (lambda: sandbox.export_workspace(tmp_path / "export"), sandbox.snapshot):
        with pytest.raises(SandboxError, match=r"sandbox\.disk_mb") as err:
            copy()
        assert err.value.cause == "quota" and "sparse" in str(err.value)
    with pytest.raises(SandboxError, match=r"sandbox\.disk_mb") as err:
        sandbox.read_file("sparse")
    assert err.value.cause == "quota"
    written = host_bytes(tmp_path / "export") if (tmp_path / "export").exists() else 0
    assert written <= disk.workspace(LIMITS).size_bytes
    left = list(backend.snapshot_dir.glob("*")) if backend.snapshot_dir.exists() else []
    assert left == snapshots  # never half a snapshot


@pytest.mark.sandbox
def test_hard_links_are_copied_once(sandbox, tmp_path):
    assert sandbox.exec(["sh", "-c", SHAPED + " && rm /work/sparse"]).exit_code == 0
    sandbox.export_workspace(tmp_path / "export")
    assert host_bytes(tmp_path / "export") == 4 * MIB  # 32 names, one file on the host
    assert (tmp_path / "export" / "big").stat().st_nlink == 32
    snap = sandbox.snapshot()
    sandbox.exec(["sh", "-c", "rm /work/*"])
    sandbox.restore(snap)
    assert sandbox.exec(["stat", "-c", "%h %s", "/work/l7"]).stdout.split() == ["32", str(4 * MIB)]


@pytest.mark.sandbox
def test_a_file_flood_stops_at_the_inode_limit_and_a_deep_tree_at_the_depth_limit(sandbox, tmp_path):
    flood = sandbox.exec(["sh", "-c", "i=0; while touch /work/f$i 2>/dev/null; do i=$((i+1)); done; echo $i"])
    assert int(flood.stdout) < disk.workspace(LIMITS).inodes  # its root and a few directories take some
    sandbox.export_workspace(tmp_path / "flood")  # what fits the tmpfs fits the copy
    assert len(os.listdir(tmp_path / "flood")) == int(flood.stdout)
    deep = f"rm -f f* && for i in $(seq {MAX_DEPTH + 2}); do mkdir d && cd d; done && echo bottom > leaf"
    assert sandbox.exec(["sh", "-c", deep]).exit_code == 0
    with pytest.raises(SandboxError, match=f"deeper than {MAX_DEPTH} directories") as err:
        sandbox.export_workspace(tmp_path / "deep")
    assert err.value.cause == "quota"


@pytest.mark.sandbox
def test_a_restore_that_cannot_fit_is_a_quota_error(backend, base_image, sandbox):
    """A snapshot of a bigger sandbox into a smaller one: refused with the limit named (an env_error), never OSError."""
    assert sandbox.exec(["sh", "-c", "head -c 6M /dev/urandom > /work/six"]).exit_code == 0
    snap = sandbox.snapshot()
    small = LIMITS.model_copy(update={"disk_mb": 4})
    try:
        with pytest.raises(SandboxError, match=r"sandbox\.disk_mb=4") as err:
            backend.from_snapshot(snap, SandboxSpec(image=base_image.name, limits=small))
        assert err.value.cause == "quota"
        target = backend.create(SandboxSpec(image=base_image.name, limits=small))
        try:
            with pytest.raises(SandboxError, match=r"sandbox\.disk_mb=4"):
                target.restore(snap)
            assert target.exec(["true"]).exit_code == 0  # still usable
        finally:
            target.close()
    finally:
        backend.release(snap)


@pytest.mark.sandbox
def test_a_seed_bigger_than_the_workspace_is_refused_before_the_sandbox_starts(backend, base_image, tmp_path):
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "big").write_bytes(os.urandom(5 * MIB))
    with pytest.raises(SandboxError, match=r"sandbox\.disk_mb=4") as err:
        backend.create(
            SandboxSpec(image=base_image.name, workspace=seed, limits=LIMITS.model_copy(update={"disk_mb": 4}))
        )
    assert err.value.cause == "quota"


@pytest.mark.sandbox
def test_a_tool_write_past_the_quota_is_a_quota_error_not_an_os_error(sandbox):
    """Too big for /work at all, or for what is left of it: both the policy's doing (an observation, not a fault)."""
    with pytest.raises(SandboxError, match=r"sandbox\.disk_mb") as err:
        sandbox.write_file("huge", b"x" * (disk.workspace(LIMITS).size_bytes + MIB))
    assert err.value.cause == "quota"
    assert sandbox.exec(["sh", "-c", "head -c 9M /dev/zero > /work/nine"]).exit_code == 0
    with pytest.raises(SandboxError, match="No space left") as err:
        sandbox.write_file("more", b"x" * 4 * MIB)
    assert err.value.cause == "quota"
    assert sandbox.exec(["true"]).exit_code == 0


# --- one identity per sandbox: per-user kernel limits never cross --------------------------------------------
# Takes inotify instances until refused, then says how many in its name (``comm``: the host sees it) and waits.
HOLD_INOTIFY = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
held = 0
while libc.inotify_init() >= 0:
    held += 1
libc.prctl(15, f'held-{held}'.encode(), 0, 0, 0)  # PR_SET_NAME
time.sleep(float(sys.argv[1]))
"""


@pytest.mark.sandbox
def test_one_sandbox_holding_every_inotify_instance_of_its_uid_leaves_the_next_one_its_own(backend, base_image):
    tag = f"{secrets.randbelow(10**6) + 30}.{secrets.randbelow(10**6)}"  # sleep's unique argument: how to find it
    first = backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    second = backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    try:
        holder = threading.Thread(target=_quietly, args=(first.exec, ["python3", "-c", HOLD_INOTIFY, tag], 120))
        holder.start()
        process, held = _wait_for_holder(tag)
        result = py(second, "import ctypes; print(ctypes.CDLL(None, use_errno=True).inotify_init())")
        on_host = ctypes.CDLL(None, use_errno=True).inotify_init()  # and the host's own (as root: Podman's owner)
        first_uid = _host_uid(process)
        other = _uid_while_running(second, f"sleep 3{tag}")
    finally:
        first.close()  # ends the holder
        holder.join()
        second.close()
    assert held >= USERNS_LIMITS["max_inotify_instances"]  # as many as a host user may hold, or more
    assert int(result.stdout) >= 0, result  # the first sandbox is at its limit; the second is counted apart
    assert on_host >= 0  # so is the host (Podman's containers are root's: each has a limit of its own)
    os.close(on_host)
    assert first_uid != other and 0 not in (first_uid, other)


def _wait_for_holder(tag: str) -> tuple[Path, int]:
    """The host's view of the holder running with ``tag`` once it has taken all it could, and how many it took."""
    for _ in range(6000):
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if tag.encode() in (proc / "cmdline").read_bytes() and (name := (proc / "comm").read_text()).startswith(
                    "held-"
                ):
                    return proc, int(name.strip().removeprefix("held-"))
            except OSError:
                continue
        time.sleep(0.01)
    raise AssertionError("the sandboxed process never took its inotify instances")


def _quietly(run, argv: list[str], timeout: float) -> None:
    """Run a command that the test ends by closing its sandbox (which makes ``exec`` raise)."""
    with contextlib.suppress(SandboxError):
        run(argv, timeout=timeout)


def _uid_while_running(sandbox, cmdline: str) -> int:
    """The host uid of ``cmdline`` (unique on this host) run in ``sandbox``, looked up while it runs."""
    thread = threading.Thread(target=_quietly, args=(sandbox.exec, cmdline.split(), 2.0))
    thread.start()
    try:
        for _ in range(3000):
            for proc in Path("/proc").glob("[0-9]*"):
                try:
                    if (proc / "cmdline").read_bytes().replace(b"\0", b" ").strip() == cmdline.encode():
                        return _host_uid(proc)
                except OSError:
                    continue
            time.sleep(0.01)
        raise AssertionError(f"{cmdline!r} never ran in {sandbox.id}")
    finally:
        thread.join()


def _host_uid(proc: Path) -> int:
    status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line)
    return int(status["Uid"].split()[0])


# --- the terminal, IPC and the environment -------------------------------------------------------------------
TIOCSTI = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
c = ctypes.c_char(b'x')
for request in (0x5412, 0x100005412, 0xFFFFFFFF00005412, 0x541C, 0x10000541C):
    ctypes.set_errno(0)
    libc.syscall(ctypes.c_long(16), ctypes.c_long(0), ctypes.c_long(request), ctypes.byref(c))  # ioctl(0, ...)
    print(hex(request), os.strerror(ctypes.get_errno()))
"""


@pytest.mark.sandbox
def test_terminal_injection_is_refused_whatever_the_upper_32_bits_of_the_request(sandbox):
    """The kernel reads an ioctl request as 32 bits: ``0x100005412`` is TIOCSTI. The filter masks it the same way."""
    result = py(sandbox, TIOCSTI)
    errors = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert len(errors) == 5 and set(errors.values()) == {"Operation not permitted"}, result


IPC_OBJECTS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print('shm', libc.shmget(0x7f01, 1 << 20, 0o1600) >= 0)      # IPC_CREAT | 0600
print('sem', libc.semget(0x7f02, 4, 0o1600) >= 0)
print('msg', libc.msgget(0x7f03, 0o1600) >= 0)
open('/dev/shm/posix-shm', 'wb').write(b'x' * 4096)
if os.path.isdir('/dev/mqueue'):
    open('/dev/mqueue/queue', 'w').close()
"""
IPC_LEFT = "ipcs -m -s -q | grep -c '^0x' ; ls -A /dev/shm /dev/mqueue 2>/dev/null | grep -v ':$' | grep -c ."


@pytest.mark.sandbox
def test_ipc_objects_do_not_outlive_a_reset(sandbox):
    made = py(sandbox, IPC_OBJECTS)
    assert made.stdout.split() == ["shm", "True", "sem", "True", "msg", "True"], made
    sandbox.reset(None)
    assert sandbox.exec(["sh", "-c", IPC_LEFT]).stdout.split() == ["0", "0"]


@pytest.mark.sandbox
def test_no_host_environment_reaches_pid_1(sandbox, monkeypatch, tmp_path):
    here = tmp_path / f"owner-cwd-{secrets.token_hex(4)}"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("TF_HOST_CANARY", "canary-value")
    result = sandbox.exec(["sh", "-c", "tr '\\0' '\\n' < /proc/1/environ"])
    keys = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    assert here.name not in result.stdout and "canary" not in result.stdout
    assert "PWD" not in keys and "OLDPWD" not in keys
    assert keys <= {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "HOSTNAME", "container", "TERM"}, keys
