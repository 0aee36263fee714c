"""Rollout work as shards, and the store traffic around them. No Prefect here: ``runners`` submits the shards.

An iteration (``orchestrate.iterations`` schedules them) rolls out in rounds:

- the ``eval`` round: the learner on every held-out (eval-split) task, ``rollout.eval_group_size``
  episodes each, with the same seeds every iteration (its held-out curve; never trained on);
- rounds 1, 2, ...: the learner's groups as its ``BatchSampler`` draws them (a round's rewards decide
  the next draw);
- round 0: the scripted policies (gold, noop), ``rollout.reference_group_size`` episodes per task (they do
  not sample: one is the canary that grading still gives a fix 1 and no edit 0), last, on the tasks the
  rounds above rolled out (``rollout.reference_tasks: used``), or on every task (``all``, and any run
  without a learner). A canary beside every reward the iteration uses, not a re-validation of
  the whole task set each iteration: that was half the demo's episodes.

After the last update one more iteration number runs the eval round alone: the trained policy's held-out
score. Each round is cut into shards: fixed lists of (task, policy, sample, seed) jobs, tens to hundreds
of episodes, one Prefect task each, one published part of ``episodes`` and of ``steps``. A part is named
by its round, its index and a digest of the round's plan, so:

- a retried shard rewrites the same keys instead of adding rows;
- a rerun of a dead run (same run id) skips the shards published in both datasets, and replays the
  sampler from the rewards already stored, so it draws what the dead run drew;
- a rerun under another plan (tasks, policies, group size, seed, shard size) is refused, never mixed
  into the same partition.

The end of an iteration's rollout is recorded (``runs/RUN/iteration-I.json``: the sampler's kept groups,
the live pass rates after it, the learner's measured pass@k per task, its stats); the learner's step reads
that record and the published episodes, asks the health gates, and records what it did
(``runs/RUN/train-I.json``: trained, or skipped with the reasons), which marks the step as taken. Around
all this: the task sets the flows hand each other through the store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import astuple, dataclass, fields

from trialforge.curate.difficulty import measure_difficulty
from trialforge.curate.sampler import BatchSampler, group_rewards, update_pass_rates
from trialforge.curate.tiers import policy_key, tier_tasks
from trialforge.errors import ConfigError
from trialforge.observe.health import learning_health
from trialforge.orchestrate import IterationRecord, ShardNode, ShardReport, StageResult, TrainResult
from trialforge.pipeline import assert_healthy, eval_seed, make_policies, make_rollout, round_seed, store_episodes
from trialforge.rollout.loop import EpisodeJob, Lineage, planned, run_jobs
from trialforge.rollout.policies import Policy
from trialforge.rollout.records import EpisodeRecord, StepRecord
from trialforge.runtime import Runtime
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.tasks.envimages import obtain_images
from trialforge.tasks.schema import Task, task_set_version
from trialforge.tasks.taskset import from_table, to_table
from trialforge.train.learner import learner_name, open_learner, rollout_policy

log = logging.getLogger(__name__)

INGESTED = "ingested"  # task sets as the ingest flow found them
TASKS = "tasks"  # curated task sets (pipeline.publish_taskset)
EPISODE_DATASETS = ("episodes", "steps")  # pipeline.store_episodes writes a shard's part to both, in this order
_PART = re.compile(r"^(?:r(\d+)|(eval))-\d{5}-[0-9a-f]{8}$")
EVAL = "eval"  # the round of held-out episodes
Round = int | str  # a number, or EVAL


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


# --- running one shard -------------------------------------------------------------------


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
    learner = learner_policy(rt, checkpoint) if learner_name(rt.params) in names else None
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


# --- one iteration -----------------------------------------------------------------------

RunShards = Callable[[list[Shard]], list[ShardReport]]  # runs the pending shards of one round, wherever


def iteration_key(run_id: str, iteration: int) -> str:
    return f"runs/{run_id}/iteration-{iteration}.json"


def read_iteration(store: ObjectStore, run_id: str, iteration: int) -> IterationRecord | None:
    key = iteration_key(run_id, iteration)
    return IterationRecord.model_validate_json(store.get_bytes(key)) if store.exists(key) else None


def rollout_iteration(
    rt: Runtime, tasks: list[Task], lineage: Lineage, checkpoint: str | None, shard_size: int, run: RunShards
) -> tuple[IterationRecord, list[ShardReport]]:
    """The eval round (the learner on held-out tasks), the learner's rounds as its sampler draws them, then
    round 0 (scripted policies) on the tasks those rounds used, or on every task; each round's shards through
    ``run``. Iteration ``train.iterations`` (after the last update) runs the eval round alone. Returns the
    iteration's record (stored last) and the reports of the shards run now."""
    done = read_iteration(rt.store, lineage.run_id, lineage.iteration)
    if done is not None:
        return done, []
    params, it = rt.params, lineage.iteration
    group = params.rollout.group_size
    name = learner_name(params)
    learner = learner_policy(rt, checkpoint) if name in params.rollout.policies else None
    final = it >= params.train.iterations  # the trained policy's held-out evaluation
    reports: list[ShardReport] = []

    def roll(draw: list[Task], names: list[str], round_: Round, size: int, seed: int) -> list[Shard]:
        plan = plan_shards(draw, names, size, seed, shard_size, round_)
        reports.extend(run(pending_shards(rt.store, plan, lineage)))
        return plan

    used: dict[str, Task] = {}  # the tasks whose learner episodes this iteration rolls out, in order
    held_out = [t for t in tasks if t.split == "eval"]
    if learner is not None and held_out and params.rollout.eval_group_size:
        roll(held_out, [name], EVAL, params.rollout.eval_group_size, eval_seed(params))
        used |= {t.task_id: t for t in held_out}
    record = IterationRecord()
    if learner is not None and not final:
        previous = read_iteration(rt.store, lineage.run_id, it - 1) if it else None
        rates = previous.rates if previous else {}
        measured = previous.difficulty if previous else {}
        sampler = BatchSampler(tier_tasks(tasks, measured), params.curate.sampler, params.run.seed * 1000 + it)
        draw, round_, drawn = sampler.begin(rates, policy_key(name, learner.version)), 1, []
        while draw:
            used |= {t.task_id: t for t in draw}
            plan = roll(draw, [name], round_, group, round_seed(params, it, round_))
            seeds = [job.seed for shard in plan for job in shard.jobs]
            batch = load_episodes(rt.store, lineage.run_id, it, name, seeds=seeds)  # read back: a resume replays
            drawn += batch
            draw, round_ = sampler.report(group_rewards(batch, name)), round_ + 1
        k = params.curate.pass_k
        record = IterationRecord(
            kept=[t.task_id for t in sampler.kept],
            rates=update_pass_rates(rates, drawn, name, params.curate.sampler.ema_alpha),
            difficulty=measured | measure_difficulty(drawn, name, learner.version, k=k),
            sampler=sampler.stats.as_dict(),
        )
    scripted = [n for n in params.rollout.policies if n != name]
    canary = tasks if learner is None or params.rollout.reference_tasks == "all" else list(used.values())
    if scripted and canary and not final:
        roll(canary, scripted, 0, params.rollout.reference_group_size, round_seed(params, it, 0))
    rt.store.put_bytes(iteration_key(lineage.run_id, it), record.model_dump_json().encode())
    return record, reports


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


def load_episodes(
    store: ObjectStore, run_id: str, iteration: int, policy: str, seeds: list[int] | None = None
) -> list[EpisodeRecord]:
    """A policy's published episodes of one iteration (those with ``seeds``, if given), with their steps."""
    where = {"run": run_id, "iteration": str(iteration)}
    chosen = {"policy": policy} | ({"seed": [str(s) for s in seeds]} if seeds is not None else {})
    episodes = datasets.read_table(store, "episodes", filters=where | chosen)
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
    return sorted(records, key=lambda e: e.seed)  # plan order: seeds grow with the job's index


def checkpoint_key(run_id: str, learner: str, version: int) -> str:
    """Where the train step keeps the learner after update number ``version``: the repair policy's is this
    object, a language model's the objects under it less ``.pt`` (``train.hf_checkpoint``)."""
    return f"checkpoints/{run_id}/{learner}-v{version}.pt"


def train_record_key(run_id: str, iteration: int) -> str:
    """What the train step of an iteration did (trained or skipped, and why): written last, it marks the step taken."""
    return f"runs/{run_id}/train-{iteration}.json"


def train_iteration(rt: Runtime, run_id: str, iteration: int, checkpoint: str | None) -> TrainResult:
    """One update of the learner from ``checkpoint`` (its latest) over the groups the iteration's sampler kept;
    with ``train.max_staleness`` they may come from an older version, whose log-probabilities they carry.

    Nothing without the learner among the policies. Never on a batch the environment broke (the infrastructure
    gate raises: a person must look), and no step where the learning gate refuses (``observe.learning``: nothing
    to learn, or rewards that look hacked): the learner keeps its weights, version and checkpoint. The checkpoint
    is saved first and the step's record last: the record marks the step as taken, so a rerun of the run
    returns it instead of updating twice.
    """
    name = learner_name(rt.params)
    if name not in rt.params.rollout.policies:
        return TrainResult(checkpoint=checkpoint, stats=None)
    record = read_iteration(rt.store, run_id, iteration)
    if record is None:
        raise ConfigError(f"run {run_id!r} has not finished the rollout of iteration {iteration}: run that first")
    record_key = train_record_key(run_id, iteration)
    if rt.store.exists(record_key):
        return TrainResult.model_validate_json(rt.store.get_bytes(record_key)).model_copy(update={"resumed": True})
    assert_healthy(rt, run_id, iteration, name)
    learner = open_learner(rt.params, rt.store, checkpoint)
    drawn = [e for e in load_episodes(rt.store, run_id, iteration, name) if e.split == "train"]
    before = (
        [e for e in load_episodes(rt.store, run_id, iteration - 1, name) if e.split == "train"] if iteration else []
    )
    health = learning_health(drawn, record.kept, before, rt.params.observe.learning)
    stats: dict = {"sampler": record.sampler, "health": health.as_dict()}
    if not health.trainable:
        reasons = [v.reason for v in health.verdicts if v.status == "refuse"]
        log.error("no training step on iteration %d: %s", iteration, "; ".join(reasons))
        stats |= {"decision": "skipped", "policy_version": f"v{learner.version}", "reasons": reasons}
        result = TrainResult(checkpoint=checkpoint, stats=stats)
    else:
        kept = set(record.kept)
        episodes = [e for e in drawn if e.task_id in kept]
        behaviour = min((int(e.policy_version.removeprefix("v")) for e in episodes), default=None)
        stats = learner.update(episodes, behaviour) | stats | {"decision": "trained"}
        key = checkpoint_key(run_id, name, learner.version)
        learner.save(rt.store, key)
        result = TrainResult(checkpoint=key, stats=stats)
    rt.store.put_bytes(record_key, result.model_dump_json().encode())
    return result
