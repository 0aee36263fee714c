"""pytest plugin: trialforge run for real as a normal user, with or without a cgroup subtree delegated to it.

The suite runs as root; what a normal user gets (a user namespace per sandbox holding its ids and
mounts, limits from a delegated cgroup, a refusal without one) is only shown by being one. The
``normal_user`` fixture creates an account (``useradd`` gives it its subordinate ids, as on any
Debian or Ubuntu host) for the session and removes it, with its home and anything it left running,
afterwards. ``NormalUser.run`` runs Python code as that user; ``delegated_cgroup`` makes a subtree of
this process's own cgroups, chowned to the user, and ``run`` starts the code inside it (what a systemd
user slice, or an administrator's delegation, does for a login session).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trialforge.sandbox.bwrap import cgroups

SRC = Path(__file__).resolve().parents[2] / "src"


@dataclass(frozen=True)
class NormalUser:
    name: str
    uid: int
    gid: int
    home: Path

    def run(
        self,
        code: str,
        *args: str,
        cgroup: list[Path] | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 300,
        background: bool = False,
    ) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
        """Run ``code`` (Python) as this user, inside ``cgroup`` when given, with this suite's interpreter."""
        enter = 'for d in $TF_CGROUP; do echo $$ > "$d/cgroup.procs" || exit 99; done; exec "$@"'
        argv = [*_interpreter_in_reach(), "sh", "-c", enter, "enter"]
        argv += ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", sys.executable, "-c", code]
        argv += args
        full_env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.home),
            "TF_CGROUP": " ".join(map(str, cgroup or [])),
            "TRIALFORGE_CACHE": os.environ.get("TRIALFORGE_CACHE", "/var/cache/trialforge"),
            "TRIALFORGE_STATE_DIR": str(self.home / "state"),
            "PYTHONPATH": str(SRC),
            **(env or {}),
        }
        if background:
            return subprocess.Popen(argv, env=full_env, cwd="/", stdout=subprocess.PIPE, text=True)
        return subprocess.run(argv, env=full_env, cwd="/", capture_output=True, text=True, timeout=timeout, check=False)

    def processes(self) -> list[int]:
        return [pid for pid, uid in _process_uids() if uid == self.uid]


def _interpreter_in_reach() -> list[str]:
    """A prefix that lets the user reach this suite's interpreter: where it lives under a directory closed to others
    (a pyenv under /root), a private mount namespace shows that directory as an open tmpfs holding just it."""
    prefix = Path(sys.base_prefix)
    closed = next((p for p in reversed(prefix.parents) if p != Path("/") and not p.stat().st_mode & 0o001), None)
    if closed is None:
        return []
    keep = prefix.relative_to(closed).parts[0]
    show = (
        'exec 3< "$1/$2" && mount -t tmpfs -o mode=0755 tf "$1" && mkdir "$1/$2"'
        ' && mount --no-canonicalize --bind /proc/self/fd/3 "$1/$2" && exec 3<&- && shift 2 && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation=private", "sh", "-c", show, "show", str(closed), keep]


def running(cmdline: str) -> bool:
    """Whether a process with exactly ``cmdline`` (NULs as spaces) runs on this host (as anyone)."""
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip() == cmdline:
                return True
    return False


def _process_uids() -> Iterator[tuple[int, int]]:
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            yield int(proc.name), proc.stat().st_uid


@pytest.fixture(scope="session")
def normal_user(base_image) -> Iterator[NormalUser]:
    if os.geteuid() != 0:
        pytest.skip("creating a normal user needs root")
    name = f"tf-u{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    entry = pwd.getpwnam(name)
    user = NormalUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    try:
        yield user
    finally:
        for _ in range(1000):  # what this suite started as the user (rootless Podman's pause process among them)
            if not (left := user.processes()):
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)  # until they have exited: userdel refuses a user that still runs something
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
        shutil.rmtree(user.home, ignore_errors=True)  # what rootless Podman stored under other ids
        for entry in Path(tempfile.gettempdir()).iterdir():  # and its run dir, made again by a late cleanup process
            with contextlib.suppress(OSError):
                if entry.lstat().st_uid == user.uid and entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)


@pytest.fixture
def delegated_cgroup(normal_user: NormalUser) -> Iterator[list[Path]]:
    """A child of this process's own groups, one per controller, chowned to the user; removed afterwards."""
    dirs = cgroups.SandboxCgroup.paths(f"tf-deleg-{secrets.token_hex(4)}")
    for d in dirs:
        d.mkdir()
        for path in (d, d / "cgroup.procs", *([d / "tasks"] if (d / "tasks").exists() else [])):
            os.chown(path, normal_user.uid, normal_user.gid)
    try:
        yield dirs
    finally:
        for d in dirs:  # the user's own groups first (a test that failed may leave them), deepest first
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                cgroups.SandboxCgroup(sub.name, [sub], v1=True).remove()
            cgroups.SandboxCgroup(d.name, [d], v1=True).remove()
