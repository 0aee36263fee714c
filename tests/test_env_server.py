"""The environment server: episodes driven over HTTP by a client, as external trainers drive them.

Everything is real: the server runs as `trialforge serve env` runs it (uvicorn on 127.0.0.1, the runtime's
bubblewrap sandboxes, the grader, the object store), and clients speak HTTP to it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import anyio
import httpx
import pytest
from support.env_server_fixture import TOKEN_ENV, live, serve_bundled
from support.processes import wait_for
from support.worlds import bundled_world

from trialforge.envserver.client import AsyncEnvClient, EnvClient, EnvServerError
from trialforge.observe.report import render_report
from trialforge.pipeline import make_rollout
from trialforge.rollout.loop import Lineage
from trialforge.rollout.policies import ReplayPolicy, patch_to_actions
from trialforge.store import datasets
from trialforge.store.objstore import open_store
from trialforge.tasks.taskset import write_tasks

pytestmark = [pytest.mark.sandbox, pytest.mark.services]

IDLE_S = 8.0  # the module server's idle timeout: long enough for a loaded machine, short enough to wait out
REPO_ROOT = Path(__file__).resolve().parents[1]
TOKEN = "t" * 32


@pytest.fixture(scope="module")
def server(bwrap_backend, tmp_path_factory):
    root = tmp_path_factory.mktemp("envserver")
    with serve_bundled(root, bwrap_backend, max_live=2, idle_timeout_s=IDLE_S, max_body_kb=64) as srv:
        srv.client = EnvClient(srv.url, srv.token, max_wait_s=120)
        yield srv
        srv.client.shutdown()


def sandboxes(state: Path) -> set[str]:
    return {p.name for p in (state / "sandboxes").glob("tf-*")}


def test_an_episode_over_http_scores_as_the_agent_loop_scores_the_same_actions(server) -> None:
    task = server.tasks[0]
    actions = patch_to_actions(task.gold_patch)
    client = server.client
    reset = client.reset(task.task_id, policy="trainer-x", policy_version="step-7")
    assert reset.task_id == task.task_id and task.problem_statement in reset.prompt
    assert {t["function"]["name"] for t in reset.tools} >= {"run", "view", "replace", "create", "submit"}
    for turn, action in enumerate(actions):
        out = client.step(reset.episode_id, action.tool, action.args, turn=turn)
        assert not out.done and out.turn == turn + 1 and "error" not in out.observation[:6]
    done = client.step(reset.episode_id, "submit", {}, turn=len(actions))
    assert done.done and done.observation == "submitted"
    over_http = client.close(reset.episode_id)
    assert (over_http.status, over_http.reward, over_http.termination) == ("ok", 1.0, "submitted")
    assert client.close(reset.episode_id) == over_http  # a retried close: the same verdict

    # The same actions through the agent loop `trialforge run` uses: the same verdict.
    lineage = Lineage("direct", 0, "bundled", "p", "c")
    direct = make_rollout(server.rt, lineage).episode(task, ReplayPolicy({task.task_id: actions}), 0, 0)
    assert (direct.status, direct.reward, json.loads(direct.integrity_flags)) == ("ok", 1.0, over_http.flags)

    # Closing at once grades the untouched repository: 0, recorded as a submit made by close.
    idle = client.reset(task.task_id)
    closed = client.close(idle.episode_id)
    assert (closed.status, closed.reward, closed.steps) == ("ok", 0.0, 1)

    # Both are in the store, with the lineage the client and the server gave.
    wait_for(lambda: _stored(server, reset.episode_id) and _stored(server, idle.episode_id), "the episodes' rows")
    row = _stored(server, reset.episode_id)[0]
    assert (row["policy"], row["policy_version"], row["task_set_version"]) == ("trainer-x", "step-7", "bundled")
    assert row["reward"] == 1.0 and row["run_id"] == server.run_id and row["image_digest"]
    steps = datasets.read_table(server.store, "steps", filters={"run": server.run_id}).to_pylist()
    mine = [s for s in steps if s["episode_id"] == reset.episode_id]
    assert [s["tool"] for s in sorted(mine, key=lambda s: s["step"])] == [a.tool for a in actions] + ["submit"]
    by_close = [s for s in steps if s["episode_id"] == idle.episode_id]
    assert [json.loads(s["info"]) for s in by_close] == [{"via": "close"}]
    # The run's report reads them like any run's episodes.
    page = render_report(server.store, server.run_id, server.root / "report.html").read_text()
    assert "trainer-x" in page and reset.episode_id in page


def _stored(server, episode_id: str) -> list[dict]:
    if not datasets.list_parts(server.store, "episodes", filters={"run": server.run_id}):
        return []
    table = datasets.read_table(server.store, "episodes", filters={"run": server.run_id})
    return [r for r in table.to_pylist() if r["episode_id"] == episode_id]


def test_requests_without_the_token_or_out_of_bounds_are_refused_with_a_reason(server) -> None:
    url, task_id = server.url, server.tasks[0].task_id
    assert httpx.get(f"{url}/health").status_code == 200  # for load balancers: counts only, no token
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {server.token}"}):
        answer = httpx.post(f"{url}/reset", json={"task_id": task_id}, headers=headers)
        assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == "Bearer"
    auth = {"Authorization": f"Bearer {server.token}"}
    big = httpx.post(f"{url}/step", content=b"x" * (65 * 1024), headers=auth | {"Content-Type": "application/json"})
    assert big.status_code == 413 and "over 65536 bytes" in big.json()["detail"]
    chunked = httpx.post(f"{url}/step", content=iter([b"{}"]), headers=auth)  # a stream declares no length
    assert chunked.status_code == 411
    extra = httpx.post(f"{url}/reset", json={"task_id": task_id, "shell": "x"}, headers=auth)
    assert extra.status_code == 422
    refused = {
        ("unknown-task", "train"): (404, "no task 'unknown-task'"),
        (task_id, "eval"): (403, "split 'eval' is not served"),
    }
    for (task, split), (status, says) in refused.items():
        with pytest.raises(EnvServerError) as err:
            server.client.reset(task, split=split)
        assert err.value.status == status and says in err.value.detail
    with pytest.raises(EnvServerError) as err:
        server.client.step("ep-nothing", "view", {"path": "x"})
    assert err.value.status == 404
    # A model's malformed call is an observation it can correct, and the episode goes on.
    reset = server.client.reset(task_id)
    for tool, args, says in (
        ("view", {"path": 5}, "'path' must be of type string, not int"),
        ("replace", {"path": "x", "old": "a"}, "missing argument 'new'"),
        ("run", {"command": "true", "sudo": True}, "unknown argument 'sudo'"),
        ("rm_rf", {}, "unknown tool 'rm_rf'"),
    ):
        out = server.client.step(reset.episode_id, tool, args)
        assert not out.done and out.observation.startswith("error: ") and says in out.observation
    assert server.client.close(reset.episode_id).status == "ok"


def test_a_full_server_answers_429_with_retry_after_and_the_client_waits_its_turn(server) -> None:
    task_id = server.tasks[0].task_id
    first, second = server.client.reset(task_id), server.client.reset(task_id)
    auth = {"Authorization": f"Bearer {server.token}"}
    full = httpx.post(f"{server.url}/reset", json={"task_id": task_id}, headers=auth)
    assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(server.client.reset(task_id)))
    waiter.start()
    server.client.close(first.episode_id)  # frees a place: the waiting client gets it
    waiter.join(timeout=120)
    assert got and got[0].episode_id not in (first.episode_id, second.episode_id)
    for episode in (second.episode_id, got[0].episode_id):
        assert server.client.close(episode).status == "ok"


def test_a_retried_step_gets_its_first_answer_and_a_step_out_of_order_is_refused(server) -> None:
    client = server.client
    reset = client.reset(server.tasks[0].task_id)
    first = client.step(reset.episode_id, "run", {"command": "echo once >> /tmp/count; wc -l < /tmp/count"}, turn=0)
    again = client.step(reset.episode_id, "run", {"command": "echo once >> /tmp/count; wc -l < /tmp/count"}, turn=0)
    assert again == first and first.observation.strip().endswith("1")  # answered again, not run again
    with pytest.raises(EnvServerError) as err:
        client.step(reset.episode_id, "view", {"path": "x"}, turn=0)  # turn 0 was another action
    assert err.value.status == 409
    with pytest.raises(EnvServerError) as err:
        client.step(reset.episode_id, "view", {"path": "x"}, turn=5)
    assert err.value.status == 409 and "at turn 1" in err.value.detail
    assert client.close(reset.episode_id).steps == 2


def test_a_client_that_goes_silent_loses_its_episode_and_its_sandbox(server, state_dir) -> None:
    before = sandboxes(state_dir)
    reset = server.client.reset(server.tasks[0].task_id)
    server.client.step(reset.episode_id, "run", {"command": "true"})
    wait_for(lambda: live(server) == 0, "the silent client's episode to end")
    with pytest.raises(EnvServerError) as err:
        server.client.step(reset.episode_id, "run", {"command": "true"})
    assert err.value.status == 409 and "has ended" in err.value.detail
    verdict = server.client.close(reset.episode_id)
    assert (verdict.status, verdict.reward) == ("policy_error", None)  # unknown, never 0
    assert f"no action for {IDLE_S:g} s" in verdict.cause
    assert sandboxes(state_dir) <= before


def test_clients_killed_mid_episode_leak_no_sandbox(server, state_dir) -> None:
    """Client processes killed with SIGKILL while their command runs: their episodes end, sandboxes go."""
    before = sandboxes(state_dir)
    script = (
        "import sys; from trialforge.envserver.client import EnvClient\n"
        "c = EnvClient(sys.argv[1], sys.argv[2], max_wait_s=120)\n"
        "r = c.reset(sys.argv[3]); print(r.episode_id, flush=True)\n"
        "c.step(r.episode_id, 'run', {'command': 'sleep 30'})\n"
    )
    args = [sys.executable, "-c", script, server.url, server.token, server.tasks[0].task_id]
    clients = [subprocess.Popen(args, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    episodes = [c.stdout.readline().strip() for c in clients]
    assert all(e.startswith("ep-") for e in episodes)
    for c in clients:
        c.kill()
        c.wait()
    wait_for(lambda: live(server) == 0, "the killed clients' episodes to end")
    for episode in episodes:
        assert server.client.close(episode).status == "policy_error"
    assert sandboxes(state_dir) <= before


def test_the_episode_deadline_holds_for_a_client_too(bwrap_backend, tmp_path, state_dir) -> None:
    """`sandbox.episode_timeout_s` ends a served episode as it ends any other: status timeout, reward unknown."""
    before = sandboxes(state_dir)
    with serve_bundled(tmp_path, bwrap_backend, params={"sandbox.episode_timeout_s": 10}) as srv:
        client = EnvClient(srv.url, srv.token)
        reset = client.reset(srv.tasks[0].task_id)
        late = client.step(reset.episode_id, "run", {"command": "sleep 11; echo woke"})
        assert late.done and "woke" in late.observation
        verdict = client.close(reset.episode_id)
        assert (verdict.status, verdict.reward, verdict.termination) == ("timeout", None, "timeout")
    assert sandboxes(state_dir) <= before


def test_a_reset_whose_sandbox_cannot_start_is_recorded_and_tried_again(bwrap_backend, tmp_path) -> None:
    """A task setup that fails makes every episode env_error before its first observation: the server answers 503
    with Retry-After, records the episode, and the client, blocking or asyncio, resets again until its patience
    runs out; then it raises the server's answer."""
    answers: dict[str, list[int]] = {"blocking": [], "asyncio": []}

    async def reset_async(url: str, token: str, task_id: str) -> None:
        client = AsyncEnvClient(url, token, max_wait_s=3)

        async def seen(response: httpx.Response) -> None:
            answers["asyncio"].append(response.status_code)

        client.http.event_hooks["response"] = [seen]
        try:
            await client.reset(task_id)
        finally:
            await client.shutdown()

    with serve_bundled(tmp_path, bwrap_backend, params={"rollout.setup": "exit 3"}) as srv:
        client = EnvClient(srv.url, srv.token, max_wait_s=3)
        client.http.event_hooks["response"] = [lambda response: answers["blocking"].append(response.status_code)]
        with pytest.raises(EnvServerError) as err:
            client.reset(srv.tasks[0].task_id)
        assert err.value.status == 503 and "could not start (env_error" in err.value.detail
        with pytest.raises(EnvServerError) as err:
            anyio.run(reset_async, srv.url, srv.token, srv.tasks[0].task_id)
        assert err.value.status == 503 and "could not start (env_error" in err.value.detail
    assert all(len(statuses) >= 2 and set(statuses) == {503} for statuses in answers.values()), answers
    rows = datasets.read_table(srv.store, "episodes", filters={"run": srv.run_id}).to_pylist()
    assert len(rows) == sum(map(len, answers.values()))  # each reset tried is an episode recorded
    assert {r["status"] for r in rows} == {"env_error"} and all(r["reward"] is None for r in rows)


