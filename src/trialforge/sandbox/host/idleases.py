"""One host identity per live sandbox: ids leased from a subordinate range, given back when the sandbox is gone.

Every bwrap sandbox runs as a host uid and gid of its own (per-user kernel limits and signal permissions are counted
by host uid), from the ``/etc/subuid``/``/etc/subgid`` range of ``trialforge-sandbox`` as root, or the user's own.
A lease is a symlink ``<registry>/<offset>`` to the sandbox's home, made under the registry's lock, and valid exactly
as long as that home exists. One registry per host account (``/run/trialforge-ids`` as root), whatever the state
dir. Why and how: docs/security.md, "Host identities".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trialforge.errors import SandboxError
from trialforge.sandbox.host.statedir import account_dir

SUBUID = Path("/etc/subuid")
SUBGID = Path("/etc/subgid")
IDS_ENV = "TRIALFORGE_IDS_DIR"


@dataclass(frozen=True)
class IdRange:
    """A subordinate range: ``count`` uids from ``first_uid`` and as many gids from ``first_gid``."""

    first_uid: int
    first_gid: int
    count: int

    @classmethod
    def of(cls, user: str, uid: int) -> IdRange:
        """The range ``/etc/subuid`` and ``/etc/subgid`` give ``user`` (by name or uid); a clear error without one."""
        uids, gids = _entry(SUBUID, user, uid), _entry(SUBGID, user, uid)
        if uids is None or gids is None:
            missing = " and ".join(str(f) for f, e in ((SUBUID, uids), (SUBGID, gids)) if e is None)
            raise SandboxError(
                f"no subordinate ids for {user!r} in {missing}: every sandbox runs as a host uid of its own, taken "
                f"from that range. Run scripts/setup-system.sh as root, or add one: "
                f"usermod --add-subuids 1073741824-1073807359 --add-subgids 1073741824-1073807359 {user}",
                cause="sandbox_user",
            )
        return cls(uids[0], gids[0], min(uids[1], gids[1]))


def _entry(path: Path, user: str, uid: int) -> tuple[int, int] | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.strip().partition(":")
        first, _, count = rest.partition(":")
        if name in (user, str(uid)) and first.isdigit() and count.isdigit() and int(count) > 0:
            return int(first), int(count)
    return None


@dataclass(frozen=True)
class Lease:
    uid: int
    gid: int
    path: Path  # the registry's symlink to the sandbox's home

    def release(self) -> None:
        """Give the ids back now (the sandbox is gone); a lease that already went is fine."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def registry_dir() -> Path:
    """Where this host account's leases live: ``$TRIALFORGE_IDS_DIR``, else ``/run/trialforge-ids`` as root, else
    ``$XDG_RUNTIME_DIR/trialforge-ids`` (or ``~/.local/state/trialforge-ids``)."""
    return account_dir(IDS_ENV, "trialforge-ids")


def lease(ids: IdRange, home: Path, registry: Path | None = None) -> Lease:
    """A uid and gid of ``ids`` no live sandbox holds, leased to the sandbox whose home is ``home`` (it must exist)."""
    folder = _registry(registry or registry_dir())
    start = secrets.randbelow(ids.count)  # spread the probes: with many live sandboxes, few are tried
    with _locked(folder):
        for step in range(ids.count):
            offset = (start + step) % ids.count
            path = folder / str(offset)
            try:
                os.symlink(home, path)
            except FileExistsError:
                if os.path.exists(path):  # its sandbox's home is still there: taken
                    continue
                path.unlink()  # its sandbox is gone: free (we hold the lock, nobody else reclaims it now)
                os.symlink(home, path)
            return Lease(ids.first_uid + offset, ids.first_gid + offset, path)
    raise SandboxError(f"all {ids.count} subordinate ids are held by live sandboxes", cause="sandbox_user")


def sweep(registry: Path | None = None) -> list[int]:
    """Remove the leases whose sandbox is gone (owners killed before their close): the offsets freed."""
    folder = registry or registry_dir()
    if not folder.is_dir():
        return []
    freed = []
    with _locked(_registry(folder)):
        for path in folder.iterdir():
            if path.name.isdigit() and path.is_symlink() and not os.path.exists(path):
                path.unlink()
                freed.append(int(path.name))
    return freed


def _registry(path: Path) -> Path:
    """The registry directory, made ours alone (0700) if absent; refused when it is anyone else's or a link."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise SandboxError(
            f"refusing the id registry {path}: not a directory of ours alone (uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):04o}); remove it or point {IDS_ENV} elsewhere",
            cause="state_dir",
        )
    return path


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def user_name(uid: int) -> str:
    """The account name of ``uid`` (its number when it has none): how /etc/subuid names it."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
