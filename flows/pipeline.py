"""The whole loop: ingest -> curate -> (rollout -> train) x train.iterations -> report, as subflows.

A run that died resumes where it stopped when rerun with its ``run_id``: it keeps the task set it started
with, and skips the shards it published and the training steps it took.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Any

from prefect import flow

from flows.curate import curate
from flows.ingest import ingest
from flows.rollout import rollout
from flows.train import train
from trialforge.config import load_params
from trialforge.loop.iteration import run_iterations
from trialforge.loop.records import TrainResult, start_run, started_run
from trialforge.observe.run_report import finish_run
from trialforge.observe.tracking import track_run
from trialforge.orchestrate import RunId, ShardRunner, ShardSize, runners
from trialforge.tasks.taskset import TASKS, read_published


@flow(name="pipeline", log_prints=True)
def pipeline(
    params_path: str = "params.yaml",
    overrides: dict[str, Any] | None = None,
    run_id: RunId | None = None,
    runner: ShardRunner = "default",
    ray_address: str | None = None,
    shard_size: ShardSize = 64,
) -> dict[str, Any]:
    """Returns the run's metrics (also written to out/metrics.json). ``run_id``: None starts a new run."""
    params = load_params(Path(params_path), overrides)
    runners.check_runner(runner, ray_address)
    run_id = run_id or runners.default_run_id(params.run.name)
    common = {"params_path": params_path, "overrides": overrides}
    with runners.held_runtime(params) as rt:
        taskset = started_run(rt.store, run_id)
        if taskset is None:
            ingested = ingest(**common)
            curated = curate(**common, ingested=ingested.version)
            funnels = ingested.funnels + curated.funnels
            taskset = start_run(rt.store, run_id, curated.model_copy(update={"funnels": funnels}))
        rollout_args = {**common, "task_set": taskset.version, "runner": runner, "ray_address": ray_address}
        context = contextvars.copy_context()  # the rollouts run in the loop's thread: as subflows of this run

        def roll(checkpoint: str | None, iteration: int) -> object:
            return context.run(
                rollout,
                run_id=run_id,
                iteration=iteration,
                checkpoint=checkpoint,
                shard_size=shard_size,
                **rollout_args,
            )

        def learn(iteration: int, checkpoint: str | None) -> TrainResult:
            return train(run_id=run_id, iteration=iteration, **common, checkpoint=checkpoint)

        _, tasks = read_published(rt.store, TASKS, taskset.version)
        with track_run(params, rt.store, run_id, tasks) as tracker:  # MLflow: params, each iteration, the end
            loop = run_iterations(params, roll, learn, tracker.log_iteration)
            metrics = finish_run(rt, run_id, tasks, taskset.funnels, loop.updates, loop.summary(), tracker)
        runners.funnel_artifacts(taskset.funnels)
        runners.episode_artifacts(rt.store, run_id)
    return metrics