@pytest.fixture(scope="module")
def taskset(bwrap_backend, tmp_path_factory) -> SimpleNamespace:
    """Bundled tasks, validated, in a store and a task set file: what `serve env` and the flow are pointed at."""
    root = tmp_path_factory.mktemp("envserver-doors")
    world = bundled_world(root, bwrap_backend, ("ledgerlite-3",))
    write_tasks(root / "tasks.parquet", world.tasks)
    settings = [f"run.store=file://{root / 'store'}", f"env_server.tasks={root / 'tasks.parquet'}"]
    return SimpleNamespace(tasks=world.tasks, store=open_store(f"file://{root / 'store'}"), settings=settings)


def door(*args: str, port: int = 0) -> list[str]:
    settings = [f"env_server.port={port}", f"env_server.token_env={TOKEN_ENV}"]
    return [sys.executable, "-m", "trialforge.cli", *args, *(f"--set={s}" for s in settings)]


def test_serve_env_from_the_cli_runs_episodes_and_stops_cleanly_on_sigterm(taskset, state_dir) -> None:
    """`trialforge serve env` over a task set file: an episode from a client, then SIGTERM ends the episode
    still open (policy_error), writes both and leaves no sandbox."""
    cmd = door("serve", "env", *(f"--set={s}" for s in taskset.settings))
    before = sandboxes(state_dir)
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=os.environ | {TOKEN_ENV: TOKEN}, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"serving {len(taskset.tasks)} tasks"), line
        url, run_id = line.split(" at ")[1].split(" ")[0], line.rsplit("; ", 1)[1].strip()
        client = EnvClient(url, TOKEN)
        done = client.reset(taskset.tasks[0].task_id)
        client.close(done.episode_id)
        open_one = client.reset(taskset.tasks[0].task_id)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    rows = datasets.read_table(taskset.store, "episodes", filters={"run": run_id}).to_pylist()
    assert {r["episode_id"]: r["status"] for r in rows} == {done.episode_id: "ok", open_one.episode_id: "policy_error"}
    assert sandboxes(state_dir) <= before


