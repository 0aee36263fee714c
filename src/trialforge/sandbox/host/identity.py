"""Which host account sandboxes run as.

A sandbox process must never be host root, nor any host user that owns anything.
Run as root, trialforge enters every bubblewrap sandbox as a dedicated system
account (``trialforge-sandbox`` by default; ``TRIALFORGE_SANDBOX_USER`` chooses
another) that owns nothing on the host but the workspaces we hand it. The setup
script creates it; without it, a root run refuses to start sandboxes rather than
run them as root. Run as a normal user, the user namespace maps the sandbox user to
that user, who has no privilege to lose.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from functools import cache

from trialforge.errors import SandboxError

USER_ENV = "TRIALFORGE_SANDBOX_USER"
DEFAULT_USER = "trialforge-sandbox"
SANDBOX_UID = 1000  # the uid (and gid) the agent sees inside every sandbox, whatever the host account


@dataclass(frozen=True)
class HostIdentity:
    name: str
    uid: int
    gid: int


@cache
def _lookup(name: str) -> HostIdentity:
    try:
        entry = pwd.getpwnam(name)
    except KeyError as exc:
        raise SandboxError(
            f"the sandbox account {name!r} does not exist; create it with `scripts/setup-system.sh` "
            f"(useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {name}) "
            f"or name an existing unprivileged one in {USER_ENV}",
            cause="sandbox_user",
        ) from exc
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise SandboxError(f"the sandbox account {name!r} is root: choose an unprivileged one", cause="sandbox_user")
    return HostIdentity(name, entry.pw_uid, entry.pw_gid)


def sandbox_identity() -> HostIdentity | None:
    """The host account sandboxes drop to (None when we are not root: then nothing needs dropping)."""
    if os.geteuid() != 0:
        return None
    return _lookup(os.environ.get(USER_ENV) or DEFAULT_USER)
