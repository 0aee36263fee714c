"""Trainer libraries driving episodes on the environment server through trialforge's adapters, from their side.

The server is real (bubblewrap sandboxes, the grader); the policy is scripted: the task's gold actions then
``submit`` (reward 1.0), or ``submit`` alone (reward 0.0). Each library runs its own entry point: verifiers its eval
runner against a scripted OpenAI-compatible endpoint, TRL one GRPOTrainer step whose generation plays the script.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections import deque
from typing import Any

import pytest
from support.chat_server import text_reply, tool_call
from support.env_server_fixture import TOKEN_ENV, live, serve_bundled
from support.processes import wait_for

from trialforge.envserver.client import EnvClient
from trialforge.rollout.env import Action
from trialforge.rollout.policies import patch_to_actions

IDLE_S = 10.0  # the server's idle timeout: an episode left alone this long ends without a reward
SUBMIT_ONLY = [Action(tool="submit")]


@pytest.fixture(scope="module")
def server(bwrap_backend, tmp_path_factory):
    with serve_bundled(tmp_path_factory.mktemp("adapters"), bwrap_backend, max_live=4, idle_timeout_s=IDLE_S) as srv:
        srv.client = EnvClient(srv.url, srv.token)
        srv.gold = [*patch_to_actions(srv.tasks[0].gold_patch), Action(tool="submit")]
        yield srv
        srv.client.shutdown()


# --- verifiers -----------------------------------------------------------------------------------------------------
class ScriptedModel:
    """Answers chat requests with one script per conversation: a conversation with no assistant turn yet takes the
    next script; later requests find theirs by the id of the conversation's first tool call (episodes interleave).
    Answers carry ``created``, as OpenAI's do (verifiers validates it)."""

    def __init__(self, *scripts: list[Action]) -> None:
        self.waiting = deque(scripts)
        self.by_first_call: dict[str, list[Action]] = {}

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        turns = [m for m in body["messages"] if m["role"] == "assistant"]
        script = self.by_first_call[turns[0]["tool_calls"][0]["id"]] if turns else self.waiting.popleft()
        if len(turns) == len(script):
            return {**text_reply("done"), "created": 0}
        action = script[len(turns)]
        reply = tool_call(action.tool, action.args)
        if not turns:
            self.by_first_call[reply["choices"][0]["message"]["tool_calls"][0]["id"]] = script
        return {**reply, "created": 0}


def vf_eval(server, chat_server, output_dir, **fields: Any) -> list:
    """`vf-eval trialforge-env` over the server's task, the model at ``chat_server``: verifiers' eval runner."""
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    from trialforge.envserver.adapters.verifiers import PLUGIN_ID

    taskset = {"id": PLUGIN_ID, "url": server.url, "token_var": TOKEN_ENV, "task_ids": [server.tasks[0].task_id]}
    config = EvalConfig(
        env={"taskset": taskset},
        model="scripted",
        client={"type": "eval", "base_url": chat_server.url, "api_key_var": "SCRIPTED_MODEL_KEY"},
        rich=None,
        push=False,
        output_dir=output_dir,
        **fields,
    )
    try:
        return asyncio.run(run_eval(config))
    finally:
        os.environ.pop("VF_RUN_ID", None)  # the runner's id for the processes a run spawns; not the next test's


@pytest.mark.sandbox
@pytest.mark.services
def test_verifiers_eval_runner_scores_a_group_with_the_servers_verdicts(server, chat_server, tmp_path) -> None:
    chat_server.answer_with(ScriptedModel(server.gold, SUBMIT_ONLY))
    # One group: two episodes of the same task, in flight together.
    episodes = vf_eval(server, chat_server, tmp_path, num_rollouts=2, max_concurrent=2)

    assert len(episodes) == 2 and all(e.ok for e in episodes), [e.errors for e in episodes]
    rewards = {}
    for episode in episodes:
        (trace,) = episode.traces
        verdict = trace.info["trialforge"]
        assert verdict["task_id"] == server.tasks[0].task_id and verdict["status"] == "ok"
        assert trace.rewards["trialforge"].score == verdict["reward"]
        assert server.client.close(verdict["episode_id"]).reward == verdict["reward"]  # the server's own answer
        assert trace.num_turns == verdict["steps"]  # every model turn went through verifiers' interception
        rewards[verdict["steps"]] = verdict["reward"]
    assert rewards == {len(server.gold): 1.0, len(SUBMIT_ONLY): 0.0}
    assert live(server) == 0


@pytest.mark.sandbox
@pytest.mark.services
def test_verifiers_episode_without_a_verdict_fails_instead_of_scoring_zero(server, chat_server, tmp_path) -> None:
    def idle_model(body: dict[str, Any]) -> dict[str, Any]:  # thinks until the server gives up on the episode
        wait_for(lambda: live(server) == 0, "the server to end the idle episode")
        return {**text_reply("done"), "created": 0}

    chat_server.answer_with(idle_model)
    (episode,) = vf_eval(server, chat_server, tmp_path)

    (trace,) = episode.traces
    assert not episode.ok and "VerifierError" in episode.errors[-1].message
    assert trace.info["trialforge"]["status"] == "policy_error" and "trialforge" not in trace.rewards


