"""Scratch directories in the system temp dir that name their owner, so a dead owner's can be reaped.

``tempfile.TemporaryDirectory`` cleans up on every path but one: a process killed with
SIGKILL (or the OOM killer, or a crash of the interpreter) runs no cleanup, and its
directories, named only by a random suffix, stay forever with nothing to tell whose they
were. Ours carry the owner's pid and its kernel start time (``tf-<kind>-<pid>.<start>-<random>``),
so ``trialforge reap`` removes exactly those whose owner is gone, even after pid reuse.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from trialforge.owners import process_start, still_running

log = logging.getLogger(__name__)

_OWNED = re.compile(r"^tf-[a-z0-9-]+?-(\d+)\.(\d+)-[^/]+$")


def scratch_dir(kind: str) -> tempfile.TemporaryDirectory[str]:
    """A ``TemporaryDirectory`` named ``tf-<kind>-<pid>.<start>-...``: use it as a context manager."""
    me = os.getpid()
    return tempfile.TemporaryDirectory(prefix=f"tf-{kind}-{me}.{process_start(me) or 0}-")


def owner_of(name: str) -> tuple[int, str] | None:
    """(pid, start time) encoded in a scratch dir's name; None for a name that is not one of ours."""
    match = _OWNED.match(name)
    return (int(match.group(1)), match.group(2)) if match else None


def reap_scratch(root: Path | None = None, *, everything: bool = False) -> list[str]:
    """Remove our scratch dirs whose owner is dead (all of ours with ``everything``); returns their names.

    Only directories (never links) owned by our own user are touched: the temp dir is shared
    and world-writable, so a name alone proves nothing.
    """
    root = root or Path(tempfile.gettempdir())
    removed: list[str] = []
    for entry in sorted(root.glob("tf-*")):
        owner = owner_of(entry.name)
        if owner is None or (not everything and still_running(*owner)):
            continue
        try:
            info = entry.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        shutil.rmtree(entry, onerror=_make_removable)
        if entry.exists():
            log.warning("cannot remove scratch dir %s", entry)
            continue
        removed.append(entry.name)
    return removed


def _make_removable(func, path, _exc_info) -> None:
    """A read-only directory inside (a test tree's, a package's) stops rmtree: open it up and retry once."""
    parent = os.path.dirname(path)
    try:
        os.chmod(parent, 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
        func(path)
    except OSError:
        pass
