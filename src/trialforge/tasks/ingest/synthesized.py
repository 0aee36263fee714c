"""Bug synthesis on any git repository, as an ingestion source: its tree at one revision, its own environment
image, the mutation families plus the PR mirror (reverted hunks of its real fixes), screened by its own tests.

The tree is read from git object by object (``trees.materialize``, as a mined task's base state), so a work
tree's untracked files, virtual environments and caches never reach a sandbox. docs/synthesis.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trialforge.progress import report
from trialforge.scratch import scratch_dir
from trialforge.tasks.buildfiles import write_build_files
from trialforge.tasks.ingest.fixes import MAX_CHANGED_LINES
from trialforge.tasks.ingest.git import Mirrors, RepoSource, repo_name_of, resolve_commit
from trialforge.tasks.ingest.prmirror import pr_mirror_mutants
from trialforge.tasks.ingest.trees import materialize
from trialforge.tasks.mutations import FAMILIES, library_files
from trialforge.tasks.schema import Task
from trialforge.tasks.snapshots import SnapshotStore

if TYPE_CHECKING:  # tasks.synthesize needs the settings, which need the source entries
    from trialforge.tasks.synthesize import SynthesisFunnel, Synthesizer

CANDIDATES_PER_TASK = 4  # candidates screened per task asked for, unless told: about 1 in 3 validates


def synthesize_repository(
    repo: RepoSource,
    snapshots: SnapshotStore,
    synthesizer: Synthesizer,
    *,
    count: int,
    repo_name: str | None = None,
    rev: str = "HEAD",
    candidates: int | None = None,
    families: Sequence[str] = tuple(FAMILIES),
    pr_mirror: bool = True,
    max_changed_lines: int = MAX_CHANGED_LINES,
) -> tuple[list[Task], SynthesisFunnel]:
    """At most ``count`` validated synthetic tasks of ``repo`` at ``rev``, from at most ``candidates`` candidates
    (default ``CANDIDATES_PER_TASK`` x ``count``); the funnel's stage is ``ingest.synthesize``."""
    name = repo_name or repo_name_of(repo)
    cfg = dataclasses.replace(
        synthesizer.cfg,
        max_tasks=count,
        max_total=candidates or CANDIDATES_PER_TASK * count,
        families=tuple(families),
    )
    with Mirrors({name: repo}) as mirrors, scratch_dir("synth-repo") as tmp:
        local = mirrors.get(name)
        sha = resolve_commit(local, rev)
        tree = Path(tmp) / "tree"
        materialize(local, sha, tree)
        write_build_files(tree)  # what `pip install -e .` would add, as a mined task's base state has
        extra, scan = [], None
        if pr_mirror:
            sources = {rel: (tree / rel).read_text(encoding="utf-8") for rel in library_files(tree)}
            extra, scan = pr_mirror_mutants(local, sha, sources, max_changed_lines=max_changed_lines)
        tasks, funnel = synthesizer.repository(
            tree, name, snapshots, cfg, extra=extra, progress=lambda phase, done, total: report(
                f"synthesize {name}: {phase}", done, total)
        )  # fmt: skip
    funnel.stage = "ingest.synthesize"
    if scan is not None:  # what the history gave, beside the candidates' own funnel
        for what, counts in (("pr_mirror_commits", scan.commits), ("pr_mirror_hunks", scan.hunks)):
            for reason, n in counts.items():
                funnel.note(f"{what}/{reason}", n)
    return tasks, funnel
