"""The LM learner sampled by an inference server the run starts (``train.inference``): ``trialforge serve lm``
over the tiny random GPT-2, speaking vLLM's runtime-LoRA API and SGLang's full-weight update.

What proves the weights reached the server: every log-probability the server recorded for a rollout of
version N equals the one version N's checkpoint gives the same tokens, scored here with plain transformers
and peft, and differs from the untrained model's.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
import torch
from support.chat_server import tool_call
from test_inference_server import forward_logprobs
from test_learner import TASK_IDS, small
from test_policies_llm import with_token_ids

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.errors import ConfigError
from trialforge.inference.managed import serving
from trialforge.loop.iteration import train_in_process
from trialforge.loop.learner import rollout_policy
from trialforge.loop.records import load_episodes
from trialforge.rollout.policies import Decision, TaskView
from trialforge.runtime import open_runtime
from trialforge.sandbox.host import owned
from trialforge.store.objstore import open_store
from trialforge.store.records import EpisodeRecord, StepRecord
from trialforge.train.device import pick_device
from trialforge.train.lm import LMTrainer, OptimConfig
from trialforge.train.settings import LM, LoraParams

RUN = "served-run"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_command(port: int, prefix: str = "") -> str:
    return (f"{prefix}{sys.executable} -m trialforge.cli serve lm {{model}} --served-model-name {{name}} --port {port} "
            "--threads 1 --max-new-tokens 12")  # fmt: skip


def served(tmp_path: Path, model: Path, port: int, **more: object) -> dict:
    return small(
        tmp_path,
        **{
            "train.model": str(model), "rollout.policies": [LM], "rollout.max_new_tokens": 12, "train.lr": 1e-2,
            "train.inference.url": f"http://127.0.0.1:{port}/v1", "train.inference.command": serve_command(port),
            "observe.learning.effective_batch.action": "warn",  # random weights earn only 0s: train on them anyway
            **more,
        },
    )  # fmt: skip


def recorded_and_scored(episodes: list[EpisodeRecord], model) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probabilities the server recorded for every sampled token, and ``model``'s for the same tokens in
    the same context at the same temperature."""
    recorded, scored = [], []
    model.eval()
    for step in (s for e in episodes for s in e.step_rows):
        info = json.loads(step.info)
        scored.append(forward_logprobs(model, info["prompt_ids"], info["token_ids"], info["temperature"]))
        recorded.append(torch.tensor(info["token_logprobs"]))
    return torch.cat(recorded), torch.cat(scored)


def server_pids(state_dir: Path) -> list[int]:
    return [json.loads(p.read_text())["pid"] for p in state_dir.glob("proc-*.json")]


def run_served(params, on_iteration=None) -> tuple[dict[int, list[EpisodeRecord]], list[dict], list]:
    """Episodes by iteration, the updates, and the learner's model at each version (0: the untrained base)."""
    iterations = params.train.iterations
    with open_runtime(params) as rt:
        ingested, _ = pipeline.ingest(rt)
        tasks, _ = pipeline.validate(rt, [t for t in ingested if t.task_id in TASK_IDS])
        loop = train_in_process(rt, tasks, RUN, on_iteration=on_iteration)
        episodes = {it: load_episodes(rt.store, RUN, it, LM) for it in range(iterations)}
        cpu = pick_device("cpu")
        keys = [f"checkpoints/{RUN}/lm-v{v}.pt" for v in range(1, iterations)]
        models = [LMTrainer.load(rt.store, key, params.train.model, device=cpu).model for key in keys]
    return episodes, loop.updates, [None, *models]


