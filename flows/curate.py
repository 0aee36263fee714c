"""Curate an ingested task set (or a task file): environments -> validate -> decontaminate -> quality gate -> tier ->
publish."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from trialforge import pipeline as steps
from trialforge.config import load_params
from trialforge.loop.records import StageResult
from trialforge.observe.logs import logged_step, taskset_done
from trialforge.observe.summary import write_funnels
from trialforge.orchestrate import TaskSetVersion, runners
from trialforge.tasks.taskset import INGESTED, read_published, read_tasks


@task(cache_policy=NO_CACHE)
def environments(rt, tasks):
    return steps.environments(rt, tasks)


@task(cache_key_fn=runners.validation_cache_key, persist_result=True)
def validate(rt, tasks):
    return steps.validate(rt, tasks)


@task(cache_policy=NO_CACHE)
def decontaminate(rt, tasks):
    return steps.decontaminate(rt, tasks)


@task(cache_policy=NO_CACHE)
def quality(rt, tasks):
    return steps.quality(rt, tasks)


@task(cache_policy=NO_CACHE)
def tier(tasks):
    return steps.tier(tasks)


@task(cache_policy=NO_CACHE)
def publish_taskset(rt, tasks):
    return steps.publish_taskset(rt, tasks)


@flow(name="curate", log_prints=True)
def curate(
    params_path: str = "params.yaml",
    overrides: dict[str, Any] | None = None,
    ingested: TaskSetVersion | None = None,
    tasks_file: str | None = None,
) -> StageResult:
    """``ingested``: the version the ingest flow published, None the latest; ``tasks_file``: a task set file
    instead (`trialforge validate FILE`)."""
    params = load_params(Path(params_path), overrides)
    with runners.held_runtime(params) as rt:
        if tasks_file is not None:
            tasks = read_tasks(Path(tasks_file))
        else:
            _, tasks = read_published(rt.store, INGESTED, ingested)
        tasks, provided = logged_step(environments, rt, tasks)
        tasks, validated = logged_step(validate, rt, tasks)
        tasks, decontaminated = logged_step(decontaminate, rt, tasks)
        tasks, gated = logged_step(quality, rt, tasks)
        started = time.monotonic()
        version = publish_taskset(rt, tier(tasks))
        taskset_done(len(tasks), version, started=started)
    funnels = [provided.as_dict(), validated.as_dict(), decontaminated.as_dict(), gated.as_dict()]
    write_funnels(Path(params.run.out_dir), funnels)
    runners.funnel_artifacts(funnels)
    return StageResult(version=version, tasks=len(tasks), funnels=funnels)
