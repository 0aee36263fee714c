"""Close a run: the task set's quality records stored, metrics.json + plot data, the HTML report, the MLflow run
finished with them, the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trialforge.observe.cost import CostRates, run_costs
from trialforge.observe.families import family_metrics
from trialforge.observe.metrics import episode_metrics, run_metrics, task_metrics, write_metrics
from trialforge.observe.quality import gather_records, quality_metrics, write_records
from trialforge.observe.report import families_key, funnel_key, loop_key, render_report
from trialforge.observe.summary import print_summary
from trialforge.observe.tracking import RunTracker, open_tracker
from trialforge.runtime import Runtime
from trialforge.store import datasets
from trialforge.tasks.schema import Task, task_set_version


def finish_run(
    rt: Runtime,
    run_id: str,
    tasks: list[Task],
    funnels: list[dict[str, Any]],
    updates: list[dict[str, Any]],
    loop: dict[str, Any],
    tracker: RunTracker | None = None,
) -> dict[str, Any]:
    """``funnels`` are Funnel.as_dict() of each task stage; ``updates`` the train step's stats per iteration;
    ``loop`` the rollout/train schedule's staleness and idle fractions (``loop.iteration``);
    ``tracker`` the run's MLflow tracker (None: opened here, as the DVC ``report`` stage needs: it continues the
    MLflow run the ``train`` stage started, or tracks the whole run now).

    The quality records of every audited task (the kept ones on ``tasks``, the excluded ones in the quality
    funnel) are stored next to the task set before the report, which reads them from there; so are the
    schedule and the learner's figures per task family (``observe.families``), beside the run's records.
    """
    out = Path(rt.params.run.out_dir)
    tracker = tracker if tracker is not None else open_tracker(rt.params, rt.store, run_id, tasks)
    version = task_set_version(tasks)
    quality = gather_records(tasks, funnels)
    if quality:
        write_records(rt.store, version, quality)
    episodes = datasets.read_pandas(rt.store, "episodes", filters={"run": run_id})
    families = family_metrics(tasks, episodes, rt.params.train.learner)
    metrics: dict[str, Any] = {
        "run_id": run_id,
        "task_set_version": version,
        "tasks": task_metrics(funnels),
        "quality": quality_metrics(quality),
        "episodes": episode_metrics(episodes),
        "updates": updates,
        "families": families,
        "loop": loop,
        "episodes_uri": rt.store.uri(f"datasets/episodes/run={run_id}"),
        "metrics_path": str(out / "metrics.json"),
        "report_path": str(out / "report.html"),
    }
    metrics |= run_metrics(rt.store, run_id)
    metrics["cost"] = run_costs(episodes, CostRates.from_params(rt.params), updates)
    metrics["tracking"] = tracker.summary()
    write_metrics(out, metrics)
    # The report reads both back from the store: only this step knows the schedule and the task set.
    rt.store.put_bytes(loop_key(run_id), json.dumps(loop, sort_keys=True).encode())
    rt.store.put_bytes(families_key(run_id), json.dumps(families, sort_keys=True).encode())
    rt.store.put_bytes(funnel_key(run_id), json.dumps(metrics["tasks"], sort_keys=True).encode())
    rates = CostRates.from_params(rt.params)
    render_report(rt.store, run_id, out / "report.html", thresholds=rt.params.observe, rates=rates)
    tracker.finish(metrics, tasks, [out / "report.html", out / "metrics.json", out / "plots"])
    metrics["tracking"] = tracker.summary()  # it may have stopped since: the summary says so
    print_summary(metrics)
    return metrics
