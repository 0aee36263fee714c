"""Difficulty tiers: from measured pass@k when rollouts exist, from task features until then.

A task carries one ``Difficulty`` record per policy version (``with_difficulty``): ``proxy`` from its
features, ``NAME@VERSION`` (``policy_key``) from that policy version's rollouts (``curate.difficulty``).
"""

from __future__ import annotations

from collections.abc import Mapping

from trialforge.tasks.schema import Difficulty, Task

TIERS = ("unsolved", "hard", "medium", "easy", "trivial")
PROXY = "proxy"
# The per-episode pass rate a tier stands for when nothing was measured (the proxy's prior).
TIER_PRIOR = {"unsolved": 0.0, "hard": 0.2, "medium": 0.5, "easy": 0.8, "trivial": 1.0}


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


def tier_of_measured(rate: float, n: int, c: int) -> str:
    """Tier of a measured pass@k from ``n`` episodes with ``c`` solved.

    Only all-solved is trivial and only none-solved is unsolved: for k > 1, pass@k reaches 1.0 as soon
    as fewer than k episodes failed, and such a task still fails sometimes.
    """
    if c == 0:
        return "unsolved"
    if c == n:
        return "trivial"
    return "easy" if rate >= 1.0 else tier_of_pass_rate(rate)


def policy_key(policy: str, version: str) -> str:
    """The ``Difficulty.policy_version`` of a policy version's measurement (names keep gold and noop apart)."""
    return f"{policy}@{version}"


def changed_lines(patch: str) -> int:
    return sum(1 for line in patch.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---")))


def proxy_difficulty(task: Task) -> Difficulty:
    """Before any rollout: bigger fixes over more files are harder (a prior, replaced by pass@k)."""
    size = changed_lines(task.gold_patch)
    files = task.gold_patch.count("diff --git ")
    tier = "easy" if size <= 2 and files <= 1 else "medium" if size <= 6 and files <= 1 else "hard"
    return Difficulty(tier=tier, pass_at_k=None, k=0, policy_version=PROXY)


def with_difficulty(task: Task, difficulty: Difficulty) -> Task:
    """Keep one difficulty record per policy version (the newest replaces an older one of the same version)."""
    kept = [d for d in task.difficulty if d.policy_version != difficulty.policy_version]
    return task.model_copy(update={"difficulty": [*kept, difficulty]})


def tier_tasks(tasks: list[Task], measured: Mapping[str, Difficulty] | None = None) -> list[Task]:
    """Give every task its proxy record (once) and, where rollouts measured it, the measured record.

    The measured record goes last: the newest record is the tier an episode row reports.
    """
    out = []
    for task in tasks:
        if not any(d.policy_version == PROXY for d in task.difficulty):
            task = with_difficulty(task, proxy_difficulty(task))
        if measured and task.task_id in measured:
            task = with_difficulty(task, measured[task.task_id])
        out.append(task)
    return out


def difficulty_for(task: Task, key: str) -> Difficulty:
    """The record that best describes ``key`` (``NAME@VERSION``) on ``task``.

    That version's own measurement; else the newest measurement of an earlier version of the same
    policy; else the proxy record (computed from the task's features when the task has none).
    """
    name = key.split("@", 1)[0]
    measured = [d for d in task.difficulty if d.policy_version != PROXY and d.tier in TIER_PRIOR]
    exact = [d for d in measured if d.policy_version == key]
    same_policy = [d for d in measured if d.policy_version.split("@", 1)[0] == name]
    proxy = [d for d in task.difficulty if d.policy_version == PROXY]
    for found in (exact, same_policy, proxy):
        if found:
            return found[-1]
    return proxy_difficulty(task)


def expected_pass_rate(difficulty: Difficulty) -> float:
    """The per-episode pass rate a record implies: pass@1 itself, pass@k inverted as 1 - (1 - pass@k)^(1/k)
    (exact for independent attempts), or the tier's prior for a proxy record."""
    if difficulty.pass_at_k is None or difficulty.k < 1:
        return TIER_PRIOR.get(difficulty.tier, TIER_PRIOR["medium"])
    return 1.0 - (1.0 - difficulty.pass_at_k) ** (1.0 / difficulty.k)
