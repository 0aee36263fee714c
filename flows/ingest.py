"""Ingest: the ticket export, synthesis and every ``sources.extra`` source into typed tasks, stored for curation
(nightly in prefect.yaml). ``overrides={"sources.extra": [...]}`` adds sources for one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from trialforge import pipeline as steps
from trialforge.config import load_params
from trialforge.loop.records import StageResult
from trialforge.observe.logs import logged_step
from trialforge.observe.summary import write_funnels
from trialforge.orchestrate import runners
from trialforge.tasks.taskset import INGESTED, publish


@task(cache_policy=NO_CACHE)
def ingest_sources(rt):
    return steps.ingest(rt)


@task(cache_policy=NO_CACHE)
def publish_ingested(rt, tasks):
    return publish(rt.store, INGESTED, tasks)


@flow(name="ingest", log_prints=True)
def ingest(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None) -> StageResult:
    params = load_params(Path(params_path), overrides)
    with runners.held_runtime(params) as rt:
        tasks, funnel = logged_step(ingest_sources, rt)
        version = publish_ingested(rt, tasks)
    funnels = [funnel.as_dict()]
    write_funnels(Path(params.run.out_dir), funnels)
    runners.funnel_artifacts(funnels)
    return StageResult(version=version, tasks=len(tasks), funnels=funnels)
