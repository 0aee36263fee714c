"""The escape suite: what a hostile policy would try from inside a sandbox, on each backend.

Every attempt is written the way an attacker writes it (shell, Python, raw syscalls
through ctypes, hand-made machine code) and must be stopped; each test says by what.
Where the stopper is the syscall filter, a control runs the same probe on the host as
an unprivileged account, outside any sandbox, to show the attempt is real: it works
there.
"""

from __future__ import annotations

import os
import platform
import secrets
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.host.identity import sandbox_identity

LIMITS = Limits(memory_mb=256, pids=64, disk_mb=16, exec_timeout_s=20, output_cap_bytes=16384)
X86_64 = platform.machine() == "x86_64"

# Raw syscalls from Python, as a C program would make them: the C library's wrappers are not in the way.
SYSCALLS = textwrap.dedent(
    """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    def s(text):
        return ctypes.cast(ctypes.c_char_p(text), ctypes.c_void_p).value
    def call(nr, *args):
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
    buf = ctypes.create_string_buffer(256)
    """
)
# x86_64 numbers; each call has arguments that succeed for an unprivileged process without a filter
# (the control below checks which ones do on this host).
PROBES = {
    "add_key": "call(248, s(b'user'), s(b'k'), s(b'v'), 1, -3)",  # kernel keyrings are not namespaced
    "keyctl": "call(250, 0, -3, 0)",
    "io_uring_setup": "call(425, 4, ctypes.addressof(buf))",
    "userfaultfd": "call(323, 1)",  # UFFD_USER_MODE_ONLY: allowed unprivileged since Linux 5.11
    "unshare_user": "call(272, 0x10000000)",  # CLONE_NEWUSER: the door to the kernel's namespaced-root code
    "clone_newuser": "call(56, 0x10000000 | 17, 0, 0, 0, 0)",  # clone(CLONE_NEWUSER|SIGCHLD)
    "mount": "call(165, s(b'none'), s(b'/tmp'), s(b'tmpfs'), 0, 0)",
    "bpf": "call(321, 0, ctypes.addressof(buf), 72)",
    "perf_event_open": "call(298, ctypes.addressof(buf), 0, -1, -1, 0)",
    "ptrace_traceme": "call(101, 0, 0, 0, 0)",
    "init_module": "call(175, ctypes.addressof(buf), 16, s(b''))",
    "finit_module": "call(313, 0, s(b''), 0)",
    "kexec_load": "call(246, 0, 0, 0, 0)",
    "settimeofday": "call(164, ctypes.addressof(buf), 0)",
    "clock_settime": "call(227, 0, ctypes.addressof(buf))",
    "setns": "call(308, 0, 0)",
    "open_by_handle_at": "call(304, -100, ctypes.addressof(buf), 0)",
    "personality_no_aslr": "call(135, 0x0040000)",
    "reboot": "call(169, 0xfee1dead, 672274793, 0x1234567, 0)",
    "swapon": "call(167, s(b'/tmp/x'), 0)",
    "syslog": "call(103, 3, ctypes.addressof(buf), 16)",
}
UNPRIVILEGED_SUCCEEDS = ("add_key", "keyctl", "io_uring_setup", "userfaultfd", "unshare_user", "clone_newuser")


@pytest.fixture(params=["bwrap", "docker"])
def backend(request, bwrap_backend):
    return bwrap_backend if request.param == "bwrap" else request.getfixturevalue("docker_backend")


@pytest.fixture
def sandbox(backend, base_image, tmp_path):
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "app.py").write_text("print('hi')\n")
    sb = backend.create(SandboxSpec(image=base_image.name, workspace=tmp_path / "seed", limits=LIMITS))
    yield sb
    sb.close()


def py(sandbox, code: str, **kwargs):
    return sandbox.exec(["python3", "-c", textwrap.dedent(code)], **kwargs)


