"""Training batches that keep the learning signal alive: docs/learning.md, "Batches that carry signal", says how.

A batch, as the caller drives it::

    draw = sampler.begin(rates, policy_key("repair", version))
    while draw:
        episodes = rollout(draw)
        draw = sampler.report(group_rewards(episodes, "repair"))
    train_on(sampler.kept); rates = update_pass_rates(rates, episodes_of_the_batch, "repair", alpha)
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trialforge.curate.difficulty import count_outcomes
from trialforge.curate.tiers import PROXY, TIERS, difficulty_for, expected_pass_rate, tier_of_pass_rate
from trialforge.errors import TrialforgeError
from trialforge.store.records import EpisodeRecord
from trialforge.tasks.schema import Task

log = logging.getLogger(__name__)


class SamplerError(TrialforgeError):
    """The sampler was driven out of order (rewards for a group it is not waiting for, no tasks)."""


class SamplerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: int = Field(8, ge=1)  # GRPO groups (distinct tasks) per training batch
    band: tuple[float, float] = (0.2, 0.8)  # the batch's expected pass rate stays inside [low, high]
    tier_floor: float = Field(0.05, ge=0.0, le=1.0 / len(TIERS))  # least share of every tier with tasks
    max_extra_draws: int = Field(8, ge=0)  # groups rolled out per batch beyond ``groups``: the refill budget
    oversample: float = Field(1.0, ge=1.0, le=4.0)  # each draw asks for this many times the groups still missing
    ema_alpha: float = Field(0.3, gt=0.0, le=1.0)  # weight of the newest batch in a live pass rate

    @field_validator("band")
    @classmethod
    def _ordered(cls, band: tuple[float, float]) -> tuple[float, float]:
        low, high = band
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"band must satisfy 0 <= low <= high <= 1, got {list(band)}")
        return band


@dataclass
class SamplerStats:
    """One batch's sampling decisions, for metrics."""

    drawn: int = 0  # groups handed out for rollout, replacements included
    kept: int = 0
    dropped_zero_variance: int = 0
    extra_draws: int = 0  # drawn beyond ``groups`` (over-sampling and refills)
    rounds: int = 0  # draws handed out: the first one and every refill
    surplus: int = 0  # informative groups beyond ``groups``, left out of the batch
    budget: int = 0  # most groups this batch may roll out
    exhausted: str = ""  # why the batch ended short: "budget", "tasks" (every train task drawn); "" when full
    band_swaps: int = 0  # draws exchanged to bring the expected pass rate into the band
    expected_pass_rate: float | None = None  # mean pass rate of the batch (kept + awaiting rollout)
    in_band: bool = False
    tier_mix: dict[str, int] = field(default_factory=dict)  # tiers of the batch
    tier_shares: dict[str, float] = field(default_factory=dict)  # the target shares it was drawn with

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Candidate:
    task: Task
    rate: float
    tier: str

    @property
    def information(self) -> float:
        return self.rate * (1.0 - self.rate)


def tier_shares(rates_by_tier: Mapping[str, Sequence[float]], floor: float) -> dict[str, float]:
    """Share of each tier that has tasks: ``floor`` plus the rest in proportion to its mean p(1-p).

    Equal shares when no tier has any variance left (every rate 0 or 1).
    """
    present = [t for t in TIERS if rates_by_tier.get(t)]
    if not present:
        return {}
    weight = {t: sum(p * (1.0 - p) for p in rates_by_tier[t]) / len(rates_by_tier[t]) for t in present}
    total = sum(weight.values())
    spare = 1.0 - floor * len(present)
    if total <= 0.0:
        return {t: 1.0 / len(present) for t in present}
    return {t: floor + spare * weight[t] / total for t in present}


def informative(rewards: Sequence[float | None]) -> bool:
    """A group teaches something when at least two ok episodes got different rewards."""
    known = [r for r in rewards if r is not None]
    return len(known) >= 2 and max(known) > min(known)


