"""Rollout work as shards, and the store traffic around them. No Prefect here: ``runners`` submits these.

A shard is a fixed list of (task, policy, sample, seed) jobs, tens to hundreds of episodes: one Prefect
task, one published part of ``episodes`` and of ``steps``. The plan is a pure function of the task set,
the policies, the group size, the seed and the shard size, and each part is named by its shard's index
and the plan's digest, so:

- a retried shard rewrites the same keys instead of adding rows;
- a rerun of a dead run (same run id) skips the shards published in both datasets;
- a rerun under a different plan is refused, never mixed into the same partition.

Around the shards: the task sets they read (``ingested`` from the ingest flow, ``tasks`` from curation)
and the learner's step over the episodes they published, checkpointed so that it too is taken once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, fields

from trialforge.config import Params
from trialforge.errors import ConfigError
from trialforge.orchestrate import ShardReport, StageResult, TrainResult
from trialforge.pipeline import make_policies, store_episodes
from trialforge.rollout.env import EnvLimits
from trialforge.rollout.loop import Lineage, Rollout
from trialforge.rollout.records import EpisodeRecord, StepRecord
from trialforge.rollout.repair import RepairPolicy
from trialforge.runtime import Runtime
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.tasks.schema import Task, task_set_version
from trialforge.tasks.taskset import from_table, to_table
from trialforge.train.repair_trainer import RepairTrainer

log = logging.getLogger(__name__)

INGESTED = "ingested"  # task sets as the ingest flow found them
TASKS = "tasks"  # curated task sets (pipeline.publish_taskset)
EPISODE_DATASETS = ("episodes", "steps")  # pipeline.store_episodes writes a shard's part to both, in this order


# --- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    task_id: str
    policy: str
    sample: int
    seed: int


@dataclass(frozen=True)
class Shard:
    id: str  # the part name of its rows in episodes and steps
    jobs: tuple[Job, ...]

    def task_ids(self) -> list[str]:
        return sorted({job.task_id for job in self.jobs})


def batch_seed(params: Params, iteration: int) -> int:
    """The seed of one iteration's rollout batch (as ``pipeline.rollout`` derives it)."""
    return params.run.seed * 1000 + iteration


def plan_shards(tasks: list[Task], policies: list[str], group_size: int, seed: int, shard_size: int) -> list[Shard]:
    """G jobs per (task, policy) with ``run_batch``'s seeds, tasks in id order, cut into shards of ``shard_size``."""
    ordered = sorted(tasks, key=lambda t: t.task_id)
    combos = ((t.task_id, p, s) for t in ordered for p in policies for s in range(group_size))
    jobs = [Job(task_id, policy, sample, seed * 1_000_003 + i) for i, (task_id, policy, sample) in enumerate(combos)]
    blob = json.dumps([task_set_version(tasks), shard_size, [astuple(j) for j in jobs]])
    digest = hashlib.sha256(blob.encode()).hexdigest()[:8]
    starts = range(0, len(jobs), shard_size)
    return [Shard(f"shard-{n:05d}-{digest}", tuple(jobs[at : at + shard_size])) for n, at in enumerate(starts)]


def _partition(lineage: Lineage) -> dict[str, str]:
    return {"run": lineage.run_id, "iteration": str(lineage.iteration)}


def _part_name(entry: dict) -> str:
    return entry["key"].rsplit("/part-", 1)[1].removesuffix(".parquet")


def pending_shards(store: ObjectStore, plan: list[Shard], lineage: Lineage) -> list[Shard]:
    """The shards of ``plan`` not yet published in both datasets for this run and iteration."""
    published = {
        name: {_part_name(e) for e in datasets.list_parts(store, name, filters=_partition(lineage))}
        for name in EPISODE_DATASETS
    }
    foreign = sorted(set.union(*published.values()) - {s.id for s in plan})
    if foreign:
        raise ConfigError(
            f"run {lineage.run_id!r} iteration {lineage.iteration} already holds parts {foreign[:3]} of a different "
            "shard plan (other tasks, policies, group size, seed or shard size); resume it with the settings it "
            "started with, or start a new run id"
        )
    done = set.intersection(*published.values())
    return [s for s in plan if s.id not in done]