# --- TRL -----------------------------------------------------------------------------------------------------------
@pytest.fixture
def qwen_style_lm(tiny_lm):
    """tiny_lm's byte tokenizer with Qwen 2.5's chat template (one TRL parses tool calls from), and a tiny Qwen2
    model with room for a whole episode (tiny_lm's GPT-2 stops at 2048 positions)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm[0])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token, tokenizer.pad_token, tokenizer.padding_side = "<|im_end|>", "<|endoftext|>", "left"
    tokenizer.chat_template = qwen2_5_chat_template
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32768,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config), tokenizer


def scripted_trainer(scripts: list[list[Action]]):
    """A GRPOTrainer class whose generation plays ``scripts`` in Qwen's tool-call format: rollout i of the first
    turn takes scripts[i]; a later turn continues the script its conversation's first call began (the scripts start
    with different tools). All else (tool-call parsing, the tool loop, rewards, loss, optimizer step) is TRL's."""
    from trl import GRPOTrainer

    class ScriptedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
            replies = []
            for i, ids in enumerate(prompt_ids):
                calls = re.findall(r'<tool_call>\n\{"name": "(\w+)"', self._tokenizer.decode(ids))
                script = next(s for s in scripts if s[0].tool == calls[0]) if calls else scripts[i]
                if len(calls) == len(script):
                    replies.append("done<|im_end|>")
                    continue
                call = json.dumps({"name": script[len(calls)].tool, "arguments": script[len(calls)].args})
                replies.append(f"<tool_call>\n{call}\n</tool_call><|im_end|>")
            return [self._tokenizer.encode(r, add_special_tokens=False) for r in replies], None

    return ScriptedGRPOTrainer


@pytest.mark.sandbox
@pytest.mark.services
def test_trl_grpo_step_is_rewarded_by_the_servers_verdicts(server, qwen_style_lm, tmp_path, monkeypatch) -> None:
    import torch
    from trl import GRPOConfig

    from trialforge.envserver.adapters.trl import ToolEnvFactory, task_dataset

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tokenizer = qwen_style_lm
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,  # one group: both rollouts play the dataset's one task
        max_steps=1,
        max_completion_length=32768,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
    )
    factory = ToolEnvFactory(server.url, server.token, policy="trl-test")
    trainer = scripted_trainer([server.gold, SUBMIT_ONLY])(
        model=model,
        args=args,
        train_dataset=task_dataset([server.tasks[0].task_id]),
        processing_class=tokenizer,
        environment_factory=factory,
    )
    before = [p.detach().clone() for p in model.parameters()]
    try:
        trainer.train()
    finally:
        factory.close()

    verdicts = [env.verdict for env in trainer.environments]  # the last batch's
    assert {v.steps: v.reward for v in verdicts} == {len(server.gold): 1.0, len(SUBMIT_ONLY): 0.0}
    for verdict in verdicts:
        assert verdict.status == "ok" and verdict.task_id == server.tasks[0].task_id
        assert server.client.close(verdict.episode_id) == verdict  # the server's own answer
    logged = trainer.state.log_history[0]
    assert logged["rewards/TrialforgeToolEnv/mean"] == logged["reward"] == 0.5
    assert logged["tools/failure_frequency"] == 0.0
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))  # a step
    assert live(server) == 0


@pytest.mark.pure
def test_trl_tools_are_the_servers_tools() -> None:
    """The schemas GRPOTrainer renders from the environment's methods name the server's tools and arguments."""
    from transformers.utils import get_json_schema

    from trialforge.envserver.adapters.trl import TOOLS, TrialforgeToolEnv
    from trialforge.rollout.env import TOOLS as SERVER_TOOLS

    client = EnvClient("http://127.0.0.1:9", "unused")  # never connects
    env = TrialforgeToolEnv(client)

    def shape(schema: dict[str, Any]) -> tuple[str, dict[str, str], list[str]]:
        params = schema["function"]["parameters"]
        types = {name: p["type"] for name, p in params["properties"].items()}
        return schema["function"]["name"], types, sorted(params.get("required", []))

    assert sorted(shape(get_json_schema(getattr(env, t))) for t in TOOLS) == sorted(map(shape, SERVER_TOOLS))
    client.shutdown()


@pytest.mark.sandbox
@pytest.mark.services
def test_trl_reward_of_an_episode_without_a_verdict_is_none_not_zero(server, caplog) -> None:
    from trialforge.envserver.adapters.trl import ToolEnvFactory

    factory = ToolEnvFactory(server.url, server.token)
    env = factory()
    try:
        env.reset(task_id=server.tasks[0].task_id, prompt=[{"role": "user", "content": ""}])
        wait_for(lambda: live(server) == 0, "the server to end the idle episode")
        with caplog.at_level(logging.WARNING, logger="trialforge.envserver.adapters.trl"):
            assert env.get_reward() is None  # GRPOTrainer masks it (NaN); a 0 would teach the policy
    finally:
        factory.close()
    assert env.verdict is not None and env.verdict.status == "policy_error"
    assert env.verdict.episode_id in caplog.text and "policy_error" in caplog.text
