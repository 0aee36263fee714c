"""The whole loop: ingest -> curate -> (rollout -> train) x train.iterations -> report, as subflows.

A run that died resumes where it stopped when rerun with its ``run_id``: it keeps the task set it started
with, and skips the shards it published and the training steps it took.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from flows.curate import curate
from flows.ingest import ingest
from flows.rollout import rollout
from flows.train import train
from trialforge.config import load_params
from trialforge.observe.run_report import finish_run
from trialforge.orchestrate import RunId, Runner, ShardSize, runners, shards


@flow(name="pipeline", log_prints=True)
def pipeline(
    params_path: str = "params.yaml",
    overrides: dict[str, Any] | None = None,
    run_id: RunId | None = None,
    runner: Runner = "default",
    ray_address: str | None = None,
    shard_size: ShardSize = 64,
) -> dict[str, Any]:
    """Returns the run's metrics (also written to out/metrics.json). ``run_id``: None starts a new run."""
    params = load_params(Path(params_path), overrides)
    runners.check_runner(runner, ray_address)
    run_id = run_id or runners.default_run_id(params.run.name)
    common = {"params_path": params_path, "overrides": overrides}
    with runners.held_runtime(params) as rt:
        taskset = shards.started_run(rt.store, run_id)
        if taskset is None:
            ingested = ingest(**common)
            curated = curate(**common, ingested=ingested.version)
            funnels = ingested.funnels + curated.funnels
            taskset = shards.start_run(rt.store, run_id, curated.model_copy(update={"funnels": funnels}))
        checkpoint, updates = None, []
        for iteration in range(params.train.iterations):
            rollout(
                run_id=run_id,
                iteration=iteration,
                **common,
                task_set=taskset.version,
                checkpoint=checkpoint,
                runner=runner,
                ray_address=ray_address,
                shard_size=shard_size,
            )
            trained = train(run_id=run_id, iteration=iteration, **common, checkpoint=checkpoint)
            checkpoint = trained.checkpoint
            updates += [trained.stats] if trained.stats else []
        _, tasks = shards.read_taskset(rt.store, shards.TASKS, taskset.version)
        metrics = finish_run(rt, run_id, tasks, taskset.funnels, updates)
        runners.funnel_artifacts(taskset.funnels)
        runners.episode_artifacts(rt.store, run_id)
    return metrics
