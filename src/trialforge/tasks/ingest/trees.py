"""A repository's tree at one commit, written to disk and stored as a task's base snapshot.

We do not use ``git archive | tar -x``: ``git archive`` honours the repository's own ``.gitattributes``
(``export-ignore`` drops paths, ``export-subst`` rewrites files), and many projects export-ignore their tests,
which would silently remove the very files a task is graded with. Instead the tree is read object by object
(``objects.ObjectReader``) and each file written here, which also lets us refuse a path or symlink that leaves
the tree before it exists (``unsafe_tree``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from pygit2.enums import FileMode

from trialforge.errors import PatchError, RepoError
from trialforge.scratch import scratch_dir
from trialforge.tasks.buildfiles import write_build_files
from trialforge.tasks.ingest.objects import ObjectReader
from trialforge.tasks.patches import apply_patch, link_escapes
from trialforge.tasks.snapshots import SnapshotStore

MAX_TREE_BYTES = 1 << 30  # a base state larger than this is not a practical task


def materialize(repo: Path, commit: str, dest: Path, *, max_bytes: int = MAX_TREE_BYTES) -> None:
    """Write the tree of ``commit`` into ``dest`` (which must not exist or be empty), without ``.git``.

    Submodules become empty directories, as after a clone without ``--recurse-submodules``.
    Refused with ``unsafe_tree``: paths leaving the tree or naming ``.git``, symlinks resolving outside.
    """
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    total = 0
    links: list[Path] = []
    with ObjectReader(repo) as objects:
        for entry in objects.tree_entries(commit):
            target = _safe_target(root, entry.path, commit)
            if entry.mode == FileMode.COMMIT:
                target.mkdir(parents=True, exist_ok=True)
                continue
            _, data = objects.read(entry.oid)
            total += len(data)
            if total > max_bytes:
                raise RepoError(f"tree of {commit} is over {max_bytes} bytes", reason="tree_too_large")
            if entry.mode == FileMode.LINK:
                links.append(_write_link(target, entry.path, data, commit))
            else:
                target.write_bytes(data)
                target.chmod(0o755 if entry.mode == FileMode.BLOB_EXECUTABLE else 0o644)
    for link in links:  # only now can a chain of links be followed
        if not Path(os.path.realpath(link)).is_relative_to(root):
            rel = link.relative_to(root)
            raise RepoError(f"commit {commit}: symlink {rel} resolves outside the repository", reason="unsafe_tree")


def _safe_target(root: Path, rel: str, commit: str) -> Path:
    """``root / rel``, its parent directories made, after checking that nothing on the way leaves ``root``.

    Each directory is checked before it is entered, so a symlinked directory (possible only in a
    crafted tree) can never make us create or write anything outside.
    """
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts or ".git" in pure.parts or not pure.parts:
        raise RepoError(
            f"commit {commit}: tree path {rel!r} escapes the repository or names .git", reason="unsafe_tree"
        )
    current = root
    for part in pure.parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise RepoError(f"commit {commit}: {rel!r} would be written through a symlink", reason="unsafe_tree")
        current.mkdir(exist_ok=True)
    target = current / pure.parts[-1]
    if target.is_symlink() or target.exists():
        raise RepoError(f"commit {commit}: the tree names {rel!r} twice", reason="unsafe_tree")
    return target


def _write_link(target: Path, rel: str, data: bytes, commit: str) -> Path:
    try:
        dest = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RepoError(f"commit {commit}: symlink {rel} has an undecodable target", reason="bad_encoding") from None
    if link_escapes(rel, dest):
        raise RepoError(f"commit {commit}: symlink {rel} -> {dest} points outside the repository", reason="unsafe_tree")
    os.symlink(dest, target)
    return target


def snapshot_at(repo: Path, commit: str, patches: Sequence[str], snapshots: SnapshotStore) -> str:
    """Store the tree at ``commit`` and return its digest, after proving every patch applies to it.

    The patches are tried on a copy, so the stored base state is exactly the commit's tree, plus what an editable
    install would add (``tasks.buildfiles``: the generated version module, the distribution's metadata).
    """
    with scratch_dir("ingest") as tmp:
        base, trial = Path(tmp) / "base", Path(tmp) / "trial"
        materialize(repo, commit, base)
        write_build_files(base)  # what `pip install -e .` would add: version module, distribution metadata
        shutil.copytree(base, trial, symlinks=True)
        for patch in patches:
            if not patch:
                continue
            try:
                apply_patch(trial, patch)
            except PatchError as exc:
                raise RepoError(f"on base {commit[:12]}: {exc}", reason="patch_does_not_apply") from None
        return snapshots.put(base)
