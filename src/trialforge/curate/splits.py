"""Train and eval splits: which tasks are held out, decided by a salted hash so every run agrees.

:func:`assign_splits` puts each task in ``train`` or ``eval``; ``curate.decontam.enforce_hygiene`` then keeps
the train tasks from copying the eval ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from trialforge.curate.decontam import normalize_repo
from trialforge.curate.settings import SplitConfig
from trialforge.tasks.schema import Task


def assign_splits(tasks: Sequence[Task], cfg: SplitConfig) -> list[Task]:
    """Put each task in ``train`` or ``eval`` by a salted SHA-256 of its repo or task id.

    The hash, not a shuffle, decides: the same task lands in the same split in every run,
    on every machine and in any input order, and raising ``eval_fraction`` only moves
    tasks from train to eval. ``split_by="repo"`` keeps a repository whole, so no eval task
    shares a codebase with a train task; ``split_by="hash"`` splits by ``task_id`` and needs
    ``enforce_hygiene`` to catch near duplicates across the line. Both meet the fraction
    in expectation only: with tens of tasks a draw can hold out most of one kind of bug and
    little of another. ``split_by="family"`` holds out ``round(eval_fraction * n)`` of each family's
    ``n`` tasks (``Task.family``: a mutation, a ticket's source), those with the lowest hashes of
    their ids: the held-out set mirrors the training set's mix of bugs.
    """

    def rank(task: Task, how: str) -> float:
        key = normalize_repo(task.repo) if how == "repo" else task.task_id
        digest = hashlib.sha256(f"{cfg.split_salt}\0{how}\0{key}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    if cfg.split_by != "family":
        return [
            t.model_copy(update={"split": "eval" if rank(t, cfg.split_by) < cfg.eval_fraction else "train"})
            for t in tasks
        ]
    held: set[str] = set()
    for family in {t.family() for t in tasks}:
        members = sorted((t for t in tasks if t.family() == family), key=lambda t: (rank(t, "hash"), t.task_id))
        held.update(t.task_id for t in members[: round(cfg.eval_fraction * len(members))])
    return [t.model_copy(update={"split": "eval" if t.task_id in held else "train"}) for t in tasks]
