"""Git object reads: trialforge's ``ObjectReader`` (libgit2 through pygit2, in-process) against git plumbing
(``git ls-tree -r`` and one ``git cat-file --batch`` process, what ingest used before).

Two jobs on the same repository, each side producing the same data: every file of HEAD's tree with its mode
and content (what ``trees.materialize`` reads for a task's base state, before it checks paths and writes
files, which costs the same either way), and every commit reachable from HEAD parsed into parents, author
time and message (what ``ingest gitlog`` reads). Median of ``--runs`` runs after one warm-up; the two sides'
trees are compared.

    PYTHONPATH=src .venv/bin/python benchmarks/git_objects.py [--repo PATH] [--runs N]

Default repository: this checkout's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pygit2.enums import FileMode

from trialforge.tasks.ingest.git import git_argv, resolve_commit, rev_list
from trialforge.tasks.ingest.objects import ObjectReader
from trialforge.tasks.patches import git_env

REPO_ROOT = Path(__file__).resolve().parents[1]


class CatFile:
    """The plumbing reader: one ``git cat-file --batch`` process, one round trip per object."""

    def __init__(self, repo: Path) -> None:
        argv = git_argv(repo, "cat-file", "--batch")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=git_env())

    def read(self, name: str) -> tuple[bytes, bytes]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(name.encode() + b"\n")
        self.proc.stdin.flush()
        _, kind, size = self.proc.stdout.readline().split()
        data = self.proc.stdout.read(int(size))
        self.proc.stdout.read(1)
        return kind, data

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait()


def plumbing_tree(repo: Path, commit: str) -> dict[str, tuple[int, bytes]]:
    listing = subprocess.run(
        git_argv(repo, "ls-tree", "-r", "-z", "--full-tree", commit), capture_output=True, check=True, env=git_env()
    ).stdout
    objects = CatFile(repo)
    files = {}
    for record in filter(None, listing.split(b"\0")):
        meta, _, path = record.partition(b"\t")
        mode, _, oid = meta.decode().split(" ")
        files[path.decode()] = (int(mode, 8), b"" if mode == "160000" else objects.read(oid)[1])
    objects.close()
    return files


def library_tree(repo: Path, commit: str) -> dict[str, tuple[int, bytes]]:
    with ObjectReader(repo) as objects:
        return {
            e.path: (e.mode, b"" if e.mode == FileMode.COMMIT else objects.read(e.oid)[1])
            for e in objects.tree_entries(commit)
        }


def plumbing_commits(repo: Path, shas: list[str]) -> list[tuple[tuple[str, ...], int, str]]:
    objects = CatFile(repo)
    parsed = []
    for sha in shas:
        _, raw = objects.read(sha)
        head, _, message = raw.partition(b"\n\n")
        headers = [line.split(b" ", 1) for line in head.split(b"\n") if b" " in line]
        parents = tuple(v.decode() for k, v in headers if k == b"parent")
        author = next(v for k, v in headers if k == b"author").rsplit(b" ", 2)
        encoding = next((v.decode() for k, v in headers if k == b"encoding"), "utf-8")
        parsed.append((parents, int(author[1]), message.decode(encoding, errors="replace")))
    objects.close()
    return parsed


def library_commits(repo: Path, shas: list[str]) -> list[tuple[tuple[str, ...], int, str]]:
    with ObjectReader(repo) as objects:
        return [(c.parents, int(c.author_date.timestamp()), c.message) for c in map(objects.commit, shas)]


def timed(run: Callable[[], object], runs: int) -> float:
    run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO_ROOT)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    head = resolve_commit(args.repo, "HEAD")
    shas = [sha for sha, _ in rev_list(args.repo, head)]
    tree = library_tree(args.repo, head)
    same = tree == plumbing_tree(args.repo, head)
    same &= library_commits(args.repo, shas) == plumbing_commits(args.repo, shas)
    size = sum(len(data) for _, data in tree.values()) / 1e6
    print(f"{args.repo} at {head[:12]}: {len(tree)} files ({size:.1f} MB), {len(shas)} commits; same data: {same}")
    print(f"{'job':28s} {'pygit2 (ours)':>14s} {'ls-tree + cat-file':>19s}")
    for job, ours, theirs, arg in (
        ("read HEAD's tree", library_tree, plumbing_tree, head),
        (f"parse {len(shas)} commits", library_commits, plumbing_commits, shas),
    ):
        times = [timed(lambda f=f, arg=arg: f(args.repo, arg), args.runs) for f in (ours, theirs)]  # type: ignore[misc]
        print(f"{job:28s} {times[0] * 1000:11.1f} ms {times[1] * 1000:16.1f} ms")


if __name__ == "__main__":
    main()
