"""Prefect flows: wiring only. Every step is a function of trialforge.pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task

from trialforge import pipeline as steps
from trialforge.config import load_params
from trialforge.observe.run_report import finish_run
from trialforge.runtime import open_runtime


@task
def ingest(rt):
    return steps.ingest(rt)


@task
def validate(rt, tasks):
    return steps.validate(rt, tasks)


@task
def decontaminate(rt, tasks):
    return steps.decontaminate(rt, tasks)


@task
def tier(tasks):
    return steps.tier(tasks)


@task
def publish_taskset(rt, tasks):
    return steps.publish_taskset(rt, tasks)


@task
def train_loop(rt, tasks, run_id):
    return steps.train_loop(rt, tasks, run_id)


@flow(name="pipeline", log_prints=True)
def pipeline(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole loop on one machine: ingest -> validate -> decontaminate -> tier -> (rollout -> train) -> report."""
    params = load_params(Path(params_path), overrides)
    with open_runtime(params) as rt:
        tasks, f_ingest = ingest(rt)
        tasks, f_validate = validate(rt, tasks)
        tasks, f_decontam = decontaminate(rt, tasks)
        tasks = tier(tasks)
        publish_taskset(rt, tasks)
        run_id = steps.new_run_id(params.run.name)
        iterations = train_loop(rt, tasks, run_id)
        funnels = [f.as_dict() for f in (f_ingest, f_validate, f_decontam)]
        updates = [vars(r.update) for r in iterations if r.update is not None]
        return finish_run(rt, run_id, tasks, funnels, updates)
