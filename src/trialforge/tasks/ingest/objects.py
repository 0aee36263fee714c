"""Reading a repository's objects (trees, blobs, commits) in-process with libgit2 (pygit2).

libgit2 runs no program and applies no attribute or filter, and parses commits for us: as fast as ``git
ls-tree`` and a ``git cat-file --batch`` process on trees, faster on commits (``benchmarks/git_objects.py``).
A missing object or an undecodable name or message is a :class:`RepoError` with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import TracebackType

import pygit2
from pygit2.enums import FileMode, Option, RepositoryOpenFlag

from trialforge.errors import RepoError


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a commit's tree, directories left out: a file, a symlink or a submodule."""

    mode: int  # pygit2.enums.FileMode
    oid: str
    path: str


@dataclass(frozen=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    author_date: datetime
    message: str

    @property
    def subject(self) -> str:
        return self.message.split("\n", 1)[0].strip()

    @property
    def body(self) -> str:
        return self.message.partition("\n")[2].strip()


class ObjectReader:
    """The objects of one repository by id, read in-process (libgit2); one per thread."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        # Mirrors may belong to another user: as ``safe.directory=*`` for git (reading objects runs nothing).
        pygit2.option(Option.SET_OWNER_VALIDATION, 0)
        try:
            self._git = pygit2.Repository(str(repo), RepositoryOpenFlag.NO_SEARCH)
        except pygit2.GitError as exc:
            raise RepoError(f"{repo} is not a git repository: {exc}", reason="git_error") from None

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._git.free()

    def get(self, oid: str) -> pygit2.Object:
        """An object by id, or by any name ``git cat-file`` takes (``COMMIT:PATH``)."""
        try:
            return self._git.revparse_single(oid)
        except (KeyError, ValueError, pygit2.GitError):
            raise RepoError(f"object {oid} is missing from {self.repo}", reason="unknown_commit") from None

    def read(self, oid: str) -> tuple[str, bytes]:
        """(type, content) of one object (``get``)."""
        obj = self.get(oid)
        return obj.type_str, obj.read_raw()

    def text(self, commit: str, path: str) -> str | None:
        """The text of file ``path`` in ``commit``'s tree (undecodable bytes replaced); None when it is no file."""
        try:
            kind, data = self.read(f"{commit}:{path}")
        except RepoError:
            return None
        return data.decode("utf-8", "replace") if kind == "blob" else None

    def commit(self, sha: str) -> Commit:
        """A parsed commit; a message that is not valid text in its declared encoding is ``bad_encoding``."""
        obj = self.get(sha)
        if not isinstance(obj, pygit2.Commit):
            raise RepoError(f"{sha} is a {obj.type_str}, not a commit", reason="unknown_commit")
        encoding = obj.message_encoding or "utf-8"
        try:
            text = obj.raw_message.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise RepoError(f"commit {sha}: message is not valid {encoding} ({exc})", reason="bad_encoding") from None
        when = datetime.fromtimestamp(obj.author.time, timezone(timedelta(minutes=obj.author.offset)))
        return Commit(sha=sha, parents=tuple(str(p) for p in obj.parent_ids), author_date=when, message=text)

    def tree_entries(self, commit: str) -> list[TreeEntry]:
        """Every entry under the tree of ``commit`` but directories (submodules included)."""
        entries: list[TreeEntry] = []
        pending = [("", self.get(commit).peel(pygit2.Tree))]
        while pending:
            prefix, tree = pending.pop()
            for entry in tree:
                try:
                    path = prefix + entry.raw_name.decode("utf-8")
                except UnicodeDecodeError:
                    name = prefix.encode() + entry.raw_name
                    raise RepoError(
                        f"commit {commit}: file name {name!r} is not UTF-8", reason="bad_encoding"
                    ) from None
                if entry.filemode == FileMode.TREE:
                    pending.append((f"{path}/", self.get(str(entry.id))))
                else:
                    entries.append(TreeEntry(entry.filemode, str(entry.id), path))
        return entries