def probe_results(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


PROBE_SCRIPT = SYSCALLS + "".join(f"print({name!r} + '=' + {expr})\n" for name, expr in PROBES.items())


# --- the syscall filter, namespaces, capabilities -----------------------------------------------
@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.skipif(not X86_64, reason="the raw syscall numbers are x86_64's")
def test_dangerous_syscalls_are_refused(sandbox):
    result = py(sandbox, PROBE_SCRIPT)
    seen = probe_results(result.stdout)
    assert set(seen) == set(PROBES), result.stderr
    allowed = {name: why for name, why in seen.items() if why == "ok"}
    assert not allowed, f"syscalls that went through: {allowed}"


@pytest.mark.pure
@pytest.mark.skipif(not X86_64, reason="the raw syscall numbers are x86_64's")
def test_control_the_same_probes_work_for_an_unprivileged_host_process():
    """Without the sandbox, an unprivileged process gets these: the filter (not luck) stops them inside."""
    uid = sandbox_identity().uid if sandbox_identity() else os.getuid()
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-"]
    done = subprocess.run(argv, input=PROBE_SCRIPT, capture_output=True, text=True, check=False, cwd="/")
    seen = probe_results(done.stdout)
    works = [name for name in UNPRIVILEGED_SUCCEEDS if seen.get(name) == "ok"]
    assert works, f"no probe works unprivileged on this host, so the control shows nothing: {seen}"


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_process_has_no_capabilities_no_new_privileges_and_a_filter(sandbox):
    status = sandbox.exec(["cat", "/proc/self/status"]).stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["CapEff"].strip() == fields["CapPrm"].strip() == "0000000000000000"
    assert fields["CapBnd"].strip() == "0000000000000000" or sandbox.backend == "docker"
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2", "no seccomp filter is installed"


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.skipif(not X86_64, reason="hand-made x86 machine code")
def test_switching_to_the_32_bit_syscall_abi_is_fatal(sandbox):
    """``int 0x80`` reaches the i386 syscall table, where a denylist for x86_64 numbers would not look."""
    code = """
    import ctypes, mmap
    # mov eax, 26 (i386 ptrace); int 0x80; ret
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(bytes([0xB8, 26, 0, 0, 0, 0xCD, 0x80, 0xC3]))
    addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
    print("returned", ctypes.CFUNCTYPE(ctypes.c_int)(addr)())
    """
    result = py(sandbox, code)
    assert "returned" not in result.stdout
    assert result.exit_code == 128 + 31 or result.exit_code == -31, result  # SIGSYS: killed by the filter


@pytest.mark.sandbox
@pytest.mark.slow
def test_nested_sandboxes_cannot_be_made(sandbox):
    result = sandbox.exec(["sh", "-c", "unshare -U -r id; unshare -n true; echo done"])
    assert result.stdout.strip() == "done"
    assert "uid=0" not in result.stdout
    assert result.stderr.count("unshare failed") == 2


@pytest.mark.sandbox
@pytest.mark.slow
def test_setuid_binaries_give_no_privilege(sandbox):
    """A setuid program runs as the sandbox user: nosuid mounts and no_new_privs, whoever owns the file."""
    result = sandbox.exec(
        ["sh", "-c", "cp /bin/sh /work/rootsh && chmod 4755 /work/rootsh; /work/rootsh -p -c 'id -u'"]
    )
    assert result.stdout.strip() == "1000"
    mounts = sandbox.exec(["cat", "/proc/self/mountinfo"]).stdout.splitlines()
    writable = {line.split()[4]: line.split()[5] for line in mounts if line.split()[5].startswith("rw")}
    assert "/work" in writable and "/tmp" in writable
    # Every writable tree is nosuid. The only exceptions are single character-device files: in a user
    # namespace runc bind-mounts the host's /dev/null, /dev/zero... (it cannot mknod) without nosuid, and
    # masks /proc/keys and the like with binds of that /dev/null. They hold no files and execve refuses
    # a device, so a setuid program cannot be placed or run there.
    without_nosuid = sorted(path for path, options in writable.items() if "nosuid" not in options)
    kinds = sandbox.exec(["stat", "-c", "%F", *without_nosuid]).stdout.splitlines() if without_nosuid else []
    assert set(kinds) <= {"character special file"}, dict(zip(without_nosuid, kinds, strict=False))
    # where the agent can make files, device nodes mean nothing either (/dev itself holds the few it may use)
    assert all("nodev" in writable[path] for path in ("/work", "/tmp")), writable


# --- the kernel's knobs and info ----------------------------------------------------------------
@pytest.mark.sandbox
@pytest.mark.slow
def test_host_sysctls_cannot_be_written(sandbox):
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    attempts = {
        "/proc/sys/kernel/core_pattern": "|/work/evil %p",
        "/proc/sys/fs/suid_dumpable": "2",
        "/proc/sys/fs/lease-break-time": "7",
        "/proc/sys/kernel/core_uses_pid": "1",
    }
    code = f"import os\nfor path, value in {attempts!r}.items():\n" + (
        "    try:\n        fd = os.open(path, os.O_WRONLY)\n        os.write(fd, value.encode())\n"
        "        print('wrote', path)\n    except OSError as exc:\n        print('refused', path, exc.strerror)\n"
    )
    result = py(sandbox, code)
    assert "wrote" not in result.stdout
    assert result.stdout.count("refused") == len(attempts)
    # stopped twice over: the sandbox user is no host root (DAC), and /proc/sys is a read-only mount (below)
    reasons = {line.split(" ", 2)[2] for line in result.stdout.splitlines()}
    assert reasons <= {"Permission denied", "Read-only file system"}, reasons
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


@pytest.mark.sandbox
@pytest.mark.slow
def test_kernel_info_files_are_masked(sandbox):
    present = [p for p in ("/proc/keys", "/proc/timer_list", "/proc/kcore", "/proc/sched_debug") if Path(p).exists()]
    result = sandbox.exec(["sh", "-c", " ".join(f"head -c 64 {p} 2>/dev/null | wc -c;" for p in present)])
    assert result.stdout.split() == ["0"] * len(present)
    mounts = sandbox.exec(["cat", "/proc/self/mountinfo"]).stdout.splitlines()
    sys_mounts = [line.split() for line in mounts if line.split()[4] == "/sys"]
    assert all(fields[5].startswith("ro") for fields in sys_mounts), "/sys is writable"  # bwrap: no /sys at all


@pytest.mark.sandbox
@pytest.mark.slow
def test_sysrq_and_proc_sys_are_read_only_mounts(sandbox):
    mounts = sandbox.exec(["cat", "/proc/self/mountinfo"]).stdout
    proc_sys = [line for line in mounts.splitlines() if line.split()[4] == "/proc/sys"]
    assert proc_sys and all(" ro," in line or " ro " in line for line in proc_sys)


# --- the host: files, environment, processes, network, engine -----------------------------------
@pytest.mark.sandbox
@pytest.mark.slow
def test_host_files_environment_and_root_home_are_out_of_reach(sandbox, monkeypatch, tmp_path):
    secret = Path("/root") / f".tf-escape-canary-{os.getpid()}"
    secret.write_text("host-secret")
    monkeypatch.setenv("TF_ESCAPE_SECRET", "hunter2")
    try:
        result = sandbox.exec(
            ["sh", "-c", f"cat {secret}; cat /proc/1/environ; env; cat /root/.bashrc; ls /root; cat /etc/hostname"]
        )
    finally:
        secret.unlink()
    assert "host-secret" not in result.stdout
    assert "hunter2" not in result.stdout
    assert "TF_ESCAPE_SECRET" not in result.stdout
    assert "Permission denied" in result.stderr  # the image's /root: the sandbox user is nobody's root


@pytest.mark.sandbox
@pytest.mark.slow
def test_host_processes_are_invisible_and_unsignalable(sandbox):
    me = os.getpid()
    result = py(
        sandbox,
        f"""
        import os, signal
        pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]
        print('count', len(pids))
        print('sees_host', {me} in pids)
        try:
            os.kill({me}, signal.SIGKILL)
            print('killed')
        except OSError as exc:
            print('refused', exc.strerror)
        """,
    )
    assert "sees_host False" in result.stdout
    assert "killed" not in result.stdout
    assert int(result.stdout.split("count ")[1].split()[0]) < 10


@pytest.mark.sandbox
@pytest.mark.slow
def test_ptrace_of_another_sandbox_process_is_refused(sandbox):
    result = py(
        sandbox,
        """
        import ctypes, os, time
        libc = ctypes.CDLL(None, use_errno=True)
        child = os.fork()
        if child == 0:
            time.sleep(5); os._exit(0)
        r = libc.ptrace(16, child, 0, 0)  # PTRACE_ATTACH
        print('attach', r, os.strerror(ctypes.get_errno()))
        with open(f'/proc/{child}/mem', 'rb') as fh:
            pass
        """,
    )
    assert "attach -1" in result.stdout
    os.kill(os.getpid(), 0)  # the host test process is untouched


@pytest.mark.sandbox
@pytest.mark.slow
def test_host_loopback_and_outside_network_are_unreachable(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted: list[object] = []
    server.settimeout(5)
    waiter = threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True)
    waiter.start()
    try:
        result = py(
            sandbox,
            f"""
            import socket
            try:
                socket.create_connection(('127.0.0.1', {port}), timeout=3); print('reached host loopback')
            except OSError as exc:
                print('loopback', exc.strerror or exc)
            print(open('/proc/net/route').read())
            print(open('/proc/net/dev').read())
            """,
        )
    finally:
        waiter.join(timeout=10)
        server.close()
    assert "reached" not in result.stdout
    assert accepted == [None]
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line and "|" not in line]
    assert set(interfaces) <= {"lo"}, f"a network interface besides loopback: {interfaces}"
    routes = [line for line in result.stdout.splitlines() if line.startswith(("eth", "tap", "ens", "veth"))]
    assert not routes


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _accept(server: socket.socket):
    try:
        conn, _ = server.accept()
        conn.close()
        return "connected"
    except OSError:
        return None


