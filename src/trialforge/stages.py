"""The pipeline as file-to-file stages, for `dvc repro` (dvc.yaml runs `trialforge stage NAME`).

Each stage reads the previous stage's task set from out/ and writes its own, so
DVC can skip what has not changed. The work itself is trialforge.pipeline's.
"""

from __future__ import annotations

import json
from pathlib import Path

from trialforge import pipeline
from trialforge.config import Params
from trialforge.funnel import Funnel
from trialforge.observe.run_report import finish_run
from trialforge.observe.summary import write_json
from trialforge.observe.tracking import track_run
from trialforge.orchestrate.iterations import train_in_process
from trialforge.runtime import open_runtime
from trialforge.tasks.taskset import read_tasks, write_tasks

STAGES = ("ingest", "images", "validate", "decontaminate", "quality", "tier", "train", "report")
FUNNELS = STAGES[:5]  # the stages that keep and drop tasks


def _paths(params: Params) -> dict[str, Path]:
    out = Path(params.run.out_dir)
    return {
        "ingest": out / "tasks" / "ingested.parquet",
        "images": out / "tasks" / "environments.parquet",
        "validate": out / "tasks" / "validated.parquet",
        "decontaminate": out / "tasks" / "decontaminated.parquet",
        "quality": out / "tasks" / "quality.parquet",
        "tier": out / "tasks" / "taskset.parquet",
        "train": out / "train" / "run.json",
        "funnels": out / "funnel",
    }


def run_stage(name: str, params: Params) -> None:
    paths = _paths(params)
    with open_runtime(params) as rt:
        if name == "ingest":
            tasks, funnel = pipeline.ingest(rt)
            _save(paths, "ingest", tasks, funnel)
        elif name == "images":
            tasks, funnel = pipeline.environments(rt, read_tasks(paths["ingest"]))
            _save(paths, "images", tasks, funnel)
        elif name == "validate":
            tasks, funnel = pipeline.validate(rt, read_tasks(paths["images"]))
            _save(paths, "validate", tasks, funnel)
        elif name == "decontaminate":
            tasks, funnel = pipeline.decontaminate(rt, read_tasks(paths["validate"]))
            _save(paths, "decontaminate", tasks, funnel)
        elif name == "quality":
            tasks, funnel = pipeline.quality(rt, read_tasks(paths["decontaminate"]))
            _save(paths, "quality", tasks, funnel)
        elif name == "tier":
            pipeline.publish_taskset(rt, pipeline.tier(read_tasks(paths["quality"])))
        elif name == "train":
            run_id = pipeline.new_run_id(params.run.name)
            tasks = read_tasks(paths["tier"])
            with track_run(params, rt.store, run_id, tasks) as tracker:  # the report stage finishes it
                loop = train_in_process(rt, tasks, run_id, on_iteration=tracker.log_iteration)
            write_json(paths["train"], {"run_id": run_id, "updates": loop.updates, "loop": loop.summary()})
        elif name == "report":
            run = json.loads(paths["train"].read_text())
            funnels = [json.loads((paths["funnels"] / f"{s}.json").read_text()) for s in FUNNELS]
            finish_run(rt, run["run_id"], read_tasks(paths["tier"]), funnels, run["updates"], run["loop"])
        else:
            raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")


def _save(paths: dict[str, Path], stage: str, tasks, funnel: Funnel) -> None:
    write_tasks(paths[stage], tasks)
    write_json(paths["funnels"] / f"{stage}.json", funnel.as_dict())
