"""Orchestration: deployments served and triggered on a real Prefect server, a killed run resumed, Ray shards.

Every flow runs on a three-task subset of the bundled tickets, one validation run, gold and noop policies,
one episode per (task, policy): 6 episodes, in shards of 2.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ParameterTypeError
from prefect.states import Failed
from support.chat_server import tool_call
from support.processes import stop_group, wait_for
from support.ray_fixture import RayCluster, RayNode

from trialforge.errors import ConfigError, SandboxError, StoreError
from trialforge.loop import shards
from trialforge.orchestrate import runners
from trialforge.rollout.env import TOOLS
from trialforge.rollout.loop import Lineage
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore, open_store
from trialforge.store.records import EPISODE_SCHEMA, STEP_SCHEMA
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.taskset import INGESTED, TASKS, read_published

SHARD_SIZE = 2
EPISODES = 6  # 3 tasks x (gold, noop) x 1


def small_overrides(tickets: Path, root: Path) -> dict:
    return {
        "sources.tickets": str(tickets),
        "sources.repos": str(REPO_ROOT / "tasks_src" / "repos"),
        "sources.eval_set": str(REPO_ROOT / "tasks_src" / "eval" / "heldout.jsonl"),
        "validate.runs": 1,
        "rollout.group_size": 1,
        "rollout.policies": ["gold", "noop"],
        "quality.gates": [],  # the quality gate's audits have tests of their own
        "quality.enforce": [],
        "train.iterations": 1,
        "run.store": f"file://{root / 'store'}",
        "run.out_dir": str(root / "out"),
    }


@pytest.fixture(scope="module")
def params_path(tmp_path_factory) -> str:
    """Library defaults: every knob these tests need is an override (the demo's params.yaml is not theirs)."""
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text("{}\n")
    return str(path)


@pytest.fixture(scope="module")
def tickets(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tickets") / "three.jsonl"
    lines = (REPO_ROOT / "tasks_src" / "tickets" / "github_issues.jsonl").read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n")
    return path


@pytest.fixture(scope="module")
def curated(prefect_api, params_path, tickets, tmp_path_factory) -> tuple[dict, str]:
    """The ingest and curate flows run once: their overrides and the curated task-set version.

    It also fills the validation cache that the pipeline subprocesses below share (same PREFECT_HOME).
    """
    ingest, curate = load_flow("ingest"), load_flow("curate")
    overrides = small_overrides(tickets, tmp_path_factory.mktemp("curated"))
    ingested = ingest(params_path=params_path, overrides=overrides)
    result = curate(params_path=params_path, overrides=overrides, ingested=ingested.version)
    assert (ingested.tasks, result.tasks) == (3, 3)
    return overrides, result.version


def load_flow(name: str):
    from prefect.flows import load_flow_from_entrypoint

    return load_flow_from_entrypoint(f"{REPO_ROOT / 'flows' / name}.py:{name}")


@contextlib.contextmanager
def process_group(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        stop_group(process)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "trialforge.orchestrate.cli", *args]


def episode_frame(store: ObjectStore, run_id: str):
    return datasets.read_pandas(store, "episodes", filters={"run": run_id})


# --- on a real Prefect server ------------------------------------------------------------


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_served_deployment_runs_on_trigger_with_its_schedule_limit_and_artifacts(
    prefect_api, prefect_env, state_dir, params_path, tickets, tmp_path
):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment

    env = {**prefect_env, "TRIALFORGE_STATE_DIR": str(state_dir), "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    serve = cli("serve", "--deployment", "ingest-nightly")
    with process_group(serve, env, tmp_path / "serve.log") as served, get_client(sync_client=True) as client:

        def registered() -> bool:
            return any(d.name == "ingest-nightly" for d in client.read_deployments())

        wait_for(registered, "the deployment to be registered", served)
        deployment = client.read_deployment_by_name("ingest/ingest-nightly")
        overrides = small_overrides(tickets, tmp_path)
        parameters = {"params_path": params_path, "overrides": overrides}
        run = run_deployment(deployment.id, parameters=parameters, timeout=300, poll_interval=1)
        artifacts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    log = (tmp_path / "serve.log").read_text(errors="replace")[-3000:]
    assert run.state is not None and run.state.type == StateType.COMPLETED, log
    assert [s.schedule.cron for s in deployment.schedules] == ["0 2 * * *"]
    assert deployment.global_concurrency_limit is not None and deployment.global_concurrency_limit.limit == 1
    assert deployment.concurrency_options.collision_strategy == "CANCEL_NEW"
    funnel = json.loads(next(a for a in artifacts if a.key == "trialforge-funnel").data)
    assert funnel == [{"stage": "ingest", "seen": 3, "kept": 3, "dropped": "-"}]
    version, tasks = read_published(open_store(overrides["run.store"]), INGESTED)
    assert len(tasks) == 3 and len(version) == 16


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_killed_pipeline_resumes_without_rerunning_or_duplicating_shards(
    curated, prefect_env, state_dir, params_path, tickets, tmp_path
):
    run_id = "resume-1"
    overrides = small_overrides(tickets, tmp_path)
    store = open_store(overrides["run.store"])
    argv = cli("flow", "pipeline", "--params", params_path)
    argv += [arg for k, v in overrides.items() for arg in ("-S", f"{k}={json.dumps(v)}")]
    argv += ["-P", f"run_id={run_id}", "-P", f"shard_size={SHARD_SIZE}"]
    env = {**prefect_env, "TRIALFORGE_STATE_DIR": str(state_dir)}
    where = {"run": run_id, "iteration": "0"}

    def published(names=shards.EPISODE_DATASETS) -> dict[str, dict[str, str]]:
        """Per dataset: part key -> written_at."""
        return {
            name: {e["key"]: e["written_at"] for e in datasets.list_parts(store, name, filters=where)} for name in names
        }

    with process_group(argv, env, tmp_path / "first.log") as first:
        wait_for(lambda: len(published()["steps"]) >= 1, "the first shard to be published", first)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    before = published()
    assert 1 <= len(before["steps"]) < EPISODES // SHARD_SIZE, "the kill came too late to test a resume"
    curated_before = published([INGESTED, TASKS])

    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    after = published()
    for name in shards.EPISODE_DATASETS:
        assert len(after[name]) == EPISODES // SHARD_SIZE
        for key in before["steps"]:  # a shard finished before the kill was not run again
            key = key.replace("datasets/steps/", f"datasets/{name}/")
            assert after[name][key] == before[name][key]
    assert published([INGESTED, TASKS]) == curated_before  # it kept the task set it started with
    episodes = episode_frame(store, run_id)
    assert len(episodes) == EPISODES and episodes["episode_id"].is_unique
    jobs = set(zip(episodes["task_id"], episodes["policy"], episodes["sample"], strict=True))
    assert len(jobs) == EPISODES
    steps = datasets.read_pandas(store, "steps", filters={"run": run_id})
    assert set(steps["episode_id"]) == set(episodes["episode_id"])  # no steps left over from the killed shard
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["run_id"] == run_id and metrics["episodes"]["episodes"] == EPISODES


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_rollout_on_a_two_node_ray_cluster_matches_the_default_runner_with_sandboxes_on_each_shards_node(
    curated, params_path, state_dir, ray_cluster
):
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    rollout = load_flow("rollout")
    overrides, version = curated
    store = open_store(overrides["run.store"])
    common = {"params_path": params_path, "overrides": overrides, "task_set": version, "shard_size": SHARD_SIZE}
    on_ray_args = {"runner": "ray", "ray_address": ray_cluster.address}
    state = rollout(run_id="cmp-default", **common, return_state=True)
    default = state.result()
    with get_client(sync_client=True) as client:
        artifacts = flow_run_artifacts(client, state)
        # sandbox.concurrency is 2: one shard at a time may hold the limit's 2 slots. With a CPU per node Ray runs
        # two shards at once, one per node: the limit alone keeps their sandboxes from overlapping
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=runners.SANDBOX_LIMIT, limit=2))
        try:
            with sandbox_owners(state_dir, ray_cluster) as made_by:
                ray_state = rollout(run_id="cmp-ray", **common, **on_ray_args, return_state=True)
        finally:
            client.delete_global_concurrency_limit_by_name(runners.SANDBOX_LIMIT)
        on_ray = ray_state.result()
        ray_artifacts = flow_run_artifacts(client, ray_state)
    assert (default.episodes, on_ray.episodes) == (EPISODES, EPISODES)
    assert len(default.reports) == len(on_ray.reports) == EPISODES // SHARD_SIZE

    def rewards(run_id: str) -> dict:
        frame = episode_frame(store, run_id)
        assert set(frame["status"]) == {"ok"}
        return {(r.task_id, r.policy, r.sample, r.seed): r.reward for r in frame.itertuples()}

    assert rewards("cmp-ray") == rewards("cmp-default")
    pass_rates = {(r["policy"], r["pass_rate"]) for r in json.loads(artifacts["trialforge-pass-rate"].data)}
    assert pass_rates == {("gold", 1.0), ("noop", 0.0)}
    assert json.loads(artifacts["trialforge-errors"].data)[0]["episodes"] == 0
    assert store.uri("datasets/episodes/run=cmp-default/iteration=0") in artifacts["trialforge-data"].data
    spans = sorted((r.started_at, r.finished_at) for r in on_ray.reports)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), "shards overlapped"

    # placement: the shards ran on both nodes, and each shard's sandboxes were made by a process of its node
    assert all(r.node.ray_node_id in ray_cluster.nodes for r in on_ray.reports), [str(r.node) for r in on_ray.reports]
    ran_on = {r.shard_id: ray_cluster.nodes[r.node.ray_node_id] for r in on_ray.reports}
    assert set(ran_on.values()) == set(ray_cluster.nodes.values()), f"the shards did not spread: {ran_on}"
    for report in on_ray.reports:
        node = ran_on[report.shard_id]
        assert report.node.ray_node_ip == node.ip
        nodes_of_its_sandboxes = {where for pid, where in made_by.values() if pid == report.node.pid}
        assert nodes_of_its_sandboxes == {node}, f"{report.shard_id} ran on {node}: {nodes_of_its_sandboxes}"
    assert {pid for pid, _ in made_by.values()} == {r.node.pid for r in on_ray.reports}  # the driver made none
    where = {(row["shard"], row["ray_node_id"]) for row in json.loads(ray_artifacts["trialforge-shards"].data)}
    assert where == {(r.shard_id, r.node.ray_node_id) for r in on_ray.reports}
    assert {r.node.pid for r in default.reports} == {os.getpid()}  # the default runner: threads of the flow's process