@pytest.mark.sandbox
@pytest.mark.slow
def test_container_engine_sockets_are_absent(sandbox):
    sockets = ["/run/podman/podman.sock", "/var/run/docker.sock", "/run/docker.sock", "/run/trialforge"]
    sockets += [str(p) for p in Path(os.environ.get("TRIALFORGE_STATE_DIR", "/nonexistent")).glob("podman-*/*.sock")]
    result = sandbox.exec(["sh", "-c", " ".join(f"test -e {s} && echo present {s};" for s in sockets) + " true"])
    assert "present" not in result.stdout


@pytest.mark.sandbox
@pytest.mark.slow
def test_another_sandboxs_files_and_processes_are_out_of_reach(backend, base_image, tmp_path, sandbox):
    other = backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    try:
        other.write_file("secret.txt", b"other-secret")
        tag = f"4.{secrets.randbelow(10**8)}"  # sleep's unique argument: how to recognise the other's process
        sleeper = threading.Thread(target=lambda: other.exec(["sleep", tag]))
        sleeper.start()
        home = getattr(other, "workspace", None)
        probe = f"cat {home}/secret.txt 2>&1; " if home else ""
        for _ in range(500):  # until the other sandbox's process runs
            if any(f"sleep\0{tag}".encode() in _cmdline(p) for p in Path("/proc").glob("[0-9]*")):
                break
            time.sleep(0.01)
        result = sandbox.exec(["sh", "-c", probe + "grep -l other-secret -r / 2>/dev/null | head; ps -eo args"])
        sleeper.join()
    finally:
        other.close()
    assert "other-secret" not in result.stdout
    assert f"sleep {tag}" not in result.stdout


