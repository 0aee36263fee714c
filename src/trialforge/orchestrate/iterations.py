"""Iterations of rollout -> train: synchronous, or with the next rollouts overlapping the update.

``train.max_staleness = S`` lets the rollout of iteration k start once the trainer has taken update k - S
(``train.staleness``): with S = 0 the loop is synchronous; with S >= 1 the sandboxes keep rolling out while
the trainer updates, on a policy at most S versions behind the one that trains on the batch. The update
corrects for the lag with the log-probabilities the rollout recorded (the PPO ratio against the behaviour
policy). Both sides' idle time is measured and reported with the run.

The flows and the DVC stage drive iterations through ``run_iterations``, each with its own ``roll`` and
``learn`` (subflows there, library calls here), so the schedule is the same whichever door started the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from trialforge.config import Params
from trialforge.inference.managed import serving
from trialforge.observe.logs import rollout_done, train_done
from trialforge.orchestrate import ShardReport, TrainResult, shards
from trialforge.progress import track
from trialforge.rollout.loop import Lineage
from trialforge.runtime import Runtime, code_version
from trialforge.tasks.schema import Task, task_set_version
from trialforge.train.staleness import StalenessStats, TaggedBatch, train_bounded

Roll = Callable[[str | None, int], object]  # (checkpoint to sample with, iteration): publishes its episodes
Learn = Callable[[int, str | None], TrainResult]  # (iteration, the trainer's latest checkpoint): one update
# (iteration, its update's stats or None): the iteration's episodes are all published (the tracker logs them)
OnIteration = Callable[[int, "dict[str, Any] | None"], None]


@dataclass
class LoopResult:
    updates: list[dict[str, Any]]  # the trainer's stats per update taken, with the lag of its batch
    checkpoint: str | None  # the learner after the last update
    staleness: StalenessStats

    def summary(self) -> dict[str, Any]:
        return asdict(self.staleness)


def run_iterations(params: Params, roll: Roll, learn: Learn, on_iteration: OnIteration | None = None) -> LoopResult:
    """``train.iterations`` rollouts (in a background thread) and their updates (here), never more than
    ``train.max_staleness`` policy versions apart; then the last checkpoint's held-out evaluation. The inference
    server of ``train.inference.command`` runs meanwhile. ``on_iteration`` hears of each iteration once its
    update (or the last evaluation) is done."""
    with serving(params):
        return _iterate(params.train.iterations, params.train.max_staleness, roll, learn, on_iteration)


def _iterate(
    iterations: int, max_staleness: int, roll: Roll, learn: Learn, on_iteration: OnIteration | None
) -> LoopResult:
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

    stats = train_bounded(roll, update, snapshot=None, version=0, batches=iterations, max_staleness=max_staleness)
    roll(latest[0], iterations)  # the trained policy on the held-out tasks (the eval round alone)
    done(iterations, None)
    return LoopResult(updates, latest[0], stats)


def train_in_process(
    rt: Runtime, tasks: list[Task], run_id: str, shard_size: int = 64, on_iteration: OnIteration | None = None
) -> LoopResult:
    """The loop with every rollout shard and update run in this process (the DVC stage's door), with the lines
    and progress the flows show."""
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

        done = shards.rollout_iteration(rt, tasks, lineage, checkpoint, shard_size, run)
        final = iteration >= rt.params.train.iterations
        rollout_done(iteration, final, [r.statuses for r in done[1]], started=started)
        return done

    def learn(iteration: int, checkpoint: str | None) -> TrainResult:
        started = time.monotonic()
        trained = shards.train_iteration(rt, run_id, iteration, checkpoint)
        train_done(iteration, trained.stats, trained.resumed, started=started)
        return trained

    return run_iterations(rt.params, roll, learn, on_iteration)