def flow_run_artifacts(client, state) -> dict:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    run_filter = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
    return {a.key: a for a in client.read_artifacts(flow_run_filter=run_filter)}


@contextlib.contextmanager
def sandbox_owners(state_dir: Path, cluster: RayCluster) -> Iterator[dict[str, tuple[int, RayNode | None]]]:
    """While the block runs: each sandbox that appears in the session's state dir, by id, with the process that made
    it (its signed record's ``owner_pid``) and that process's node, looked up while the sandbox lives (its owner
    lives at least as long). An episode's sandbox lives for seconds; the state dir is polled every 20 ms."""
    seen: dict[str, tuple[int, RayNode | None]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            for record in (state_dir / "sandboxes").glob("tf-*/record.json"):
                if record.parent.name not in seen:
                    with contextlib.suppress(OSError):  # closed meanwhile
                        owner = json.loads(record.read_text())["owner_pid"]
                        seen[record.parent.name] = (owner, cluster.node_running(owner))

    watcher = threading.Thread(target=watch, name="sandbox-owners", daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_bounded_staleness_overlaps_the_next_rollout_with_the_update_and_never_lags_more(
    curated, params_path, tmp_path
):
    pipeline = load_flow("pipeline")
    overrides, _ = curated
    knobs = {
        "rollout.policies": ["repair"],
        "rollout.group_size": 2,
        "curate.sampler.max_extra_draws": 0,
        "train.iterations": 3,
        "train.max_staleness": 1,
        "observe.learning.effective_batch.action": "warn",  # the schedule is under test: step even on a flat batch
        "run.out_dir": str(tmp_path / "out"),
    }
    metrics = pipeline(params_path=params_path, overrides={**overrides, **knobs}, run_id="stale-1")

    loop = metrics["loop"]
    assert loop["staleness"] == [0, 1, 1]  # batch k>0 was rolled out while update k-1 ran
    assert [(u["iteration"], u["behaviour_lag"]) for u in metrics["updates"]] == [(0, 0), (1, 1), (2, 1)]
    assert 0.0 <= loop["trainer_idle_fraction"] <= 1.0 and 0.0 <= loop["rollout_idle_fraction"] <= 1.0
    episodes = episode_frame(open_store(overrides["run.store"]), "stale-1")
    versions = episodes.groupby("iteration")["policy_version"].agg(set).to_dict()
    assert versions == {0: {"v0"}, 1: {"v0"}, 2: {"v1"}}  # each batch's producer, at most one behind
    report = (tmp_path / "out" / "report.html").read_text()
    training = report[report.index('<section id="training">') :].split("</section>")[0]
    assert "max staleness 1: trainer idle" in training and training.count("<tr>") == 4  # header + 3 updates


@pytest.mark.sandbox
@pytest.mark.services
@pytest.mark.slow
def test_the_canary_runs_beside_the_rewards_an_iteration_uses_or_on_every_task(curated, params_path, tmp_path):
    pipeline = load_flow("pipeline")
    overrides, _ = curated
    knobs = {
        "rollout.policies": ["gold", "noop", "repair"],
        "curate.sampler.groups": 1,  # one of the three tasks drawn: the canary must not cover the other two
        "curate.sampler.max_extra_draws": 0,
        "observe.learning.effective_batch.action": "warn",
        "run.out_dir": str(tmp_path / "out"),
    }
    store = open_store(overrides["run.store"])
    ran: dict[str, dict[str, set[str]]] = {}
    for scope in ("used", "all"):
        pipeline(
            params_path=params_path,
            overrides={**overrides, **knobs, "rollout.reference_tasks": scope},
            run_id=f"canary-{scope}",
        )
        episodes = episode_frame(store, f"canary-{scope}")
        ran[scope] = {
            name: set(rows["task_id"]) for name, rows in episodes[episodes["iteration"] == 0].groupby("policy")
        }
    drawn = ran["used"]["repair"]
    assert len(drawn) == 1
    assert ran["used"]["gold"] == ran["used"]["noop"] == drawn  # beside the learner's rewards, nowhere else
    assert len(ran["all"]["gold"]) == len(ran["all"]["noop"]) == 3  # every task, as a run without a learner


@pytest.mark.sandbox
@pytest.mark.services
def test_a_model_endpoint_named_in_params_rolls_out_beside_the_scripted_policies(
    curated, params_path, chat_server, tmp_path
):
    """``rollout.models`` defines an OpenAI-compatible endpoint; ``rollout.policies`` lists it like ``gold``."""

    def model(request: dict) -> dict:  # first turn: run a command; once it has seen the answer: submit
        if request["messages"][-1]["role"] == "user":
            return tool_call("run", {"command": "echo model-was-here"}, logprobs=[-0.5])
        return tool_call("submit", logprobs=[-0.25])

    chat_server.answer_with(model)
    overrides, _ = curated
    knobs = {
        "rollout.policies": ["gold", "coder"],
        "rollout.models": {"coder": {"kind": "openai", "base_url": chat_server.url, "model": "scripted-model"}},
        "rollout.reference_group_size": 2,
        "run.out_dir": str(tmp_path / "out"),
    }
    load_flow("pipeline")(params_path=params_path, overrides={**overrides, **knobs}, run_id="models")

    store = open_store(overrides["run.store"])
    episodes = episode_frame(store, "models")
    coder = episodes[episodes["policy"] == "coder"]
    assert len(coder) == 6 and set(coder["task_id"]) == set(episodes["task_id"])  # 3 tasks x 2 samples
    assert set(coder["status"]) == {"ok"} and set(coder["reward"]) == {0.0}  # graded: it fixed nothing
    assert set(coder["policy_version"]) == {"scripted-model"} and set(coder["termination"]) == {"submitted"}
    assert set(episodes[episodes["policy"] == "gold"]["reward"]) == {1.0}
    steps = datasets.read_pandas(store, "steps", filters={"run": "models"})
    mine = steps[steps["episode_id"].isin(coder["episode_id"])]
    runs = mine[mine["tool"] == "run"]
    assert len(runs) == 6 and all("model-was-here" in o for o in runs["observation"])  # its commands ran
    assert set(mine["logprob"]) == {-0.5, -0.25}
    assert len(chat_server.requests) == 12
    assert all(r["model"] == "scripted-model" and r["tools"] == TOOLS for r in chat_server.requests)


# --- the pieces, without a server --------------------------------------------------------


def _task(task_id: str) -> Task:
    return Task(
        task_id=task_id,
        source=Source(kind="synthetic", ref=task_id),
        repo="r",
        problem_statement=f"fix {task_id}",
        gold_patch="",
        test_patch="",
    )


@pytest.mark.pure
def test_a_shard_plan_covers_every_job_once_with_stable_part_names():
    tasks = [_task(f"t{i}") for i in range(5)]
    scripted = ["gold", "noop"]
    plan = shards.plan_shards(tasks, scripted, group_size=3, seed=7, shard_size=4, round_=0)
    jobs = [job for shard in plan for job in shard.jobs]
    assert len(jobs) == 5 * 2 * 3 == len({(j.task_id, j.policy, j.sample) for j in jobs})
    assert len({j.seed for j in jobs}) == len(jobs)
    assert [len(s.jobs) for s in plan] == [4] * 7 + [2]
    assert [s.id for s in shards.plan_shards(tasks, scripted, 3, 7, 4, 0)] == [s.id for s in plan]
    assert {shards.round_of(s.id) for s in plan} == {0}
    assert shards.plan_shards(tasks, scripted, 3, 7, 5, 0)[0].id != plan[0].id  # another plan, other names


@pytest.mark.pure
def test_a_shard_is_done_once_both_parts_are_published_and_a_foreign_plan_is_refused(tmp_path):
    store = open_store(f"file://{tmp_path}")
    tasks = [_task("t0"), _task("t1")]
    plan = shards.plan_shards(tasks, ["noop"], 1, 0, 1, round_=0)
    lineage = Lineage("r1", 0, "0" * 16, "p", "c")
    partition = {"run": "r1", "iteration": "0"}
    assert shards.pending_shards(store, plan, lineage) == plan
    datasets.write_rows(store, "episodes", [], EPISODE_SCHEMA, partition=partition, part=plan[0].id)
    assert shards.pending_shards(store, plan, lineage) == plan  # its steps are not published yet
    datasets.write_rows(store, "steps", [], STEP_SCHEMA, partition=partition, part=plan[0].id)
    assert shards.pending_shards(store, plan, lineage) == plan[1:]
    datasets.write_rows(store, "episodes", [], EPISODE_SCHEMA, partition=partition, part="r1-00000-0123abcd")
    assert shards.pending_shards(store, plan, lineage) == plan[1:]  # another round's part is not in the way
    datasets.write_rows(store, "episodes", [], EPISODE_SCHEMA, partition=partition, part="batch-0")
    with pytest.raises(ConfigError, match="another plan"):
        shards.pending_shards(store, plan, lineage)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (SandboxError("engine gone", cause="engine"), True),
        (StoreError("bucket unreachable"), True),
        (ConfigError("bad params"), False),
        (KeyError("bug"), False),
    ],
)
def test_only_infrastructure_faults_are_retried(error, retried):
    assert runners.infrastructure_fault(runners.rollout_shard, None, Failed(data=error)) is retried


@pytest.mark.pure
@pytest.mark.parametrize(
    ("bad", "named"),
    [({"run_id": "../escape"}, "run_id"), ({"runner": "spark"}, "runner"), ({"shard_size": 0}, "shard_size")],
)
def test_flow_parameters_are_validated_with_clear_errors(bad, named):
    with pytest.raises(ParameterTypeError, match=named):
        load_flow("rollout").validate_parameters({"run_id": "ok-1", **bad})


@pytest.mark.pure
def test_ray_runner_needs_a_prefect_server_and_ray_address_needs_the_ray_runner():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(ConfigError, match="PREFECT_API_URL"):
        runners.check_runner("ray", None)
    with pytest.raises(ConfigError, match="only used with runner='ray'"):
        runners.check_runner("default", "ray://head:10001")