def test_the_env_server_flow_serves_for_its_duration_then_writes_its_episodes(taskset, state_dir, tmp_path) -> None:
    """The Prefect flow (the deployment env-server runs it): serving from its start, stopping on its own."""
    with socket.socket() as probe:  # a free loopback port, so the client knows where to go
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = door("flow", "env_server", "-P", "duration_s=30", *(f"--set={s}" for s in taskset.settings), port=port)
    # its output to a file, not a pipe read only at the end: a flow that logs more than a pipe holds (a loaded
    # machine's late-run warnings) would block on it before it listens
    with (tmp_path / "out.txt").open("w") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=os.environ | {TOKEN_ENV: TOKEN}, stdout=sink, text=True)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: _answers(url), "the flow's server to listen", proc)
            client = EnvClient(url, TOKEN)
            reset = client.reset(taskset.tasks[0].task_id)
            assert client.close(reset.episode_id).reward == 0.0
            proc.wait(timeout=300)
        finally:
            proc.kill()
    out = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0
    result = json.loads(out[out.index("{") :])
    assert result["tasks"] == len(taskset.tasks) and result["url"] == url
    rows = datasets.read_table(taskset.store, "episodes", filters={"run": result["run_id"]}).to_pylist()
    assert [r["episode_id"] for r in rows] == [reset.episode_id]


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health").status_code == 200
    except httpx.TransportError:
        return False
