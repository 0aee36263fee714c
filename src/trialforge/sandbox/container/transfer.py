"""Bytes in and out of a container sandbox: the exec stream, and workspaces as tar archives.

Everything crosses through ``exec`` (stdin in; stdout and stderr as the Engine API multiplexes them, 8-byte frame
headers). Workspaces travel as tar archives that ``tar`` *inside the sandbox*, as the sandbox user, writes or reads;
an archive coming out is read as it arrives (``PipeSink``), each member charged to the copy's ``Budget``
(``hostcopy``) from its header, before its data. Why: docs/security.md, "The docker backend".
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import select
import socket
import ssl
import struct
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

from trialforge.sandbox.host.identity import SANDBOX_UID
from trialforge.sandbox.hostcopy import Budget
from trialforge.sandbox.sanitize import tar_member

DRAIN_S = 5.0  # after the host's deadline, how long to wait for the killed command's last output
SPOOL_BYTES = 8 << 20  # archives bigger than this go to a temporary file
TRAILER_CAP = 1 << 20  # what may follow an archive's end marker (tar pads to its record size, 10 KiB)


class Sink(Protocol):
    def feed(self, chunk: bytes) -> None: ...


class PipeSink:
    """An exec's output handed to a reader in another thread through a pipe, with back-pressure: the exec is read
    only as fast as ``reader`` is. Once the reader is closed, ``feed`` fails (EPIPE), which ends the exec's reading."""

    def __init__(self) -> None:
        read_end, self._write_end = os.pipe()
        self.reader: IO[bytes] = os.fdopen(read_end, "rb")
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._write_end, view) :]

    def close_writer(self) -> None:
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1

    def open_tar(self) -> tarfile.TarFile | None:
        """The stream as a tar read in stream mode (member by member, never seeking); None when no archive came."""
        try:
            return tarfile.open(fileobj=self.reader, mode="r|")
        except tarfile.ReadError:
            return None

    def drain(self) -> None:
        """Read what follows the archive (its padding), at most ``TRAILER_CAP`` bytes, so the exec can finish."""
        left = TRAILER_CAP
        while left > 0 and (chunk := self.reader.read(min(left, 65536))):
            left -= len(chunk)


def pump_frames(
    sock: Any,
    out: Sink,
    err: Sink,
    *,
    deadline: float,
    on_deadline: Callable[[], None],
    stdin: IO[bytes] | bytes | None = None,
) -> bool:
    """Demultiplex an exec's stream into ``out``/``err`` (and feed it ``stdin``); True if the deadline hit.

    ``stdin`` is written from a thread, then the write side is shut (the command sees EOF), so a
    command that writes while it reads never deadlocks against us.
    """
    raw = getattr(sock, "_sock", sock)  # docker-py hands a SocketIO over the hijacked connection
    first = _read_ahead(sock)  # before the writer starts: it switches the socket to non-blocking for a moment
    writer = _start_writer(raw, stdin) if stdin is not None else None
    try:
        return _read_frames(sock, first, out, err, deadline=deadline, on_deadline=on_deadline)
    finally:
        if writer is not None:
            writer.join(timeout=DRAIN_S)


def _read_ahead(sock: Any) -> bytes:
    """The stream's first bytes that the HTTP client read along with the engine's response headers.

    docker-py hands over the socket *under* http.client's buffered reader, so whatever arrived with the
    headers stays in that reader, and reading the socket skips it (docker/docker-py#3332). A quick command's
    whole output can be there: with both CPUs saturated, 16 of 600 ``echo`` execs came back empty before this.
    """
    reader = getattr(getattr(getattr(getattr(sock, "_response", None), "raw", None), "_fp", None), "fp", None)
    if reader is None:
        return b""
    raw = getattr(sock, "_sock", sock)
    timeout = raw.gettimeout()
    raw.settimeout(0)  # what is buffered, else what is on the socket now: never wait here
    try:
        return reader.read1(65536) or b""
    except (BlockingIOError, ssl.SSLWantReadError):
        return b""
    finally:
        raw.settimeout(timeout)


def _start_writer(raw: Any, stdin: IO[bytes] | bytes) -> threading.Thread:
    def write() -> None:
        with contextlib.suppress(OSError):  # the command exited (or was killed) before reading it all
            if isinstance(stdin, bytes | bytearray):
                raw.sendall(stdin)
            else:
                while chunk := stdin.read(1 << 20):
                    raw.sendall(chunk)
        if isinstance(raw, ssl.SSLSocket):
            return  # TLS has no half-close here (shutdown() unwraps the socket): our helpers stop at their byte count
        with contextlib.suppress(OSError):
            raw.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=write, name="exec-stdin", daemon=True)
    thread.start()
    return thread


