"""Leak protection for host-side sandboxes: a record per sandbox, and a reaper for what crashes leave.

Every bwrap sandbox writes ``record.json`` (owner, deadline, labels, cgroups, mounts) before it holds any resource;
the reaper removes sandboxes whose owner is gone or whose deadline passed (the pool at start, ``trialforge reap`` by
hand). It acts only on records it can authenticate: HMAC under a key only the state dir's owner reads, naming only
the record's own mount and cgroups; anything else is left alone and reported.
docs/security.md, the "planted state" row of "What holds, by construction".
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trialforge.owners import process_start, still_running
from trialforge.sandbox.bwrap import cgroups, mounts
from trialforge.sandbox.disk import HOME_MOUNTS
from trialforge.sandbox.host import idleases
from trialforge.sandbox.host.statedir import check_private, state_root

log = logging.getLogger(__name__)
SANDBOX_ID = re.compile(r"tf-[0-9a-f]{12}")
KEY_NAME = "reaper.key"


def _key(state_dir: Path) -> bytes:
    """The state directory's record-signing key (created on first use, readable by its owner only)."""
    path = state_dir / KEY_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise PermissionError(f"{path} is not ours alone (uid {info.st_uid}, mode {info.st_mode & 0o777:o})")
        return fh.read()


def _sign(key: bytes, fields: dict) -> str:
    return hmac.new(key, json.dumps(fields, sort_keys=True).encode(), hashlib.sha256).hexdigest()


@dataclass
class SandboxRecord:
    id: str
    backend: str
    owner_pid: int
    owner_start: str
    deadline: float
    labels: dict[str, str] = field(default_factory=dict)
    cgroups: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)

    @classmethod
    def for_current_process(
        cls, sandbox_id: str, *, backend: str, labels: dict[str, str], deadline: float
    ) -> SandboxRecord:
        pid = os.getpid()
        return cls(sandbox_id, backend, pid, process_start(pid), deadline, dict(labels))

    def save(self, home: Path) -> None:
        """Write the signed record into ``home`` (``STATE/sandboxes/ID``), atomically."""
        fields = asdict(self)
        signed = {**fields, "sig": _sign(_key(home.parents[1]), fields)}
        tmp = home / "record.json.tmp"
        tmp.write_text(json.dumps(signed))
        tmp.replace(home / "record.json")

    @classmethod
    def load(cls, home: Path, key: bytes) -> SandboxRecord:
        """The record in ``home``, only if it is signed with ``key`` and names nothing but its own resources."""
        fd = os.open(home / "record.json", os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as fh:
            data = json.load(fh)
        sig = data.pop("sig", "")
        if not hmac.compare_digest(str(sig), _sign(key, data)):
            raise ValueError("bad signature")
        record = cls(**data)
        if record.id != home.name or not SANDBOX_ID.fullmatch(record.id):
            raise ValueError(f"record of {record.id!r} found in {home.name!r}")
        if any(Path(m).parent != home or Path(m).name not in HOME_MOUNTS for m in record.mounts):
            raise ValueError(f"names foreign mounts {record.mounts}")
        for group in map(Path, record.cgroups):
            if group.name != record.id or cgroups.ROOT not in group.parents or ".." in group.parts:
                raise ValueError(f"names a foreign cgroup {group}")
        return record

    def owner_alive(self) -> bool:
        return still_running(self.owner_pid, self.owner_start)


def _release(record: SandboxRecord, home: Path) -> bool:
    """Free what ``record`` names; False when a cgroup is still held (its record, narrowed, stays for next time)."""
    group = cgroups.SandboxCgroup(name=record.id, dirs=[Path(p) for p in record.cgroups], v1=True)
    left = group.remove()
    for mount in record.mounts:
        mounts.unmount(mount)
    if left:
        log.warning("sandbox %s: cgroups still held (%s); kept for the next reap", record.id, group.holders())
        record.cgroups, record.mounts = [str(d) for d in left], []
        with contextlib.suppress(FileNotFoundError):  # its owner's background retry removed it meanwhile
            record.save(home)
        return False
    _remove_home(home)
    return True


def _remove_home(home: Path) -> None:
    """The sandbox's home, its places unmounted first even if no record names them (its owner died before saving
    one): the state dir is ours alone (``check_private``), so is what is mounted in it. Its ids go back with it."""
    for name in HOME_MOUNTS:
        if os.path.ismount(home / name):
            mounts.unmount(home / name)
    shutil.rmtree(home, ignore_errors=True)


def reap(state_dir: Path | None = None, *, everything: bool = False) -> list[str]:
    """Remove abandoned sandboxes (owner dead or deadline passed; all of them with ``everything``).

    Returns the ids removed. The host ids of sandboxes gone (theirs or any other run's) return to their range.
    """
    root = state_dir or state_root()
    removed: list[str] = []
    if not (root / "sandboxes").is_dir():
        return removed
    try:
        _reap_homes(root, everything, removed)
    finally:
        idleases.sweep()
    return removed


def _reap_homes(root: Path, everything: bool, removed: list[str]) -> None:
    check_private(root)
    key = _key(root)
    now = time.time()
    for home in sorted((root / "sandboxes").glob("tf-*")):
        if not (home / "record.json").exists():
            try:
                if now - home.stat().st_mtime < 60:  # still being created by a live process
                    continue
            except FileNotFoundError:  # its owner closed it meanwhile
                continue
            _remove_home(home)  # killed before its record was written
            removed.append(home.name)
            continue
        try:
            record = SandboxRecord.load(home, key)
        except (OSError, ValueError, TypeError) as exc:
            log.warning("not reaping %s: its record cannot be authenticated (%s)", home, exc)
            continue
        if (everything or not record.owner_alive() or record.deadline < now) and _release(record, home):
            removed.append(record.id)
    for snaps in (root / "snapshots").glob("*-*"):
        pid = int(snaps.name.split("-", 1)[0]) if snaps.name.split("-", 1)[0].isdigit() else -1
        if everything or not Path(f"/proc/{pid}").exists():
            shutil.rmtree(snaps, ignore_errors=True)
