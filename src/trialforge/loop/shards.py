"""A round's episodes as shards: fixed lists of (task, policy, sample, seed) jobs, tens to hundreds of episodes,
each published as one part of ``episodes`` and of ``steps``. No Prefect here: the caller decides where a round's
shards run (``RunShards``: threads here, a Ray cluster through ``orchestrate.runners``).

A part is named by its round, its index and a digest of the round's plan, so:

- a retried shard rewrites the same keys instead of adding rows;
- a rerun of a dead run (same run id) skips the shards published in both datasets;
- a rerun under another plan (tasks, policies, group size, seed, shard size) is refused, never mixed
  into the same partition.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import astuple, dataclass

from trialforge.errors import ConfigError
from trialforge.loop.learner import rollout_policy
from trialforge.loop.records import ShardNode, ShardReport
from trialforge.pipeline import make_policies, make_rollout, store_episodes
from trialforge.rollout.loop import EpisodeJob, Lineage, planned, run_jobs
from trialforge.rollout.policies import Policy
from trialforge.runtime import Runtime
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.tasks.envimages import obtain_images
from trialforge.tasks.schema import Task, task_set_version

log = logging.getLogger(__name__)

EPISODE_DATASETS = ("episodes", "steps")  # pipeline.store_episodes writes a shard's part to both, in this order
_PART = re.compile(r"^(?:r(\d+)|(eval))-\d{5}-[0-9a-f]{8}$")
EVAL = "eval"  # the round of held-out episodes
Round = int | str  # a number, or EVAL
RunShards = Callable[[list["Shard"]], list[ShardReport]]  # runs the pending shards of one round, wherever


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


def plan_shards(
    tasks: list[Task], policies: list[str], group_size: int, seed: int, shard_size: int, round_: Round
) -> list[Shard]:
    """The jobs ``plan_jobs`` would make (G per task and policy, their seeds), by policy name, cut into shards of
    ``shard_size``; the policies themselves are built where each shard runs."""
    jobs = [Job(task.task_id, name, sample, s) for task, name, sample, s in planned(tasks, policies, group_size, seed)]
    blob = json.dumps([task_set_version(tasks), shard_size, [astuple(j) for j in jobs]])
    digest = hashlib.sha256(blob.encode()).hexdigest()[:8]
    starts = range(0, len(jobs), shard_size)
    label = EVAL if round_ == EVAL else f"r{round_}"
    return [Shard(f"{label}-{n:05d}-{digest}", tuple(jobs[at : at + shard_size])) for n, at in enumerate(starts)]


def _partition(lineage: Lineage) -> dict[str, str]:
    return {"run": lineage.run_id, "iteration": str(lineage.iteration)}


def _part_name(entry: dict) -> str:
    return entry["key"].rsplit("/part-", 1)[1].removesuffix(".parquet")


def pending_shards(store: ObjectStore, plan: list[Shard], lineage: Lineage) -> list[Shard]:
    """The shards of ``plan`` (one round) not yet published in both datasets for this run and iteration."""
    published = {
        name: {_part_name(e) for e in datasets.list_parts(store, name, filters=_partition(lineage))}
        for name in EPISODE_DATASETS
    }
    planned = {s.id for s in plan}
    rounds = {round_of(s) for s in planned}
    foreign = sorted(p for p in set.union(*published.values()) if p not in planned and round_of(p) in rounds | {None})
    if foreign:
        raise ConfigError(
            f"run {lineage.run_id!r} iteration {lineage.iteration} already holds parts {foreign[:3]} of another "
            "plan (other tasks, policies, group size, seed or shard size); resume it with the settings it "
            "started with, or start a new run id"
        )
    done = set.intersection(*published.values())
    return [s for s in plan if s.id not in done]


def round_of(part: str) -> Round | None:
    """The round a shard's part belongs to (a number, or ``EVAL``); None for a part no shard plan names."""
    match = _PART.match(part)
    if not match:
        return None
    return EVAL if match.group(2) else int(match.group(1))


def round_label(iteration: int, shards: list[Shard]) -> str:
    """What the progress view calls a round's shards."""
    return f"rollout iteration {iteration}" + (f" round {round_of(shards[0].id)}" if shards else "")


def learner_policy(rt: Runtime, checkpoint: str | None) -> Policy:
    """The learner as of ``checkpoint`` (None: untrained) as a rollout policy, loaded where the shard runs.

    A process keeps the last one it loaded: the shards of an iteration share it instead of each loading a model.
    """
    key = (rt.store.url, checkpoint, rt.params.digest())
    with _loaded_lock:
        if key not in _loaded:
            _loaded.clear()
            _loaded[key] = rollout_policy(rt.params, rt.store, checkpoint)
        return _loaded[key]


_loaded: dict[tuple[str, str | None, str], Policy] = {}
_loaded_lock = threading.Lock()


def execute_shard(
    rt: Runtime, shard: Shard, tasks: list[Task], checkpoint: str | None, lineage: Lineage
) -> ShardReport:
    """Run the shard's episodes, ``sandbox.concurrency`` at a time, in sandboxes of ``rt`` (opened by this process,
    on this machine), and publish them as part ``shard.id``."""
    started = time.time()
    by_id = {t.task_id: t for t in tasks}
    missing = sorted(set(shard.task_ids()) - set(by_id))
    if missing:
        raise ConfigError(f"shard {shard.id} needs tasks {missing} that were not given to it")
    names = sorted({job.policy for job in shard.jobs})
    learner = learner_policy(rt, checkpoint) if rt.params.train.learner in names else None
    by_name = dict(zip(names, make_policies(names, tasks, learner, rt.params.rollout), strict=True))
    jobs = [EpisodeJob(by_id[j.task_id], by_name[j.policy], j.sample, j.seed) for j in shard.jobs]
    obtain_images(rt.store, (job.task for job in jobs))  # a worker that did not build them takes them by digest
    episodes = run_jobs(make_rollout(rt, lineage), jobs, rt.params.sandbox.concurrency)
    store_episodes(rt.store, episodes, lineage, part=shard.id)
    statuses = dict(Counter(e.status for e in episodes))
    log.info("shard published", extra={"shard": shard.id, "episodes": len(episodes), "statuses": statuses})
    return ShardReport(
        shard_id=shard.id,
        episodes=len(episodes),
        statuses=statuses,
        started_at=started,
        finished_at=time.time(),
        node=ShardNode.here(),
    )