@pytest.mark.sandbox
@pytest.mark.services
def test_lora_versions_reach_a_server_the_run_starts_and_restarts_after_a_kill(tiny_lm, tmp_path, state_dir):
    path, base, _ = tiny_lm
    port = free_port()
    params = load_params(None, served(tmp_path, path, port, **{"train.lora.r": 4, "train.inference.api": "vllm"}))
    killed: list[int] = []

    def kill_server(iteration: int, update: object) -> None:
        if iteration == 0:  # after the first update, before the rollout that needs version 1
            killed.extend(server_pids(state_dir))
            os.kill(killed[0], signal.SIGKILL)

    episodes, updates, (_, v1) = run_served(params, kill_server)

    assert [u["decision"] for u in updates] == ["trained", "trained"]
    assert all(u["health"]["entropy"] > 0 for u in updates)  # estimated from the server's log-probabilities
    for iteration, rows in episodes.items():
        assert rows and {e.policy_version for e in rows} == {f"v{iteration}"}
        assert all(e.status == "ok" for e in rows)  # the killed server came back before any episode gave up
    recorded, under_base = recorded_and_scored(episodes[0], base)
    torch.testing.assert_close(recorded, under_base, atol=1e-4, rtol=0)  # version 0: the base model sampled
    recorded, under_v1 = recorded_and_scored(episodes[1], v1)
    torch.testing.assert_close(recorded, under_v1, atol=1e-4, rtol=0)  # version 1: its adapter sampled
    log = (tmp_path / "out" / "inference-server.log").read_text()
    assert len(killed) == 1 and log.count("serving ") == 2  # started, killed, started again
    assert server_pids(state_dir) == [] and not Path(f"/proc/{killed[0]}").exists()
    with pytest.raises(httpx.ConnectError):  # stopped with the run
        httpx.get(f"{params.train.inference.url}/models", timeout=2)


@pytest.mark.sandbox
@pytest.mark.services
def test_rollouts_a_version_behind_the_trainer_each_sample_their_own_version(tiny_lm, tmp_path, state_dir):
    """train.max_staleness 1: a rollout may run while the trainer takes the next step and the server gets the
    next adapter; each episode's tokens were still sampled by the version it is tagged with."""
    path, base, _ = tiny_lm
    more = {"train.lora.r": 4, "train.max_staleness": 1, "train.iterations": 3}
    episodes, updates, models = run_served(load_params(None, served(tmp_path, path, free_port(), **more)))

    assert [u["decision"] for u in updates] == ["trained"] * 3 and all(u["behaviour_lag"] <= 1 for u in updates)
    rows = [e for it in episodes.values() for e in it]
    assert rows and all(e.status == "ok" for e in rows)
    models[0] = base
    for version in {e.policy_version for e in rows}:
        tagged = [e for e in rows if e.policy_version == version]
        recorded, scored = recorded_and_scored(tagged, models[int(version.removeprefix("v"))])
        torch.testing.assert_close(recorded, scored, atol=1e-4, rtol=0)


@pytest.mark.sandbox
@pytest.mark.services
def test_full_weights_replace_the_servers_in_place(tiny_lm, tmp_path, state_dir):
    path, base, _ = tiny_lm
    port = free_port()
    params = load_params(None, served(tmp_path, path, port, **{"train.inference.api": "sglang"}))

    episodes, updates, (_, v1) = run_served(params)

    assert [u["decision"] for u in updates] == ["trained", "trained"]
    recorded, under_v1 = recorded_and_scored(episodes[1], v1)
    torch.testing.assert_close(recorded, under_v1, atol=1e-4, rtol=0)
    recorded, under_base = recorded_and_scored(episodes[0], base)
    torch.testing.assert_close(recorded, under_base, atol=1e-4, rtol=0)
    current = (tmp_path / "out" / "served-weights" / "current").read_text()
    assert current == str(tmp_path / "out" / "served-weights" / RUN / "lm-v1")  # what a restart would serve


def as_episode(decision: Decision, index: int, reward: float) -> EpisodeRecord:
    """A one-step episode of ``decision`` in group ``index // 2``, with ``reward``."""
    info = decision.info
    step = StepRecord("run", 0, f"e{index}", 0, "run", "{}", "obs", False, 0, 0, len(info["prompt_ids"]),
                      len(info["token_ids"]), decision.logprob, json.dumps(info))  # fmt: skip
    return EpisodeRecord(
        "run", 0, f"e{index}", "t", "ts", "easy", LM, "v0", f"g{index // 2}", index, index, "bwrap", "", 0, "ok", "",
        "submitted", reward, "", "{}", "[]", "", 1, 1, 0, 0, 0, 0, 0, 0, 0, "", "", step_rows=[step],
    )  # fmt: skip