class BatchSampler:
    """Draws training batches of task groups; seeded, so the same inputs give the same batches."""

    def __init__(self, tasks: Iterable[Task], config: SamplerConfig, seed: int) -> None:
        train = sorted((t for t in tasks if t.split == "train"), key=lambda t: t.task_id)
        if not train:
            raise SamplerError("no train-split tasks to sample from (eval tasks are never sampled for training)")
        self.tasks = train
        self.config = config
        self.rng = random.Random(seed)
        self.stats = SamplerStats()
        self._shares: dict[str, float] = {}
        self._pool: dict[str, _Candidate] = {}  # not drawn in this batch yet
        self._pending: dict[str, _Candidate] = {}  # drawn, rewards not reported yet
        self._kept: list[_Candidate] = []

    @property
    def kept(self) -> list[Task]:
        return [c.task for c in self._kept]

    def begin(self, rates: Mapping[str, float] | None = None, policy: str = PROXY) -> list[Task]:
        """Start a batch: the first ``groups`` tasks to roll out.

        ``rates``: live pass rates by task id; ``policy``: NAME@VERSION whose difficulty records to read.
        """
        live = rates or {}
        self._pool = {t.task_id: self._candidate(t, live, policy) for t in self.tasks}
        self._pending, self._kept = {}, []
        by_tier: dict[str, list[float]] = {}
        for c in self._pool.values():
            by_tier.setdefault(c.tier, []).append(c.rate)
        self._shares = tier_shares(by_tier, self.config.tier_floor)
        budget = self.config.groups + self.config.max_extra_draws
        self.stats = SamplerStats(tier_shares={t: round(s, 4) for t, s in self._shares.items()}, budget=budget)
        return self._draw(self._wanted(self.config.groups))

    def report(self, rewards: Mapping[str, Sequence[float | None]]) -> list[Task]:
        """Rewards of rolled-out groups by task id; returns the replacements to roll out (empty: batch done)."""
        unknown = sorted(set(rewards) - set(self._pending))
        if unknown:
            raise SamplerError(f"rewards for groups {unknown} that were not drawn or were already reported")
        for task_id, group in rewards.items():
            candidate = self._pending.pop(task_id)
            if not informative(group):
                self.stats.dropped_zero_variance += 1
            elif len(self._kept) < self.config.groups:
                self._kept.append(candidate)
            else:
                self.stats.surplus += 1
        if self._pending:  # the rest of this draw is still out: decide on a refill once it is back
            return []
        replacements = self._draw(self._wanted(self.config.groups - len(self._kept)))
        if not replacements:
            self._finish()
        return replacements

    # --- drawing ---------------------------------------------------------------------------------------

    def _candidate(self, task: Task, rates: Mapping[str, float], policy: str) -> _Candidate:
        difficulty = difficulty_for(task, policy)
        measured = difficulty.policy_version != PROXY and difficulty.tier in TIERS
        rate = rates.get(task.task_id, expected_pass_rate(difficulty))
        if measured:
            return _Candidate(task, rate, difficulty.tier)
        if task.task_id in rates or difficulty.tier not in TIERS:
            return _Candidate(task, rate, tier_of_pass_rate(rate))
        return _Candidate(task, rate, difficulty.tier)

    def _wanted(self, missing: int) -> int:
        """Groups to draw for ``missing`` informative ones: over-sampled, within what the budget has left."""
        if missing <= 0:
            return 0
        return min(math.ceil(missing * self.config.oversample), self.stats.budget - self.stats.drawn)

    def _draw(self, n: int) -> list[Task]:
        chosen = [self._pick() for _ in range(min(n, len(self._pool)))]
        self.stats.band_swaps += self._fit_band(chosen)
        self._pending.update((c.task.task_id, c) for c in chosen)
        self.stats.drawn += len(chosen)
        self.stats.extra_draws = max(0, self.stats.drawn - self.config.groups)
        self.stats.rounds += bool(chosen)
        self._update_batch_stats()
        return [c.task for c in chosen]

    def _pick(self) -> _Candidate:
        """A tier by its share (among tiers with tasks left), then a task of that tier uniformly."""
        tiers = [t for t in TIERS if any(c.tier == t for c in self._pool.values())]
        weights = [self._shares.get(t, 0.0) for t in tiers]
        tier = self.rng.choices(tiers, weights=weights if sum(weights) > 0 else None)[0]
        picked = self.rng.choice([c for c in self._pool.values() if c.tier == tier])
        return self._pool.pop(picked.task.task_id)

    def _fit_band(self, chosen: list[_Candidate]) -> int:
        """Swap new draws for undrawn tasks while that brings the batch's expected pass rate closer to the band.

        Below the band the lowest-rate draw goes, above it the highest; among the tasks that come
        closest, the most informative (largest p(1-p)) comes in. Kept and pending groups stay.
        """
        fixed = [c.rate for c in (*self._kept, *self._pending.values())]
        swaps = 0
        for _ in range(len(chosen)):
            rates = fixed + [c.rate for c in chosen]
            gap = self._gap(sum(rates) / len(rates))
            if gap == 0.0 or not self._pool:
                break
            out = min(chosen, key=lambda c: c.rate) if gap < 0 else max(chosen, key=lambda c: c.rate)
            miss, best = self._closest(sum(rates) - out.rate, len(rates))
            if miss >= abs(gap):
                break
            chosen[chosen.index(out)] = self._pool.pop(best.task.task_id)
            self._pool[out.task.task_id] = out
            swaps += 1
        return swaps

    def _closest(self, rest: float, size: int) -> tuple[float, _Candidate]:
        """The undrawn task that, added to ``rest`` (the sum of ``size - 1`` rates), lands nearest the band."""
        best = min(
            self._pool.values(), key=lambda c: (abs(self._gap((rest + c.rate) / size)), -c.information, c.task.task_id)
        )
        return abs(self._gap((rest + best.rate) / size)), best

    def _gap(self, rate: float) -> float:
        """How far ``rate`` lies below (negative) or above (positive) the band; 0 inside it."""
        low, high = self.config.band
        return rate - low if rate < low else rate - high if rate > high else 0.0

    def _update_batch_stats(self) -> None:
        batch = [*self._kept, *self._pending.values()]
        self.stats.kept = len(self._kept)
        self.stats.tier_mix = dict(Counter(c.tier for c in batch))
        if batch:
            rate = sum(c.rate for c in batch) / len(batch)
            self.stats.expected_pass_rate = round(rate, 4)
            self.stats.in_band = self._gap(rate) == 0.0

    def _finish(self) -> None:
        self._update_batch_stats()
        short = self.config.groups - len(self._kept)
        if short:
            self.stats.exhausted = "tasks" if not self._pool else "budget"
        log.log(
            logging.WARNING if short else logging.INFO,
            "sampler batch: kept %d/%d informative groups of %d drawn%s",
            len(self._kept),
            self.config.groups,
            self.stats.drawn,
            f" ({short} short: the {self.stats.exhausted} ran out)" if short else "",
            extra={"sampler": self.stats.as_dict()},
        )


def group_rewards(episodes: Iterable[EpisodeRecord], policy: str) -> dict[str, list[float | None]]:
    """Rewards of ``policy``'s episodes by task id, in sample order: what ``BatchSampler.report`` takes."""
    groups: dict[str, list[EpisodeRecord]] = {}
    for episode in episodes:
        if episode.policy == policy:
            groups.setdefault(episode.task_id, []).append(episode)
    return {task_id: [e.reward for e in sorted(group, key=lambda e: e.sample)] for task_id, group in groups.items()}


def update_pass_rates(
    rates: Mapping[str, float], episodes: Iterable[EpisodeRecord], policy: str, alpha: float, success: float = 1.0
) -> dict[str, float]:
    """Live pass rates after a finished batch: per task, ``(1 - alpha) * old + alpha * batch rate``.

    The batch rate is solved / ok episodes of ``policy`` (any version: the learner changes every update);
    a task seen for the first time starts at its batch rate, a task not in the batch keeps its rate.
    """
    updated = dict(rates)
    for task_id, outcome in count_outcomes(episodes, policy, None, success).items():
        old = rates.get(task_id)
        updated[task_id] = outcome.rate if old is None else (1.0 - alpha) * old + alpha * outcome.rate
    return updated
