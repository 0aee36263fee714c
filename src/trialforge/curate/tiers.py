"""Difficulty tiers: from measured pass@k when rollouts exist, from task features until then."""

from __future__ import annotations

from trialforge.tasks.schema import Difficulty, Task

TIERS = ("unsolved", "hard", "medium", "easy", "trivial")


def tier_of_pass_rate(rate: float) -> str:
    if rate <= 0.0:
        return "unsolved"
    if rate < 0.35:
        return "hard"
    if rate < 0.7:
        return "medium"
    if rate < 1.0:
        return "easy"
    return "trivial"


def changed_lines(patch: str) -> int:
    return sum(
        1 for line in patch.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )


def proxy_difficulty(task: Task) -> Difficulty:
    """Before any rollout: bigger fixes over more files are harder (a prior, replaced by pass@k)."""
    size = changed_lines(task.gold_patch)
    files = task.gold_patch.count("diff --git ")
    tier = "easy" if size <= 2 and files <= 1 else "medium" if size <= 6 and files <= 1 else "hard"
    return Difficulty(tier=tier, pass_at_k=None, k=0, policy_version="proxy")


def with_difficulty(task: Task, difficulty: Difficulty) -> Task:
    """Keep one difficulty record per policy version (the newest replaces an older one of the same version)."""
    kept = [d for d in task.difficulty if d.policy_version != difficulty.policy_version]
    return task.model_copy(update={"difficulty": [*kept, difficulty]})