# --- running one shard -------------------------------------------------------------------


@dataclass(frozen=True)
class RepairState:
    """The learnable policy as it travels to a worker: a version and its weights (None: untrained), no trainer,
    so a worker that only rolls out never builds an optimiser."""

    version: int = 0
    weights: tuple[float, ...] | None = None

    @classmethod
    def of(cls, trainer: RepairTrainer) -> RepairState:
        return cls(trainer.version, tuple(trainer.weights.detach().tolist()))

    def policy(self) -> RepairPolicy:
        """The policy ``RepairTrainer.policy()`` would give (what ``make_policies`` asks its trainer for)."""
        return RepairPolicy(list(self.weights) if self.weights is not None else None, version=f"v{self.version}")


def _rollout(rt: Runtime, lineage: Lineage) -> Rollout:
    rp, sp = rt.params.rollout, rt.params.sandbox
    return Rollout(
        backend=rt.backend,
        image=rt.image.name,
        image_digest=rt.image_digest,
        snapshots=rt.snapshots,
        grader=rt.grader(),
        limits=sp.limits(),
        env_limits=EnvLimits(
            max_turns=rp.max_turns,
            observation_cap=rp.observation_cap,
            command_timeout_s=sp.exec_timeout_s,
            episode_timeout_s=sp.episode_timeout_s,
        ),
        lineage=lineage,
        env_retries=rp.env_retries,
    )


def execute_shard(rt: Runtime, shard: Shard, tasks: list[Task], repair: RepairState, lineage: Lineage) -> ShardReport:
    """Run the shard's episodes, ``sandbox.concurrency`` at a time, and publish them as part ``shard.id``."""
    started = time.time()
    by_id = {t.task_id: t for t in tasks}
    missing = sorted(set(shard.task_ids()) - set(by_id))
    if missing:
        raise ConfigError(f"shard {shard.id} needs tasks {missing} that were not given to it")
    names = sorted({job.policy for job in shard.jobs})
    policies = dict(zip(names, make_policies(names, tasks, repair), strict=True))  # type: ignore[arg-type]
    runner = _rollout(rt, lineage)
    with ThreadPoolExecutor(max_workers=max(rt.params.sandbox.concurrency, 1)) as pool:
        episodes = list(
            pool.map(lambda j: runner.episode(by_id[j.task_id], policies[j.policy], j.sample, j.seed), shard.jobs)
        )
    store_episodes(rt, episodes, lineage, part=shard.id)
    statuses = dict(Counter(e.status for e in episodes))
    log.info("shard published", extra={"shard": shard.id, "episodes": len(episodes), "statuses": statuses})
    return ShardReport(
        shard_id=shard.id, episodes=len(episodes), statuses=statuses, started_at=started, finished_at=time.time()
    )


# --- around the shards: task sets in, episodes and checkpoints out -----------------------


def publish_ingested(rt: Runtime, tasks: list[Task]) -> str:
    """Store the ingest flow's tasks (partition ``task_set=VERSION``) for curation to pick up; return the version."""
    version = task_set_version(tasks)
    datasets.write_part(rt.store, INGESTED, to_table(tasks), partition={"task_set": version}, part="all")
    return version


def read_taskset(store: ObjectStore, dataset: str, version: str | None = None) -> tuple[str, list[Task]]:
    """A task set of ``dataset`` by version; ``None`` picks the one published last."""
    entries = datasets.list_parts(store, dataset, filters={"task_set": version} if version else None)
    if not entries:
        which = f"version {version}" if version else "any task set"
        raise ConfigError(f"{store.uri(f'datasets/{dataset}')} holds {which}: run the flow that publishes it first")
    version = version or max(entries, key=lambda e: e["written_at"])["partition"]["task_set"]
    table = datasets.read_table(store, dataset, filters={"task_set": version})
    return version, from_table(table.drop_columns(["task_set"]))  # the partition key is not a task field


