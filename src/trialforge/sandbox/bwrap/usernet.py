"""Egress for a bwrap sandbox that asks for it: a user-mode network stack of its own, never the host's.

With ``Limits.network`` each command's private network namespace gets ``tap0``, served by a ``slirp4netns`` of the
command's own that runs as the sandbox's host uid with no capability, refuses the host's loopback and stops when
the command ends (its ``--exit-fd``, which the kernel closes if we are killed). ``command_started`` tells a launch
that lost bwrap's and slirp4netns's race over ``lo`` from any run of the command, so the backend starts it again.
The steps, and why each: docs/security.md, "A bwrap sandbox's network".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from trialforge.errors import SandboxError
from trialforge.sandbox.bwrap.confinement import tool

SLIRP_OPTIONS = ("--configure", "--mtu=65520", "--disable-host-loopback", "--enable-seccomp")
RESOLV_CONF = b"nameserver 10.0.2.3\n"
NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: an fd of the user namespace that owns it
STOP_WAIT_S = 5.0


def check_available() -> None:
    """Refuse, saying what is missing, when a sandbox cannot be given a network of its own."""
    if os.geteuid() != 0:
        raise SandboxError(
            "sandbox network on the bwrap backend needs trialforge to run as root: slirp4netns must enter the "
            "sandbox's network namespace, which belongs to a user namespace an unprivileged caller cannot "
            "enter (bwrap nests the sandbox's own below it); run as root or use sandbox.backend: docker",
            cause="network",
        )
    if shutil.which("slirp4netns") is None:
        raise SandboxError(
            "sandbox network on the bwrap backend needs slirp4netns: run scripts/setup-system.sh "
            "(or apt-get install slirp4netns)",
            cause="network",
        )


class UserNet:
    """The network of one command: pass ``bwrap_args`` and ``child_fds`` to bwrap, ``attach`` it, ``close``."""

    def __init__(self, log_path: Path, *, prefix: Sequence[str] = ()) -> None:
        self.log_path = log_path
        self.prefix = list(prefix)  # the sandbox's cgroup entry and its identity
        self.proc: subprocess.Popen | None = None
        self._exit_w: int | None = None
        self.info_r, self.info_w = os.pipe()
        self.block_r, self.block_w = os.pipe()
        # Our own read end of the block pipe, never read while bwrap runs: the go byte still in the pipe after
        # bwrap ends means bwrap never took it, so the command never ran (see ``command_started``).
        self._peek = os.dup(self.block_r)  # blocking, as bwrap's: O_NONBLOCK would be set on bwrap's end too
        self._released = False
        self.dns_r, dns_w = os.pipe()
        os.write(dns_w, RESOLV_CONF)  # far below a pipe's buffer: never blocks
        os.close(dns_w)
        self._parent_fds = [self.info_r, self.block_w, self._peek]
        self._child_fds = [self.info_w, self.block_r, self.dns_r]

    @property
    def child_fds(self) -> tuple[int, ...]:
        return tuple(self._child_fds)

    def bwrap_args(self) -> list[str]:
        return [
            "--info-fd", str(self.info_w),
            "--block-fd", str(self.block_r),
            "--ro-bind-data", str(self.dns_r), "/etc/resolv.conf",
        ]  # fmt: skip

    def attach(self, bwrap: subprocess.Popen) -> None:
        """bwrap has started: give its network namespace ``tap0``, then let the command run."""
        self._close(self._child_fds)
        pid = self._sandbox_pid()
        ready_r, ready_w = os.pipe()
        exit_r, self._exit_w = os.pipe()
        # The user namespace that owns the network namespace, asked of the kernel: the sandbox's process may already
        # be in the nested one bwrap makes for --disable-userns, which has no rights over it.
        netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        owner = fcntl.ioctl(netns, NS_GET_USERNS)
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [
                        *self.prefix,
                        tool("slirp4netns"),
                        *SLIRP_OPTIONS,
                        f"--ready-fd={ready_w}",
                        f"--exit-fd={exit_r}",
                        f"--userns-path=/proc/self/fd/{owner}",
                        "--netns-type=path",
                        f"/proc/self/fd/{netns}",
                        "tap0",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env={},
                    cwd="/",
                    pass_fds=(ready_w, exit_r, owner, netns),
                    start_new_session=True,
                )
        finally:
            for fd in (ready_w, exit_r, owner, netns):
                os.close(fd)
        with os.fdopen(ready_r, "rb") as ready:
            if ready.read(1) != b"1":
                why = self._log_tail()
                raise SandboxError(f"slirp4netns could not set up the sandbox's network: {why}", cause="network")
        self.release()

    def release(self) -> None:
        """Let the command run: the go byte bwrap waits for on ``--block-fd``."""
        os.write(self.block_w, b"1")
        self._released = True

    def command_started(self) -> bool:
        """Whether bwrap took the go byte (its last step before the command), asked once bwrap has ended.

        False says bwrap died setting the sandbox up, before any of the command ran: a launch that can be
        tried again, whatever the failure printed (the command's own output cannot exist yet).
        """
        if not self._released:
            return False
        waiting, _, _ = select.select([self._peek], [], [], 0)  # we still hold the write end: readable = the byte
        return not waiting

    def _sandbox_pid(self) -> int:
        data = b""
        while chunk := os.read(self.info_r, 4096):
            data += chunk
            with contextlib.suppress(ValueError):
                return int(json.loads(data)["child-pid"])
        raise SandboxError("bwrap exited before reporting the sandbox's pid", cause="start")

    def close(self) -> None:
        """Stop slirp4netns (closing its exit fd) and wait for it; close every fd still open."""
        self._close(self._child_fds)
        self._close(self._parent_fds)
        if self._exit_w is not None:
            os.close(self._exit_w)
            self._exit_w = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _close(self, fds: list[int]) -> None:
        while fds:
            os.close(fds.pop())

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace").strip()[-500:] or "(no output)"
        except OSError:
            return "(no log)"
