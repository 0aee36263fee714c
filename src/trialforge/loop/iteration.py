"""The RL loop, top to bottom. Per iteration:

    evaluate   the learner on the held-out tasks (same seeds every iteration: its held-out curve)
    sample     a batch of train tasks from their tiers (``curate.sampler``) ...
    roll out   ... G episodes each, in sandboxes, graded in a clean one (verify) ...
    resample   ... until the batch holds enough groups with something to learn (rounds 1, 2, ...)
    canary     the scripted policies (gold, noop) on the same tasks: grading still gives a fix 1, no edit 0
    gate       the environment's health (a broken batch stops the run) and the learning signal's (no step)
    update     one GRPO-family step on the kept groups, checkpoint saved
    sync       the inference side serves the new weights (``inference.managed``, ``train.served``)

and after the last update the evaluation once more, alone; ``run_iterations`` runs them, one function a step.
Shards, staleness and records live beside it in ``loop``; the stages in detail: docs/pipeline.md, "The stages".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from trialforge.config import Params
from trialforge.curate.difficulty import measure_difficulty
from trialforge.curate.sampler import BatchSampler, group_rewards, update_pass_rates
from trialforge.curate.tiers import policy_key, tier_tasks
from trialforge.errors import ConfigError
from trialforge.inference.managed import serving
from trialforge.loop import shards
from trialforge.loop.learner import open_learner
from trialforge.loop.records import (
    IterationRecord,
    ShardReport,
    TrainResult,
    checkpoint_key,
    iteration_key,
    load_episodes,
    read_iteration,
    train_record_key,
)
from trialforge.loop.staleness import StalenessStats, TaggedBatch, train_bounded
from trialforge.observe.logs import rollout_done, train_done
from trialforge.pipeline import assert_healthy, eval_seed, round_seed
from trialforge.progress import track
from trialforge.rollout.loop import Lineage
from trialforge.runtime import Runtime, code_version
from trialforge.tasks.schema import Task, task_set_version
from trialforge.train.health import learning_health

log = logging.getLogger(__name__)

Roll = Callable[[str | None, int], object]  # (checkpoint to sample with, iteration): publishes its episodes
Learn = Callable[[int, str | None], TrainResult]  # (iteration, the trainer's latest checkpoint): one update
# (iteration, its update's stats or None): the iteration's episodes are all published (the tracker logs them)
OnIteration = Callable[[int, "dict[str, Any] | None"], None]


# --- the iterations ---------------------------------------------------------------------


@dataclass
class LoopResult:
    updates: list[dict[str, Any]]  # the trainer's stats per update taken, with the lag of its batch
    checkpoint: str | None  # the learner after the last update
    staleness: StalenessStats

    def summary(self) -> dict[str, Any]:
        return asdict(self.staleness)


def run_iterations(params: Params, roll: Roll, learn: Learn, on_iteration: OnIteration | None = None) -> LoopResult:
    """``train.iterations`` rollouts and their updates, never more than ``train.max_staleness`` policy versions
    apart (0: strictly alternating); then the last checkpoint's held-out evaluation. The inference server of
    ``train.inference.command`` runs meanwhile. Every door (the flows, the DVC stage) passes its own ``roll``
    (``rollout_iteration`` wherever its shards run) and ``learn`` (``train_iteration``), so the schedule is the
    same whichever started the run. ``on_iteration`` hears of each iteration once its update is done."""
    updates: list[dict[str, Any]] = []
    latest: list[str | None] = [None]
    done = on_iteration or (lambda _iteration, _update: None)

    def update(tagged: TaggedBatch[object]) -> tuple[str | None, int]:
        trained = learn(tagged.index, latest[0])
        latest[0] = trained.checkpoint
        step = None
        if trained.stats is not None:
            lag = tagged.index - tagged.version  # updates taken since the policy that rolled the batch out
            step = trained.stats | {"iteration": tagged.index, "behaviour_lag": lag}
            updates.append(step)
        done(tagged.index, step)
        return trained.checkpoint, tagged.index + 1

    iterations = params.train.iterations
    with serving(params):
        stats = train_bounded(
            roll, update, snapshot=None, version=0, batches=iterations, max_staleness=params.train.max_staleness
        )
        roll(latest[0], iterations)  # the trained policy on the held-out tasks: the eval round alone
        done(iterations, None)
    return LoopResult(updates, latest[0], stats)


# --- one iteration's rollout: evaluate, sample, roll out, resample, canary ---------------


def rollout_iteration(
    rt: Runtime, tasks: list[Task], lineage: Lineage, checkpoint: str | None, shard_size: int, run: shards.RunShards
) -> tuple[IterationRecord, list[ShardReport]]:
    """Roll out iteration ``lineage.iteration`` with the learner as of ``checkpoint``; every round's shards go
    through ``run``. Returns the iteration's record (stored last: a resumed run returns it) and the reports of
    the shards run now (an earlier attempt's published ones are skipped)."""
    done = read_iteration(rt.store, lineage.run_id, lineage.iteration)
    if done is not None:
        return done, []
    params, it = rt.params, lineage.iteration
    name = params.train.learner
    learner = shards.learner_policy(rt, checkpoint) if name in params.rollout.policies else None
    final = it >= params.train.iterations  # after the last update: the held-out evaluation alone
    reports: list[ShardReport] = []

    def roll(draw: list[Task], names: list[str], round_: shards.Round, group: int, seed: int) -> list[int]:
        plan = shards.plan_shards(draw, names, group, seed, shard_size, round_)
        reports.extend(run(shards.pending_shards(rt.store, plan, lineage)))
        return [job.seed for shard in plan for job in shard.jobs]

    used: dict[str, Task] = {}  # the tasks the learner rolled out on this iteration, in order
    held_out = [t for t in tasks if t.split == "eval"]
    if learner is not None and held_out and params.rollout.eval_group_size:
        roll(held_out, [name], shards.EVAL, params.rollout.eval_group_size, eval_seed(params))
        used |= {t.task_id: t for t in held_out}

    record = IterationRecord()
    if learner is not None and not final:
        previous = read_iteration(rt.store, lineage.run_id, it - 1) if it else None
        rates = previous.rates if previous else {}
        measured = previous.difficulty if previous else {}
        sampler = BatchSampler(tier_tasks(tasks, measured), params.curate.sampler, params.run.seed * 1000 + it)
        draw, round_, drawn = sampler.begin(rates, policy_key(name, learner.version)), 1, []
        while draw:
            used |= {t.task_id: t for t in draw}
            seeds = roll(draw, [name], round_, params.rollout.group_size, round_seed(params, it, round_))
            batch = load_episodes(rt.store, lineage.run_id, it, name, seeds=seeds)  # read back: a resume replays
            drawn += batch
            draw, round_ = sampler.report(group_rewards(batch, name)), round_ + 1
        record = IterationRecord(
            kept=[t.task_id for t in sampler.kept],
            rates=update_pass_rates(rates, drawn, name, params.curate.sampler.ema_alpha),
            difficulty=measured | measure_difficulty(drawn, name, learner.version, k=params.curate.pass_k),
            sampler=sampler.stats.as_dict(),
        )

    scripted = [n for n in params.rollout.policies if n != name]
    canary = tasks if learner is None or params.rollout.reference_tasks == "all" else list(used.values())
    if scripted and canary and not final:
        roll(canary, scripted, 0, params.rollout.reference_group_size, round_seed(params, it, 0))
    rt.store.put_bytes(iteration_key(lineage.run_id, it), record.model_dump_json().encode())
    return record, reports


# --- one iteration's update: gate, update, checkpoint ------------------------------------


def train_iteration(rt: Runtime, run_id: str, iteration: int, checkpoint: str | None) -> TrainResult:
    """One update of the learner from ``checkpoint`` (its latest) over the groups the iteration's sampler kept;
    with ``train.max_staleness`` they may come from an older version, whose log-probabilities they carry.

    Nothing without the learner among the policies. Never on a batch the environment broke (the infrastructure
    gate raises: a person must look), and no step where the learning gate refuses (``observe.learning``: nothing
    to learn, or rewards that look hacked): the learner keeps its weights, version and checkpoint. The checkpoint
    is saved first and the step's record last: the record marks the step as taken, so a rerun of the run
    returns it instead of updating twice.
    """
    name = rt.params.train.learner
    if name not in rt.params.rollout.policies:
        return TrainResult(checkpoint=checkpoint, stats=None)
    record = read_iteration(rt.store, run_id, iteration)
    if record is None:
        raise ConfigError(f"run {run_id!r} has not finished the rollout of iteration {iteration}: run that first")
    record_key = train_record_key(run_id, iteration)
    if rt.store.exists(record_key):
        return TrainResult.model_validate_json(rt.store.get_bytes(record_key)).model_copy(update={"resumed": True})

    assert_healthy(rt, run_id, iteration, name)
    learner = open_learner(rt.params, rt.store, checkpoint)
    drawn = [e for e in load_episodes(rt.store, run_id, iteration, name) if e.split == "train"]
    before = (
        [e for e in load_episodes(rt.store, run_id, iteration - 1, name) if e.split == "train"] if iteration else []
    )
    health = learning_health(drawn, record.kept, before, rt.params.observe.learning)
    stats: dict = {"sampler": record.sampler, "health": health.as_dict()}
    if not health.trainable:
        reasons = [v.reason for v in health.verdicts if v.status == "refuse"]
        log.error("no training step on iteration %d: %s", iteration, "; ".join(reasons))
        stats |= {"decision": "skipped", "policy_version": f"v{learner.version}", "reasons": reasons}
        result = TrainResult(checkpoint=checkpoint, stats=stats)
    else:
        kept = set(record.kept)
        episodes = [e for e in drawn if e.task_id in kept]
        behaviour = min((int(e.policy_version.removeprefix("v")) for e in episodes), default=None)
        stats = learner.update(episodes, behaviour) | stats | {"decision": "trained"}
        key = checkpoint_key(run_id, name, learner.version)
        learner.save(rt.store, key)
        result = TrainResult(checkpoint=key, stats=stats)
    rt.store.put_bytes(record_key, result.model_dump_json().encode())
    return result


# --- the DVC stage's door: everything in this process ------------------------------------


def train_in_process(
    rt: Runtime, tasks: list[Task], run_id: str, shard_size: int = 64, on_iteration: OnIteration | None = None
) -> LoopResult:
    """The loop with every rollout shard and update run in this process, with the lines and progress the flows
    show."""
    version = task_set_version(tasks)

    def roll(checkpoint: str | None, iteration: int) -> object:
        lineage = Lineage(run_id, iteration, version, rt.params.digest(), code_version())
        started = time.monotonic()

        def run(pending: list[shards.Shard]) -> list[ShardReport]:
            reports = []
            with track(shards.round_label(iteration, pending), len(pending)) as advance:
                for shard in pending:
                    reports.append(shards.execute_shard(rt, shard, tasks, checkpoint, lineage))
                    advance()
            return reports

        record, reports = rollout_iteration(rt, tasks, lineage, checkpoint, shard_size, run)
        final = iteration >= rt.params.train.iterations
        rollout_done(iteration, final, [r.statuses for r in reports], started=started)
        return record, reports

    def learn(iteration: int, checkpoint: str | None) -> TrainResult:
        started = time.monotonic()
        trained = train_iteration(rt, run_id, iteration, checkpoint)
        train_done(iteration, trained.stats, trained.resumed, started=started)
        return trained

    return run_iterations(rt.params, roll, learn, on_iteration)
