"""Repository snapshots: a tree packed once, stored by content digest, with no git history.

A task names its base state by this digest; every sandbox that needs the
repository materialises it from the local cache (or the object store).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from trialforge.errors import TaskError
from trialforge.sandbox.images import assert_no_git_history
from trialforge.store.objstore import ObjectStore

PREFIX = "snapshots"


def pack_tree(tree: Path) -> bytes:
    """A deterministic tar of ``tree``: sorted names, zero owners and times, no git metadata."""
    assert_no_git_history(tree)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(tree.rglob("*")):
            rel = path.relative_to(tree)
            if "__pycache__" in rel.parts or rel.suffix == ".pyc":
                continue
            info = tar.gettarinfo(str(path), arcname=str(rel))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
            if info.isfile():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree_digest(tree: Path) -> str:
    """A tree's identity by content: the digest ``SnapshotStore.put`` gives it."""
    return digest_of(pack_tree(tree))


class SnapshotStore:
    """Snapshots in the object store, materialised once per machine into ``cache_dir``."""

    def __init__(self, store: ObjectStore, cache_dir: Path) -> None:
        self.store = store
        self.cache_dir = cache_dir

    def put(self, tree: Path) -> str:
        data = pack_tree(tree)
        digest = digest_of(data)
        key = f"{PREFIX}/{digest}.tar"
        if not self.store.exists(key):
            self.store.put_bytes(key, data)
        return digest

    def materialize(self, digest: str) -> Path:
        """The unpacked tree of ``digest`` (read-only by convention: copy it before changing anything)."""
        dest = self.cache_dir / digest
        if dest.is_dir():
            return dest
        data = self.store.get_bytes(f"{PREFIX}/{digest}.tar")
        if digest_of(data) != digest:
            raise TaskError(f"snapshot {digest} in {self.store.url} is corrupt (digest mismatch)")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.cache_dir, prefix=".unpack-"))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(tmp, filter="data")
        try:
            os.rename(tmp, dest)  # another worker may have won the race: theirs is identical
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest
