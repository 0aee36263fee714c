"""Where the flows' work runs, and what Prefect sees of it.

One sandbox runtime per params per process (the flows a flow calls reuse it; a Ray worker opens its own). Rollout
shards are Prefect tasks, run one at a time in a thread here or spread over a Ray cluster through prefect-ray, where
the worker opens the shard's sandboxes on its node; a shard retries only on infrastructure faults (``SandboxError``,
``StoreError``) and holds slots of the global concurrency limit ``sandboxes`` when the Prefect server has one.
Validation verdicts are cached by what decides them. Each run leaves artifacts (funnel, pass rates, errors, data
links) and progress (``trialforge.progress``) for whoever waits. Why and how: docs/orchestration.md,
"Shards, retries, resume" and "Sandboxes across workers".
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import get_client, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.concurrency.sync import concurrency
from prefect.context import TaskRunContext
from prefect.exceptions import ObjectNotFound
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.settings import get_current_settings
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from prefect.tasks import Task as PrefectTask
from prefect.tasks import exponential_backoff

from trialforge.config import Params
from trialforge.errors import ConfigError, SandboxError, StoreError
from trialforge.loop.records import ShardReport
from trialforge.loop.shards import RunShards, Shard, execute_shard, round_label
from trialforge.orchestrate.boundary import ShardRunner
from trialforge.progress import track
from trialforge.rollout.loop import Lineage
from trialforge.runtime import Runtime, open_runtime
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore
from trialforge.tasks.schema import Task

SANDBOX_LIMIT = "sandboxes"

# --- runtimes ----------------------------------------------------------------------------

_held: dict[str, Runtime] = {}
_held_lock = threading.Lock()


@contextlib.contextmanager
def held_runtime(params: Params) -> Iterator[Runtime]:
    """The runtime for ``params`` in this process: the one already held (a calling flow's), else opened here
    and shared until this block ends."""
    key = params.digest()
    with _held_lock:
        shared = _held.get(key)
    if shared is not None:
        yield shared
        return
    with open_runtime(params) as rt:
        with _held_lock:
            _held[key] = rt
        try:
            yield rt
        finally:
            with _held_lock:
                _held.pop(key, None)


def worker_runtime(params: Params) -> Runtime:
    """For a shard: the runtime its flow holds in this process, else one opened once per worker process."""
    key = params.digest()
    with _held_lock:
        if key not in _held:
            stack = contextlib.ExitStack()
            _held[key] = stack.enter_context(open_runtime(params))
            atexit.register(stack.close)
        return _held[key]


# --- runners -----------------------------------------------------------------------------


def default_run_id(name: str) -> str:
    """``NAME-<flow run id>``: a Prefect retry of the same flow run resumes the same run."""
    return f"{name}-{flow_run.get_id()[:8]}"  # type: ignore[index]  # always inside a flow run


def check_runner(runner: ShardRunner, ray_address: str | None) -> None:
    if runner == "default" and ray_address:
        raise ConfigError(f"ray_address={ray_address!r} is only used with runner='ray'")
    if runner == "ray" and not get_current_settings().api.url:
        raise ConfigError(
            "runner='ray' needs a Prefect server that the Ray workers can reach: start one "
            "(`prefect server start`) and set PREFECT_API_URL; ephemeral Prefect cannot serve remote workers"
        )


def connect_ray(address: str | None) -> None:
    """``ray.init`` once per process (a no-op when connected): ``address`` of a cluster, or None for a local one."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False)


@contextlib.contextmanager
def shard_runner(runner: ShardRunner, ray_address: str | None) -> Iterator[TaskRunner]:
    check_runner(runner, ray_address)
    if runner == "ray":
        from prefect_ray import RayTaskRunner

        connect_ray(ray_address)
        with RayTaskRunner(address=ray_address) as ray_runner:
            yield ray_runner
    else:
        with ThreadPoolTaskRunner(max_workers=1) as threads:
            yield threads


def spread_over_nodes(runner: ShardRunner) -> contextlib.AbstractContextManager[object]:
    """While shards are submitted: on Ray, place them ``SPREAD`` over the nodes. A shard's sandboxes are processes
    Ray does not count, so its default placement (fill the driver's node first) would crowd them onto one node
    while the others idle."""
    if runner != "ray":
        return contextlib.nullcontext()
    from prefect_ray.context import remote_options

    return remote_options(scheduling_strategy="SPREAD")


def sandbox_slots(params: Params) -> int:
    """Slots of the ``sandboxes`` limit a shard holds (its ``sandbox.concurrency``); 0 when the server has no
    such limit (ephemeral Prefect, or never created), and shards then run bounded per worker only."""
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(SANDBOX_LIMIT)
        except ObjectNotFound:
            get_run_logger().info("no global concurrency limit %r: sandboxes are bounded per worker", SANDBOX_LIMIT)
            return 0
    wanted = max(params.sandbox.concurrency, 1)
    if limit.active and wanted > limit.limit:
        raise ConfigError(
            f"sandbox.concurrency={wanted} exceeds the {SANDBOX_LIMIT!r} limit of {limit.limit}: no shard could start; "
            f"lower sandbox.concurrency or raise the limit (prefect gcl update {SANDBOX_LIMIT} --limit {wanted})"
        )
    return wanted if limit.active else 0


# --- the shard task ----------------------------------------------------------------------


@dataclass(frozen=True)
class ShardWork:
    """Everything a shard needs, serialisable: it may run in another process or on another machine."""

    params: Params
    lineage: Lineage
    shard: Shard
    tasks: list[Task]  # the ones its jobs name
    checkpoint: str | None  # the learner's weights (None: untrained), loaded by the worker
    slots: int  # of the ``sandboxes`` limit to hold; 0: none


def infrastructure_fault(task: PrefectTask, task_run: TaskRun, state: State) -> bool:
    """Retry only when the infrastructure failed (sandbox engine, object store), never a bug or a bad input."""
    return isinstance(state.result(raise_on_failure=False), SandboxError | StoreError)


@task(
    name="rollout-shard",
    task_run_name="{work.shard.id}",
    retries=3,
    retry_delay_seconds=exponential_backoff(backoff_factor=2),
    retry_jitter_factor=0.5,
    retry_condition_fn=infrastructure_fault,
    cache_policy=NO_CACHE,  # the published part is the record: pending_shards skips it on a rerun
    persist_result=False,
)
def rollout_shard(work: ShardWork) -> ShardReport:
    rt = worker_runtime(work.params)
    slots = concurrency(SANDBOX_LIMIT, occupy=work.slots) if work.slots else contextlib.nullcontext()
    with slots:
        return execute_shard(rt, work.shard, work.tasks, work.checkpoint, work.lineage)


@contextlib.contextmanager
def shard_submitter(
    params: Params,
    lineage: Lineage,
    tasks: list[Task],
    checkpoint: str | None,
    runner: ShardRunner = "default",
    ray_address: str | None = None,
) -> Iterator[RunShards]:
    """While the block runs, a function that runs shards of this iteration on ``runner`` and returns their
    reports in plan order (a round at a time: the sampler needs each round's rewards before the next)."""
    by_id = {t.task_id: t for t in tasks}
    logger = get_run_logger()
    with shard_runner(runner, ray_address) as task_runner:
        slots = sandbox_slots(params)

        def run(shards: list[Shard]) -> list[ShardReport]:
            works = [ShardWork(params, lineage, s, [by_id[i] for i in s.task_ids()], checkpoint, slots) for s in shards]
            with spread_over_nodes(runner):
                futures = [task_runner.submit(rollout_shard, {"work": w}) for w in works]
            reports = []
            with track(round_label(lineage.iteration, shards), len(shards)) as advance:
                for future in as_completed(futures):
                    report = future.result()
                    reports.append(report)
                    advance()
                    logger.info(
                        "shard %s: %d episodes %s on %s", report.shard_id, report.episodes, report.statuses, report.node
                    )
            return sorted(reports, key=lambda r: r.shard_id)

        yield run


# --- caching -----------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """Every source file of the library: any change to it may change a verdict."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def validation_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """``cache_key_fn`` of validation: the tasks, the knobs that decide a verdict, the image and the code."""
    rt: Runtime = parameters["rt"]
    digest = hashlib.sha256()
    for part in (
        rt.params.validate_.model_dump_json(),
        rt.params.sandbox.model_dump_json(),
        rt.image_digest,
        _code_digest(),
        *sorted(t.content_hash() for t in parameters["tasks"]),
    ):
        digest.update(part.encode())
    return f"validate-{digest.hexdigest()}"


# --- artifacts ---------------------------------------------------------------------------


def funnel_artifacts(funnels: list[dict[str, Any]]) -> None:
    """What each task step kept and dropped, and every dropped task with its reason."""
    create_table_artifact(
        [
            {
                "stage": f["stage"],
                "seen": f["seen"],
                "kept": f["kept"],
                "dropped": ", ".join(f"{k}: {v}" for k, v in f["dropped"].items()) or "-",
            }
            for f in funnels
        ],
        key="trialforge-funnel",
        description="Tasks kept and dropped by each step",
    )
    dropped = [{"stage": f["stage"], **d} for f in funnels for d in f["details"]]
    if dropped:
        create_table_artifact(dropped, key="trialforge-dropped", description="Every dropped task, with the reason")


def episode_artifacts(store: ObjectStore, run_id: str, iteration: int | None = None) -> None:
    """Pass rates per policy and iteration, the non-ok episodes by status and cause, and links to the data."""
    where = {"run": run_id} | ({"iteration": str(iteration)} if iteration is not None else {})
    episodes = datasets.read_pandas(
        store, "episodes", filters=where, columns=["iteration", "policy", "split", "status", "cause", "reward"]
    )
    create_table_artifact(pass_rate_table(episodes), key="trialforge-pass-rate", description="Pass rate (ok episodes)")
    create_table_artifact(error_table(episodes), key="trialforge-errors", description="Episodes that did not end ok")
    path = "".join(f"/{k}={v}" for k, v in where.items())
    title = f"# Run `{run_id}`" + (f", iteration {iteration}" if iteration is not None else "")
    links = [f"- [{name}]({store.uri(f'datasets/{name}{path}')}) (Parquet)" for name in ("episodes", "steps")]
    usage = f"Read them with `datasets.read_pandas(open_store({store.url!r}), 'episodes', filters={where!r})`."
    create_markdown_artifact(
        "\n\n".join([title, "\n".join(links), usage]),
        key="trialforge-data",
        description="Where this run's episodes and steps are",
    )


def shard_artifact(reports: list[ShardReport]) -> None:
    """Where each shard of a rollout ran (host, process, Ray node) and how long it worked."""
    rows = [
        {"shard": r.shard_id, "episodes": r.episodes, "work_s": round(r.work_s, 2), **r.node.model_dump()}
        for r in sorted(reports, key=lambda r: r.shard_id)
    ]
    create_table_artifact(rows, key="trialforge-shards", description="Where each shard ran")


def pass_rate_table(episodes: pd.DataFrame) -> list[dict[str, Any]]:
    if episodes.empty:
        return []
    rows = []
    for (policy, split, iteration), group in episodes.groupby(["policy", "split", "iteration"], sort=True):
        ok = group[group["status"] == "ok"]
        rate = round(float(ok["reward"].mean()), 4) if len(ok) else None
        rows.append(
            {"policy": policy, "split": split, "iteration": int(iteration), "episodes": len(group), "ok": len(ok),
             "pass_rate": rate}
        )  # fmt: skip
    return rows


def error_table(episodes: pd.DataFrame) -> list[dict[str, Any]]:
    failed = episodes[episodes["status"] != "ok"] if not episodes.empty else episodes
    if failed.empty:
        return [{"status": "-", "policy": "-", "episodes": 0, "cause": "every episode ended ok"}]
    counts = failed.groupby(["status", "policy", "cause"], sort=True).size().reset_index(name="episodes")
    return counts[["status", "policy", "episodes", "cause"]].to_dict("records")