# --- files that leave the sandbox -----------------------------------------------------------------
@pytest.mark.sandbox
@pytest.mark.slow
def test_exported_files_carry_no_setuid_devices_fifos_or_escaping_links(sandbox, tmp_path):
    sandbox.exec(
        [
            "sh",
            "-c",
            "cp /bin/sh /work/rootsh && chmod 6755 /work/rootsh; mkfifo /work/pipe; "
            "ln -s /etc/shadow /work/abs; ln -s ../../../../etc/passwd /work/rel; ln -s app.py /work/ok; "
            "mkdir -p /work/d && chmod 2777 /work/d",
        ]
    )
    out = tmp_path / "export"
    sandbox.export_workspace(out)
    snap = sandbox.snapshot()
    shown = sorted(p.name for p in out.iterdir())
    assert "pipe" not in shown and "abs" not in shown and "rel" not in shown
    assert os.readlink(out / "ok") == "app.py"
    mode = (out / "rootsh").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID)
    assert not (out / "d").stat().st_mode & (stat.S_ISGID | stat.S_IWOTH)
    sandbox.restore(snap)
    again = sandbox.exec(["sh", "-c", "ls /work; stat -c %a /work/rootsh"])
    assert "pipe" not in again.stdout and "abs" not in again.stdout
    assert again.stdout.split()[-1] == "755"


