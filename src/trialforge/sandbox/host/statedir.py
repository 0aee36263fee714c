"""Where trialforge keeps sandbox state, and the checks that make that place trustworthy.

Root reapers act on what they find here, so every state directory is created by us, owned by us and closed to
others; one that exists with another owner, a looser mode or as a symlink is refused with a clear error. As root,
the directories on the way to a sandbox's workspace and image are ``0710`` with the sandbox account's group
(traverse, never list or write). docs/security.md, the "planted state" row of "What holds, by construction".
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trialforge.errors import SandboxError
from trialforge.sandbox.host.identity import sandbox_identity

STATE_ENV = "TRIALFORGE_STATE_DIR"


def state_root() -> Path:
    """The state directory: ``$TRIALFORGE_STATE_DIR``, else ``/run/trialforge`` as root, else a per-user one.

    Never a predictable name in a shared, world-writable directory (``/tmp``).
    """
    return account_dir(STATE_ENV, "trialforge")


def account_dir(env: str, name: str) -> Path:
    """``$env``, else ``/run/NAME`` as root, else ``$XDG_RUNTIME_DIR/NAME`` (or ``~/.local/state/NAME``): a place of
    this host account's own."""
    if chosen := os.environ.get(env):
        return Path(chosen)
    if os.geteuid() == 0:
        return Path("/run") / name
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / name if runtime else Path.home() / ".local" / "state" / name


def expected_mode() -> tuple[int, int]:
    """(mode, gid) every state directory must have: 0710 + sandbox group as root, else 0700 + our own group."""
    ident = sandbox_identity()
    if ident is not None:
        return 0o710, ident.gid
    return 0o700, os.getegid()


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents, the same way), or check an existing one; return it.

    Refuses (``SandboxError``, cause ``state_dir``) a path that is a symlink, not a
    directory, not owned by this process's user, or whose mode or group is not the
    expected one: such a directory may hold records planted by someone else.
    """
    mode, gid = expected_mode()
    missing: list[Path] = []
    probe = path
    while not probe.exists() and not probe.is_symlink():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile: checked below like any existing one
            pass
        else:
            os.chown(directory, os.geteuid(), gid)
            os.chmod(directory, mode)  # mkdir's mode is cut by the umask
    check_private(path)
    return path


def check_private(path: Path) -> None:
    """Raise unless ``path`` is a real directory owned by us with exactly the expected mode and group."""
    mode, gid = expected_mode()
    try:
        info = os.lstat(path)
    except FileNotFoundError as exc:
        raise SandboxError(f"state directory {path} does not exist", cause="state_dir") from exc
    problems = []
    if stat.S_ISLNK(info.st_mode):
        problems.append("is a symlink")
    elif not stat.S_ISDIR(info.st_mode):
        problems.append("is not a directory")
    if info.st_uid != os.geteuid():
        problems.append(f"is owned by uid {info.st_uid}, not {os.geteuid()}")
    if stat.S_IMODE(info.st_mode) != mode:
        problems.append(f"has mode {stat.S_IMODE(info.st_mode):04o}, not {mode:04o}")
    if info.st_gid != gid:
        problems.append(f"has group {info.st_gid}, not {gid}")
    if problems:
        raise SandboxError(
            f"refusing state directory {path}: it {', '.join(problems)}. Someone else may have created it "
            f"to plant records; remove it (or point {STATE_ENV} elsewhere) and run again",
            cause="state_dir",
        )
