"""Where an unprivileged bwrap sandbox keeps its identity and its disk: a user and mount namespace of its own.

A normal user can neither mount on the host nor run as a leased host uid, so each sandbox gets a *holder*: a
process in a new user namespace (uid/gid 0 the user, 1 the sandbox's leased subordinate ids) and mount namespace
whose ``/tmp`` is ``ROOT``: the rootfs read-only at ``ROOT/rootfs``, each place a sized tmpfs at ``ROOT/<name>``
owned by uid 1, a devpts at ``ROOT/pts``. Commands enter both and drop to uid 1 before bwrap; host-side copies run
in a forked child that joins them (``run``). The holder exits when its owner's pipe closes, taking the mounts.
Why and how: docs/security.md, "The holder of a normal user's sandbox".
"""

from __future__ import annotations

import ctypes
import os
import pickle
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from trialforge.errors import SandboxError
from trialforge.sandbox.bwrap.confinement import tool
from trialforge.sandbox.disk import PTS_OPTIONS, Place

INNER_ID = 1  # the sandbox's uid and gid inside the holder's namespace
ROOT = Path("/tmp")  # in the holder's mount namespace: the sandbox's rootfs and places, and nothing else
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
# $1: the image's rootfs (held open on fd 3, since it may be under /tmp); then "NAME OPTIONS" pairs, one per place.
# The owner's go-ahead arrives once the id maps are written; the holder then waits for its stdin to close.
HOLDER_SCRIPT = """
echo up
read go || exit 1
exec 3< "$1" && shift
mount -t tmpfs -o size=64k,nr_inodes=64,mode=0755 trialforge /tmp || exit 1
mkdir /tmp/rootfs && mount --no-canonicalize --bind /proc/self/fd/3 /tmp/rootfs && exec 3<&- || exit 1
mkdir /tmp/pts && mount -t devpts -o "newinstance,$PTS_OPTIONS" devpts /tmp/pts || exit 1
while [ $# -gt 1 ]; do mkdir "/tmp/$1" && mount -t tmpfs -o "$2" trialforge "/tmp/$1" || exit 1; shift 2; done
echo ready
read _
"""
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


class Holder:
    """The namespaces of one unprivileged sandbox, held by a process that lives while its owner keeps it."""

    def __init__(self, rootfs: Path, places: Sequence[Place], uid: int, gid: int) -> None:
        """Start the holder: ``rootfs`` at ``ROOT/rootfs``, ``places`` at ``ROOT/<name>``, for host ``uid``, ``gid``."""
        mounts = []
        for place in places:
            mounts += [place.name, f"{place.tmpfs_options()},uid={INNER_ID},gid={INNER_ID},nosuid,nodev"]
        self.proc = subprocess.Popen(
            [
                *("unshare", "--user", "--mount", "--propagation=private"),
                *("sh", "-c", HOLDER_SCRIPT, "holder", str(rootfs), *mounts),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PTS_OPTIONS": PTS_OPTIONS},
            cwd="/",
        )
        try:
            self._expect("up")
            me_uid, me_gid = os.getuid(), os.getgid()
            for tool, own, sub in (("newuidmap", me_uid, uid), ("newgidmap", me_gid, gid)):
                done = subprocess.run(
                    [tool, str(self.proc.pid), "0", str(own), "1", str(INNER_ID), str(sub), "1"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if done.returncode != 0:
                    raise SandboxError(f"{tool} refused the sandbox's ids: {done.stderr.strip()}", cause="sandbox_user")
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.flush()
            self._expect("ready")
        except BaseException:
            self.close()
            raise

    def _expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode(errors="replace").strip()
        if line != word:
            self.proc.kill()
            why = self.proc.stderr.read().decode(errors="replace").strip() if self.proc.stderr else ""
            raise SandboxError(f"the sandbox's namespace holder failed: {why or line or 'no answer'}", cause="start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def prefix(self) -> list[str]:
        """Argv prefix that runs the rest inside the holder's namespaces, as its root (the owner, no more)."""
        return [tool("nsenter"), f"--target={self.proc.pid}", "--user", "--mount", "--"]

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a forked child inside the holder's namespaces; its result or error comes back pickled.

        Open host directories before calling and pass their fds: the child sees the holder's mounts, and fds
        opened outside stay valid inside.
        """
        if not self.alive():
            raise SandboxError("the sandbox's namespace holder is gone", cause="died")
        userns = os.open(f"/proc/{self.proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        mntns = os.open(f"/proc/{self.proc.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        read_end, write_end = os.pipe()
        try:
            child = os.fork()
            if child == 0:  # single-threaded from here: setns into a user namespace requires it
                os.close(read_end)
                _child(userns, mntns, write_end, fn, args)
            os.close(write_end)
            with os.fdopen(read_end, "rb") as answer:
                payload = answer.read()
            os.waitpid(child, 0)
        finally:
            os.close(userns)
            os.close(mntns)
        if not payload:
            raise SandboxError("a host-side copy in the sandbox's namespace died", cause="died")
        kind, value = pickle.loads(payload)
        if kind == "ok":
            return value  # type: ignore[no-any-return]
        error_type, message, extra = value
        if error_type == "SandboxError":
            raise SandboxError(message, cause=extra)
        raise OSError(extra, message) if error_type == "OSError" else FileNotFoundError(message)

    def close(self) -> None:
        """Let the holder go (it exits when its stdin closes), and wait for it."""
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _child(userns: int, mntns: int, answer: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """In the forked child: join, run, send the outcome, and exit without running the parent's cleanup."""
    try:
        for fd, kind in ((userns, CLONE_NEWUSER), (mntns, CLONE_NEWNS)):
            if _libc.setns(fd, kind) != 0:
                raise OSError(ctypes.get_errno(), f"setns: {os.strerror(ctypes.get_errno())}")
        outcome: tuple[str, Any] = ("ok", fn(*args))
    except SandboxError as exc:
        outcome = ("error", ("SandboxError", str(exc), exc.cause))
    except FileNotFoundError as exc:
        outcome = ("error", ("FileNotFoundError", str(exc), exc.errno))
    except OSError as exc:
        outcome = ("error", ("OSError", exc.strerror or str(exc), exc.errno))
    except BaseException as exc:  # whatever it is, the parent must hear of it, not hang
        outcome = ("error", ("SandboxError", f"{type(exc).__name__}: {exc}", "died"))
    try:
        data = pickle.dumps(outcome)
        view = memoryview(data)
        while view:
            view = view[os.write(answer, view) :]
    finally:
        os._exit(0)