@pytest.mark.sandbox
@pytest.mark.slow
def test_host_side_reads_and_writes_never_follow_links_out(sandbox):
    sandbox.exec(["sh", "-c", "ln -s /etc /work/etc; ln -s /etc/passwd /work/pw"])
    for path in ("pw", "etc/passwd", "../etc/passwd"):
        with pytest.raises(Exception):  # noqa: B017 - SandboxError or FileNotFoundError, never the host's file
            data = sandbox.read_file(path)
            assert b"root:" not in data
    with pytest.raises(Exception):  # noqa: B017
        sandbox.write_file("etc/tf-escaped", b"x")
    assert not Path("/etc/tf-escaped").exists()


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the host account question arises only when trialforge is root")
def test_files_the_sandbox_writes_belong_to_no_host_user_that_owns_anything(bwrap_backend, base_image):
    """Each sandbox is a host uid of its own, leased from the sandbox account's subordinate range (as Podman's
    containers are), and given back when it closes."""
    sb = bwrap_backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    other = bwrap_backend.create(SandboxSpec(image=base_image.name, limits=LIMITS))
    try:
        sb.exec(["sh", "-c", "echo x > /work/made"])
        owner = os.lstat(sb.workspace / "made").st_uid
        lease = sb.lease
        other_uid = other.lease.uid
    finally:
        sb.close()
        other.close()
    ids = bwrap_backend.ids
    assert owner == lease.uid != 0 and owner != other_uid
    assert ids.first_uid <= owner < ids.first_uid + ids.count and owner != sandbox_identity().uid
    assert not lease.path.is_symlink()  # given back
    assert (
        subprocess.run(
            # nothing on the host belongs to it (its places were tmpfs, off this filesystem, and are gone)
            ["find", "/", "-xdev", "-path", "*/sandboxes/tf-*", "-prune", "-o", "-user", str(owner), "-print", "-quit"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        ).stdout.strip()
        == ""
    )


# --- resources ------------------------------------------------------------------------------------------
@pytest.mark.sandbox
@pytest.mark.slow
def test_fork_bomb_is_bounded_and_the_sandbox_recovers(sandbox):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = sandbox.exec(["python3", "-c", bomb], timeout=5)
    assert result.timed_out or result.exit_code != 0
    assert sandbox.exec(["echo", "alive"]).stdout == "alive\n"
    count = sandbox.exec(["sh", "-c", "ls /proc | grep -c '^[0-9]'"]).stdout.strip()
    assert int(count) < 10


@pytest.mark.sandbox
@pytest.mark.slow
def test_memory_past_the_limit_is_killed(sandbox):
    result = py(sandbox, "x = bytearray(1024 * 1024 * 1024); print('allocated')")
    assert "allocated" not in result.stdout
    assert result.exit_code != 0


@pytest.mark.sandbox
@pytest.mark.slow
def test_disk_past_the_quota_fails(sandbox):
    result = sandbox.exec(
        ["sh", "-c", "head -c 64M /dev/zero > /work/big; echo rc=$?; head -c 64M /dev/zero > /tmp/big"]
    )
    assert "rc=0" not in result.stdout
    assert "No space left" in result.stderr


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_host_clock_cannot_be_set(sandbox):
    before = os.popen("date +%Y").read()
    result = sandbox.exec(["sh", "-c", "date -s '2001-01-01 00:00:00'; echo rc=$?"])
    assert "rc=0" not in result.stdout
    assert os.popen("date +%Y").read() == before


# --- the CPU counter cost is computed from ---------------------------------------------------------------
@pytest.mark.sandbox
@pytest.mark.slow
def test_cpu_used_is_counted_outside_the_sandbox_children_included_and_its_code_cannot_reset_it(sandbox):
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    before = sandbox.cpu_s()
    assert before is not None  # root: a bwrap sandbox has its cgroup; a container, the engine's stats
    result = sandbox.exec(["sh", "-c", f"python3 -c '{burn}' & python3 -c '{burn}'; wait"])
    assert result.ok, result.stderr
    used = sandbox.cpu_s() - before
    assert used >= 0.8  # two processes of 0.4 s each, one of them a background child
    # cgroup v1 lets a writer zero cpuacct.usage: bwrap mounts no cgroup filesystem, a container's is read-only
    reset = "for f in /sys/fs/cgroup/cpuacct/cpuacct.usage /sys/fs/cgroup/cpu.stat; do echo 0 > $f; done"
    sandbox.exec(["sh", "-c", reset])
    assert sandbox.cpu_s() - before >= used
    sandbox.close()
    assert sandbox.cpu_s() is None  # closed: nothing to ask