def run_record_key(run_id: str) -> str:
    return f"runs/{run_id}.json"


def start_run(store: ObjectStore, run_id: str, taskset: StageResult) -> StageResult:
    """Record the task set a run trains on (and the funnels that made it) before its first rollout."""
    store.put_bytes(run_record_key(run_id), taskset.model_dump_json().encode())
    return taskset


def started_run(store: ObjectStore, run_id: str) -> StageResult | None:
    """The task set a run recorded at its start, or None for a run not started: a resumed run keeps its task
    set even if curating again would give another version (validation timings are part of a task)."""
    key = run_record_key(run_id)
    return StageResult.model_validate_json(store.get_bytes(key)) if store.exists(key) else None


def load_episodes(store: ObjectStore, run_id: str, iteration: int, policy: str) -> list[EpisodeRecord]:
    """A policy's published episodes of one iteration, with their steps, in a stable order."""
    where = {"run": run_id, "iteration": str(iteration)}
    episodes = datasets.read_table(store, "episodes", filters={**where, "policy": policy})
    if episodes.num_rows == 0:
        return []
    steps = datasets.read_table(store, "steps", filters={**where, "episode_id": episodes["episode_id"].to_pylist()})
    by_episode: dict[str, list[StepRecord]] = defaultdict(list)
    if steps.num_rows:
        for row in steps.select([f.name for f in fields(StepRecord)]).to_pylist():
            by_episode[row["episode_id"]].append(StepRecord(**row))
    columns = [f.name for f in fields(EpisodeRecord) if f.name != "step_rows"]
    records = [
        EpisodeRecord(**row, step_rows=sorted(by_episode[row["episode_id"]], key=lambda s: s.step))
        for row in episodes.select(columns).to_pylist()
    ]
    return sorted(records, key=lambda e: (e.task_id, e.sample, e.seed))


LEARNER = "repair"  # the policy the train step updates


def checkpoint_key(run_id: str, version: int) -> str:
    """Where ``pipeline.train_loop`` and the train flow keep the learner after update number ``version``."""
    return f"checkpoints/{run_id}/{LEARNER}-v{version}.pt"


def load_trainer(rt: Runtime, checkpoint: str | None) -> RepairTrainer:
    return RepairTrainer.load(rt.params.train, rt.store, checkpoint) if checkpoint else RepairTrainer(rt.params.train)


def repair_state(rt: Runtime, checkpoint: str | None) -> RepairState:
    """The learner's policy as of ``checkpoint`` (None: untrained)."""
    return RepairState.of(load_trainer(rt, checkpoint)) if checkpoint else RepairState()


def train_iteration(rt: Runtime, run_id: str, iteration: int, checkpoint: str | None) -> TrainResult:
    """One update of the learner from ``checkpoint`` over the iteration's published episodes.

    The checkpoint is saved first and its stats beside it last: the stats mark the step as taken, so a
    rerun of the run returns them instead of updating twice.
    """
    trainer = load_trainer(rt, checkpoint)
    key = checkpoint_key(run_id, trainer.version + 1)
    stats_key = key.removesuffix(".pt") + ".json"
    if rt.store.exists(stats_key):
        return TrainResult(checkpoint=key, stats=json.loads(rt.store.get_bytes(stats_key)), resumed=True)
    episodes = load_episodes(rt.store, run_id, iteration, LEARNER)
    if not episodes:
        return TrainResult(checkpoint=checkpoint, stats=None)
    stats = vars(trainer.update(episodes))
    trainer.save(rt.store, key)
    rt.store.put_bytes(stats_key, json.dumps(stats, sort_keys=True).encode())
    return TrainResult(checkpoint=key, stats=stats)
