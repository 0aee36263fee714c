"""The pipeline as file-to-file stages, for `dvc repro` (dvc.yaml runs `trialforge stage NAME`).

Each stage reads the previous stage's task set from out/ and writes its own, so DVC can skip what has not
changed. The work itself is trialforge.pipeline's. ``STAGES`` says what each stage reads and writes, which
params change what it computes and which sources and code it depends on: ``run_stage`` takes its files from
there, and tests/test_doors.py holds dvc.yaml and params.yaml to it.

A stage shows what ``trialforge run`` shows of the same step: its line when it ends, the progress of its long
work, and (a task step) its funnel, kept in ``out/funnel/STAGE.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trialforge import pipeline
from trialforge.config import Params
from trialforge.curate.settings import DecontamConfig, SplitConfig
from trialforge.errors import ConfigError
from trialforge.funnel import Funnel
from trialforge.loop.iteration import train_in_process
from trialforge.observe.logs import logged_step, taskset_done
from trialforge.observe.metrics import task_metrics
from trialforge.observe.run_report import finish_run
from trialforge.observe.summary import funnel_file, print_tasks, write_json
from trialforge.observe.tracking import track_run
from trialforge.progress import progress_bars
from trialforge.runtime import open_runtime
from trialforge.tasks.schema import Task
from trialforge.tasks.taskset import read_tasks, write_tasks


@dataclass(frozen=True)
class Stage:
    name: str
    reads: tuple[str, ...]  # files under run.out_dir that earlier stages wrote
    writes: tuple[str, ...]  # files under run.out_dir it writes (a task step: its task set, then its funnel)
    params: tuple[str, ...]  # the params.yaml keys that change what it computes
    deps: tuple[str, ...]  # the repository's sources and code it depends on


TASK_STEPS: dict[str, Callable[..., tuple[list[Task], Funnel]]] = {  # the stages that keep and drop tasks
    "ingest": pipeline.ingest,
    "images": pipeline.environments,
    "validate": pipeline.validate,
    "decontaminate": pipeline.decontaminate,
    "quality": pipeline.quality,
}
FUNNELS = tuple(TASK_STEPS)
TASKSET = "tasks/taskset.parquet"
RUN = "train/run.json"
_DECONTAMINATION = (*SplitConfig.model_fields, *DecontamConfig.model_fields)  # the curate keys the stage reads
# what a verdict in a sandbox depends on (the validate keys: a task's own time limit, ``ValidateConfig.limit_for``)
_LIMITS = ("validate.test_timeout_s", "validate.max_duration_s", "validate.suite_timeout_factor")
_GRADING = ("sandbox", *_LIMITS, "verify", "run.seed")

STAGES = (
    Stage(
        "ingest",
        reads=(),
        writes=("tasks/ingested.parquet", funnel_file("ingest")),
        # synthesis validates its mutants, seeded, in each repository's environment
        params=(
            "sources.tickets",
            "sources.repos",
            "sources.synthesize",
            "sources.extra",
            "sources.caps",
            "run.seed",
            "validate",
            "env",
        ),
        deps=("tasks_src/tickets", "tasks_src/repos", "src/trialforge/tasks"),
    ),
    Stage(
        "images",
        reads=("tasks/ingested.parquet",),
        writes=("tasks/environments.parquet", funnel_file("images")),
        params=("env",),
        deps=("src/trialforge/tasks/envdetect", "src/trialforge/tasks/envimages.py"),
    ),
    Stage(
        "validate",
        reads=("tasks/environments.parquet",),
        writes=("tasks/validated.parquet", funnel_file("validate")),
        params=("validate", "sandbox"),
        deps=("src/trialforge/tasks/validate.py", "src/trialforge/testrun"),
    ),
    Stage(
        "decontaminate",
        reads=("tasks/validated.parquet",),
        writes=("tasks/decontaminated.parquet", funnel_file("decontaminate")),
        params=("sources.eval_set", *(f"curate.{key}" for key in _DECONTAMINATION), "run.seed"),
        deps=("tasks_src/eval", "src/trialforge/curate"),
    ),
    Stage(
        "quality",
        reads=("tasks/decontaminated.parquet",),
        writes=("tasks/quality.parquet", funnel_file("quality")),
        params=("quality", *_GRADING),
        deps=("src/trialforge/quality", "src/trialforge/verify"),
    ),
    Stage(
        "tier",
        reads=("tasks/quality.parquet",),
        writes=(TASKSET,),
        params=(),
        deps=("src/trialforge/curate",),
    ),
    Stage(
        "train",
        reads=(TASKSET,),
        writes=(RUN,),
        # the sampler draws each batch, the health gates decide each step
        params=(
            "rollout",
            "train",
            *_GRADING,
            "curate.sampler",
            "curate.pass_k",
            "observe.max_env_error_rate",
            "observe.max_verifier_error_rate",
            "observe.learning",
        ),
        deps=("src/trialforge/rollout", "src/trialforge/train", "src/trialforge/verify"),
    ),
    Stage(
        "report",
        reads=(RUN, TASKSET, *(funnel_file(s) for s in FUNNELS)),
        writes=("metrics.json", "plots", "report.html"),
        params=("observe",),
        deps=("src/trialforge/observe",),
    ),
)
NAMES = tuple(s.name for s in STAGES)


def run_stage(name: str, params: Params) -> None:
    """Run stage ``name`` on the files of ``params.run.out_dir`` (a ConfigError for a name no stage has)."""
    stage = next((s for s in STAGES if s.name == name), None)
    if stage is None:
        raise ConfigError(f"unknown stage {name!r}; stages: {', '.join(NAMES)}")
    out = Path(params.run.out_dir)
    reads, writes = [out / p for p in stage.reads], [out / p for p in stage.writes]
    funnel: Funnel | None = None
    with progress_bars(), open_runtime(params) as rt:
        if name in TASK_STEPS:  # the task set before it in (none for ingest), its task set and funnel out
            tasks, funnel = logged_step(TASK_STEPS[name], rt, *(read_tasks(path) for path in reads))
            write_tasks(writes[0], tasks)
            write_json(writes[1], funnel.as_dict())
        elif name == "tier":
            started = time.monotonic()
            tasks = pipeline.tier(read_tasks(reads[0]))
            taskset_done(len(tasks), pipeline.publish_taskset(rt, tasks), started=started)
        elif name == "train":
            run_id = pipeline.new_run_id(params.run.name)
            tasks = read_tasks(reads[0])
            with track_run(params, rt.store, run_id, tasks) as tracker:  # the report stage finishes it
                loop = train_in_process(rt, tasks, run_id, on_iteration=tracker.log_iteration)
            write_json(writes[0], {"run_id": run_id, "updates": loop.updates, "loop": loop.summary()})
        else:  # report
            run = json.loads(reads[0].read_text())
            funnels = [json.loads(path.read_text()) for path in reads[2:]]
            finish_run(rt, run["run_id"], read_tasks(reads[1]), funnels, run["updates"], run["loop"])
    if funnel is not None:  # below the progress view, as `trialforge run` prints its summary
        print_tasks(
            task_metrics([funnel.as_dict()]), footer=f"{funnel.kept} tasks -> {writes[0]}; every drop: {writes[1]}"
        )