@pytest.mark.services
@pytest.mark.parametrize("api", ["vllm", "sglang"])
def test_a_step_on_the_servers_samples_reaches_it_and_changes_what_it_samples(tiny_lm, tmp_path, state_dir, api):
    """Rollout through the server, reward, step, weights to the server, a sample that differs. The rewards are set
    here (random weights fix nothing): in each pair of replies to the same request, one is called right."""
    path, base, _ = tiny_lm
    more = {"train.inference.api": api} | ({"train.lora.r": 4} if api == "vllm" else {})
    params = load_params(None, served(tmp_path, path, free_port(), **more))
    store = open_store(params.run.store)
    lora = LoraParams(r=4, alpha=params.train.lora.alpha) if api == "vllm" else None
    trainer = LMTrainer(str(path), OptimConfig(lr=1e-2), device=pick_device("cpu"), lora=lora)
    view, task = TaskView("t", "fix add"), "add(2, 3) returns -1: fix calc/ops.py"
    with serving(params):
        untrained = rollout_policy(params, store, None)
        before = [untrained.begin(view, seed=s).act(task) for s in (1, 1, 2, 2)]
        stats = trainer.update([as_episode(d, i, float(i % 2)) for i, d in enumerate(before)])
        trainer.save(store, f"checkpoints/{RUN}/lm-v1.pt")
        trained = rollout_policy(params, store, f"checkpoints/{RUN}/lm-v1.pt")
        after = [trained.begin(view, seed=s).act(task) for s in (1, 2)]

    assert stats.grad_norm > 0 and trained.version == "v1"
    rows = [as_episode(d, i, 0.0) for i, d in enumerate(after)]
    recorded, under_trained = recorded_and_scored(rows, trainer.model)
    torch.testing.assert_close(recorded, under_trained, atol=1e-4, rtol=0)  # the server samples the new weights
    _, under_base = recorded_and_scored(rows, base)
    assert (recorded - under_base).abs().max() > 1e-3  # which are not the old ones
    first = [as_episode(d, i, 0.0) for i, d in enumerate(before[::2])]
    assert [json.loads(r.step_rows[0].info)["token_logprobs"] for r in rows] != [
        json.loads(r.step_rows[0].info)["token_logprobs"] for r in first
    ]  # the same requests with the same seeds, answered from another distribution


@pytest.mark.services
def test_an_episode_outlives_a_server_killed_under_it(tiny_lm, tmp_path, state_dir):
    """Mid-episode: the next request fails while the server is down, is retried until it is back, gets 404 for
    the adapter the new server never loaded, loads it and is answered by that version."""
    path = tiny_lm[0]
    more = {"train.lora.r": 4, "train.inference.max_retries": 12}  # waits doubling to 30 s: ample for a restart
    params = load_params(None, served(tmp_path, path, free_port(), **more))
    store = open_store(params.run.store)
    trainer = LMTrainer(str(path), OptimConfig(lr=1e-2), device=pick_device("cpu"), lora=LoraParams(r=4))
    with serving(params):
        untrained = rollout_policy(params, store, None)
        before = [untrained.begin(TaskView("t", "fix"), seed=s).act("add subtracts") for s in (1, 1)]
        trainer.update([as_episode(d, i, float(i)) for i, d in enumerate(before)])
        trainer.save(store, f"checkpoints/{RUN}/lm-v1.pt")
        episode = rollout_policy(params, store, f"checkpoints/{RUN}/lm-v1.pt").begin(TaskView("t", "fix"), seed=3)
        first = episode.act("add subtracts")
        [pid] = server_pids(state_dir)
        os.kill(pid, signal.SIGKILL)
        second = episode.act("the tests fail")

    assert second.info["attempts"] > 1  # it waited the server out
    rows = [as_episode(d, i, 0.0) for i, d in enumerate((first, second))]
    recorded, under_trained = recorded_and_scored(rows, trainer.model)
    torch.testing.assert_close(recorded, under_trained, atol=1e-4, rtol=0)  # both turns sampled by version 1