def _read_frames(
    sock: Any, first: bytes, out: Sink, err: Sink, *, deadline: float, on_deadline: Callable[[], None]
) -> bool:
    # Not the docker SDK's docker.utils.socket.frames_iter/consume_socket_output: they wait in poll() with no
    # timeout, so a command silent past the host's deadline holds the reader until it ends (``sleep 10``
    # under a 1 s deadline: frames_iter returned after 10.1 s; this loop calls on_deadline at 1 s), and
    # consume_socket_output keeps every byte (no cap). Same speed otherwise (Podman 4.3, 2 cores, medians of
    # 5: 200,000 one-line frames 1.6 s here and 1.9 s there; 64 MiB in 8 KiB writes 0.60 s and 0.62 s).
    buf = bytearray(first)
    hit = False
    while True:
        while len(buf) >= 8:
            stream, size = struct.unpack(">BxxxL", buf[:8])
            if len(buf) < 8 + size:
                break
            (err if stream == 2 else out).feed(bytes(buf[8 : 8 + size]))
            del buf[: 8 + size]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if hit:
                return True
            hit = True
            on_deadline()
            deadline = time.monotonic() + DRAIN_S
            continue
        if not _decrypted_waiting(sock):  # TLS may hold bytes it already read, which select() cannot see
            ready, _, _ = select.select([sock], [], [], min(remaining, 1.0))
            if not ready:
                continue
        chunk = sock.read(65536)
        if not chunk:
            return hit
        buf += chunk


def _decrypted_waiting(sock: Any) -> bool:
    raw = getattr(sock, "_sock", sock)
    return isinstance(raw, ssl.SSLSocket) and raw.pending() > 0


def close_exec_socket(sock: Any) -> None:
    response = getattr(sock, "_response", None)  # docker-py keeps the HTTP response on the socket
    with contextlib.suppress(OSError):
        sock.close()
    if response is not None:
        with contextlib.suppress(Exception):
            response.close()


# --- archives ------------------------------------------------------------------------------
def is_git(name: str) -> bool:
    return ".git" in name.split("/")


def as_sandbox_user(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """``info`` owned by the sandbox user (PAX ownership headers dropped, or they would win)."""
    owned = info.replace(uid=SANDBOX_UID, gid=SANDBOX_UID, uname="", gname="", deep=False)
    owned.pax_headers = {k: v for k, v in info.pax_headers.items() if k not in ("uid", "gid", "uname", "gname")}
    return owned


def _seedable(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Seed members belong to the sandbox user; git history never enters a sandbox."""
    return None if is_git(info.name) else as_sandbox_user(info)


@contextlib.contextmanager
def tar_of_dir(src: Path | None, budget: Budget) -> Iterator[IO[bytes]]:
    """``src`` as a tar whose root entry ``.`` becomes /work itself (just ``.`` when ``src`` is None), charged to
    ``budget`` as it is made: a tree /work could not hold is refused before a byte is sent."""

    def seedable(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        kept = _seedable(info)
        if kept is not None and kept.name != ".":
            charge(budget, kept)
        return kept

    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as fh:
        with tarfile.open(fileobj=fh, mode="w") as tar:  # type: ignore[call-overload]
            if src is None:
                root = tarfile.TarInfo(".")
                root.type, root.mode, root.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
                tar.addfile(as_sandbox_user(root))
            else:
                tar.add(str(src), arcname=".", filter=seedable)
        fh.seek(0)
        yield fh  # type: ignore[misc]


def charge(budget: Budget, member: tarfile.TarInfo) -> None:
    """Charge one archive member: an entry, and a regular file's size (a hard link's data came with its first name)."""
    name = member.name.removeprefix("./")
    budget.take_entry(name, name.count("/"))
    if member.isreg():
        budget.take_bytes(member.size, name)


def rebased(tar: tarfile.TarFile) -> Iterable[tarfile.TarInfo]:
    """Members of a ``tar -C /work .`` archive named relative to /work (``.`` for itself), without git history."""
    for member in tar:
        name = _relative(member.name)
        if name is None or is_git(name):
            continue
        member.name = name
        if member.islnk():
            member.linkname = _relative(member.linkname) or member.linkname
        yield member


def _relative(name: str) -> str | None:
    norm = posixpath.normpath(name.lstrip("/"))
    if norm == ".." or norm.startswith("../"):
        return None
    return norm


def write_snapshot(src: tarfile.TarFile, dest: Path, budget: Budget) -> None:
    """The sanitized, sandbox-owned copy of a workspace archive, charged to ``budget`` member by member as it is
    read, written atomically to ``dest`` (never half a snapshot)."""
    tmp = dest.with_suffix(".part")
    try:
        with budget.writing(), tarfile.open(tmp, mode="w") as out:
            for member in rebased(src):
                if member.name != ".":
                    charge(budget, member)
                safe = tar_member(member)
                if safe is not None:
                    out.addfile(as_sandbox_user(safe), src.extractfile(member) if member.isreg() else None)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)


def extract_workspace(src: tarfile.TarFile, dest: Path, budget: Budget) -> None:
    """What may leave a sandbox (``sanitize``), inside ``dest`` (the stdlib's ``data`` rule), owned by us, each member
    charged to ``budget`` before it is written."""
    dest.mkdir(parents=True, exist_ok=True)
    with budget.writing():
        for member in rebased(src):
            if member.name == ".":
                continue
            charge(budget, member)
            target = dest / member.name  # a name exported before makes room (a stream cannot go back for a link)
            if target.is_symlink() or target.is_file():
                target.unlink()
            src.extract(member, dest, filter=_export_filter)


def _export_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    defused = tar_member(member)
    if defused is None:
        return None
    safe = tarfile.data_filter(defused, dest)
    return safe.replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="", deep=False)
