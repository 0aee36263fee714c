"""Rollout: one iteration's episodes of a task set and a policy version, in shards, resumable by run id."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow

from trialforge.config import load_params
from trialforge.loop.iteration import rollout_iteration
from trialforge.observe.logs import rollout_done
from trialforge.orchestrate import Iteration, RolloutResult, RunId, ShardRunner, ShardSize, TaskSetVersion, runners
from trialforge.rollout.loop import Lineage
from trialforge.runtime import code_version
from trialforge.tasks.taskset import TASKS, read_published


@flow(name="rollout", log_prints=True)
def rollout(
    run_id: RunId,
    iteration: Iteration = 0,
    params_path: str = "params.yaml",
    overrides: dict[str, Any] | None = None,
    task_set: TaskSetVersion | None = None,
    checkpoint: str | None = None,
    runner: ShardRunner = "default",
    ray_address: str | None = None,
    shard_size: ShardSize = 64,
) -> RolloutResult:
    """``task_set``: a curated version (None: the latest); ``checkpoint``: the learner's weights (None: fresh)."""
    params = load_params(Path(params_path), overrides)
    runners.check_runner(runner, ray_address)
    with runners.held_runtime(params) as rt:
        version, tasks = read_published(rt.store, TASKS, task_set)
        lineage = Lineage(run_id, iteration, version, params.digest(), code_version())
        start = time.monotonic()
        with runners.shard_submitter(params, lineage, tasks, checkpoint, runner, ray_address) as run:
            record, reports = rollout_iteration(rt, tasks, lineage, checkpoint, shard_size, run)
        wall_s = time.monotonic() - start
        runners.episode_artifacts(rt.store, run_id, iteration)
        runners.shard_artifact(reports)
    rollout_done(iteration, iteration >= params.train.iterations, [r.statuses for r in reports], started=start)
    return RolloutResult(run_id=run_id, iteration=iteration, wall_s=wall_s, reports=reports, record=record)