@pytest.mark.sandbox
@pytest.mark.services
def test_a_run_killed_with_sigkill_leaves_a_server_reap_stops(tiny_lm, tmp_path, state_dir):
    """The server gets SIGKILL with its run (the kernel's parent-death signal); what it spawned is in its process
    group, recorded in the state dir, and ``reap`` stops that group."""
    path, _, _ = tiny_lm
    port = free_port()
    prefix = 'sh -c \'sleep 600 & exec "$0" "$@"\' '  # a child the server leaves behind when it dies
    overrides = served(tmp_path, path, port, **{"train.lora.r": 4})
    overrides["train.inference.command"] = serve_command(port, prefix)
    script = textwrap.dedent(f"""
        import os, signal
        from trialforge.config import load_params
        from trialforge.inference.managed import serving
        with serving(load_params(None, {overrides!r})) as server:
            print(server.pid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    leader = int(run.stdout.split()[0])
    assert exited(leader)  # the kernel's parent-death signal killed the server
    group = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(p) == leader]
    assert group, "the sleep the server spawned outlives it"
    assert server_pids(state_dir) == [leader]
    assert owned.reap_owned(state_dir) == [f"sh {leader}"]
    assert [p for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(p) == leader] == []
    assert server_pids(state_dir) == []


def exited(pid: int, timeout_s: float = 120.0) -> bool:
    """Whether ``pid`` exits within ``timeout_s`` (a bound for a stuck event): woken by its pidfd, no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def _pgid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


@pytest.mark.pure
@pytest.mark.parametrize(
    ("more", "error"),
    [
        ({"train.inference.api": "vllm"}, "only as LoRA adapters"),
        ({"train.inference.api": "sglang", "train.lora.r": 4}, "replaces full weights"),
        ({"train.inference.api": "sglang", "train.max_staleness": 1}, "set train.max_staleness to 0"),
        ({"train.model": ""}, "train.model is empty"),
        ({"train.inference.url": ""}, "url \\(where it will answer\\) is empty"),
        ({"train.inference.api": "sglang", "train.inference.command": "serve {model}"}, "--served-model-name {name}"),
    ],
)
def test_inference_settings_that_cannot_work_are_refused_when_params_load(tiny_lm, tmp_path, more, error):
    overrides = served(tmp_path, tiny_lm[0], 1) | {"train.lr": 1e-6} | more
    with pytest.raises(ConfigError, match=error):
        load_params(None, overrides)


@pytest.mark.services
def test_a_server_that_never_comes_up_is_a_clear_error_with_its_log(tmp_path, tiny_lm):
    overrides = served(tmp_path, tiny_lm[0], free_port(), **{"train.lora.r": 4})
    overrides["train.inference.command"] = f"{sys.executable} -c 'import sys; print(\"no such model\"); sys.exit(3)'"
    with (
        pytest.raises(ConfigError, match=r"exited \(3\) before it answered(.|\n)*no such model"),
        serving(load_params(None, overrides)),
    ):
        pass


@pytest.mark.pure
def test_the_servers_key_is_read_from_the_variable_params_name(tiny_lm, tmp_path, chat_server, monkeypatch):
    monkeypatch.setenv("TF_TEST_INFERENCE_KEY", "sk-inference")
    overrides = served(tmp_path, tiny_lm[0], 1, **{"train.lora.r": 4, "train.inference.command": ""})
    overrides |= {"train.inference.url": chat_server.url, "train.inference.api_key_env": "TF_TEST_INFERENCE_KEY"}
    chat_server.play(with_token_ids(tool_call("submit", logprobs=[-1.0]), [1, 2], [3]))
    decision = rollout_policy(load_params(None, overrides), None, None).begin(TaskView("t", "fix"), 1).act("fix")
    assert chat_server.headers[0]["Authorization"] == "Bearer sk-inference" and decision.info["token_ids"] == [3]
