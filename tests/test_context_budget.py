"""The context budget with a real model (docs/rollouts.md, "The context budget"): the tests' tiny transformers model,
in process and served by `trialforge serve lm`, runs episodes in a bubblewrap sandbox that outgrow its context. They
end ``context_exhausted``, are graded, and a learner step takes them beside solved episodes of the same group; the
server's sampled log-probabilities are the checkpoint's on exactly the tokens each turn kept, and the trainer scores
no token the model did not see.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from support.worlds import bundled_world, make_rollout
from test_inference_server import forward_logprobs

from trialforge.inference.server import open_host, running
from trialforge.rollout.chat import Conversation
from trialforge.rollout.context import ContextParams
from trialforge.rollout.env import Action, opening
from trialforge.rollout.hf_policy import HFPolicy
from trialforge.rollout.openai_policy import OpenAIPolicy
from trialforge.rollout.policies import Decision, TaskView, patch_to_actions
from trialforge.store.records import EpisodeRecord, StepRecord
from trialforge.train.device import pick_device
from trialforge.train.health import LearningGate, learning_health
from trialforge.train.lm import LMTrainer, OptimConfig, episode_sequences

TASK_ID = "textkit-21"
NEW_TOKENS = 8
SYSTEM = 'Reply with one JSON object {"tool": NAME, "args": {...}}.'  # short: the tiny model has 2048 positions


@pytest.fixture(scope="module")
def world(bwrap_backend, tmp_path_factory) -> SimpleNamespace:
    return bundled_world(tmp_path_factory.mktemp("budget"), bwrap_backend, (TASK_ID,), author_only=True)


class Forced:
    """The tiny model made to write the task's fix: each reply is a gold action's JSON, teacher-forced, with the
    model's own log-probabilities for its tokens, so its episodes solve the task and train like sampled ones."""

    name, version = "lm", "v0"

    def __init__(self, policy: HFPolicy, actions: list[Action]) -> None:
        self.policy, self.actions = policy, actions

    def begin(self, view: TaskView, seed: int) -> _ForcedEpisode:
        return _ForcedEpisode(self.policy, [*self.actions, Action(tool="submit")])


class _ForcedEpisode:
    def __init__(self, policy: HFPolicy, actions: list[Action]) -> None:
        self.policy, self.actions = policy, actions
        self.conversation = Conversation(policy.system, native_tools=policy.native_tools)

    def act(self, observation: str) -> Decision:
        policy = self.policy
        self.conversation.observe(observation)
        prompt = policy.encode(self.conversation.messages)
        action = self.actions.pop(0)
        text = json.dumps({"tool": action.tool, "args": action.args})
        ids = [*policy.tokenizer.encode(text, add_special_tokens=False), policy.tokenizer.eos_token_id]
        logprobs = forward_logprobs(policy.model, prompt, ids, 1.0).tolist()
        self.conversation.reply_text(text, call_id=f"call_{len(self.conversation.messages)}")
        info = {"prompt_ids": prompt, "token_ids": ids, "token_logprobs": logprobs, "temperature": 1.0, "entropy": 0.0}
        return Decision(action, sum(logprobs), len(prompt), len(ids), info)


def forced_fix(model: Any, tokenizer: Any, task: Any) -> Forced:
    policy = HFPolicy(model, tokenizer, max_new_tokens=NEW_TOKENS, system=SYSTEM)
    return Forced(policy, patch_to_actions(task.gold_patch))


def first_prompt_tokens(policy: HFPolicy, task: Any) -> int:
    return policy.begin(TaskView(TASK_ID, ""), 1).act(opening(task.problem_statement)).tokens_in


def scored_exactly_what_was_seen(episode: EpisodeRecord) -> None:
    """Every step's prompt and sample is a prefix of one of the trainer's sequences for it, and the sequences
    train on the sampled tokens alone: nothing the model did not see is scored."""
    rows = episode_sequences(episode, 0)
    for step in episode.step_rows:
        info = json.loads(step.info)
        seen = info["prompt_ids"] + info["token_ids"]
        assert any(row.ids[: len(seen)] == seen for row in rows), f"step {step.step} is scored in another context"
    generated = sum(len(json.loads(s.info)["token_ids"]) for s in episode.step_rows)
    assert sum(sum(row.mask) for row in rows) == generated


def learner_step(model: Any, episodes: list[EpisodeRecord]) -> Any:
    trainer = LMTrainer(copy.deepcopy(model), OptimConfig(lr=1e-3), device=pick_device("cpu"))
    return trainer.update(episodes)


@pytest.mark.sandbox
def test_a_local_models_exhausted_episodes_are_graded_and_train_beside_solved_ones(world, bwrap_backend, tiny_lm):
    _, model, tokenizer = tiny_lm
    task = world.tasks[0]
    window = first_prompt_tokens(HFPolicy(model, tokenizer, max_new_tokens=NEW_TOKENS, system=SYSTEM), task) + 600
    keep_all = ContextParams(strategy="keep_all", min_reply_tokens=4)
    sampled = HFPolicy(model, tokenizer, max_new_tokens=NEW_TOKENS, context_tokens=window, context=keep_all,
                       system=SYSTEM, name="lm", version="v0")  # fmt: skip
    forced = forced_fix(model, tokenizer, task)
    rollout = make_rollout(world, bwrap_backend)
    episodes = [rollout.episode(task, sampled, sample=s, seed=s) for s in (0, 1)]
    episodes += [rollout.episode(task, forced, sample=s, seed=s) for s in (2, 3)]

    exhausted, solved = episodes[:2], episodes[2:]
    assert [(e.status, e.termination, e.reward) for e in exhausted] == [("ok", "context_exhausted", 0.0)] * 2
    assert [(e.status, e.termination, e.reward) for e in solved] == [("ok", "submitted", 1.0)] * 2
    for e in exhausted:
        assert len(e.step_rows) >= 2  # several turns before the window ran out
        infos = [json.loads(s.info) for s in e.step_rows]
        assert all(len(i["prompt_ids"]) + i["max_tokens"] <= window for i in infos)  # each turn within the window
        scored_exactly_what_was_seen(e)
    health = learning_health(episodes, [TASK_ID], [], LearningGate())
    assert (health.informative_groups, health.kept_groups, health.trainable) == (1, 1, True)
    stats = learner_step(model, episodes)
    assert (stats.episodes, stats.excluded_not_ok, stats.zero_variance_groups) == (4, 0, 0)
    generated = sum(len(json.loads(s.info)["token_ids"]) for e in episodes for s in e.step_rows)
    assert stats.tokens == generated and stats.grad_norm > 0  # the exhausted episodes' tokens are in the step


@pytest.mark.sandbox
@pytest.mark.services
def test_a_served_models_exhausted_episodes_keep_the_checkpoints_logprobs_on_the_tokens_kept(
    world, bwrap_backend, tiny_lm
):
    """The server lists its context (2048 tokens); the policy learns it there, keeps every turn (keep_all) and ends
    the episode when the next turn cannot fit, whichever of them finds it first."""
    path, model, tokenizer = tiny_lm
    task = world.tasks[0]
    host = open_host(path, "tiny", max_new_tokens=64, device="cpu", threads=None)
    rollout = make_rollout(world, bwrap_backend)
    with running(host, "127.0.0.1", 0) as url:
        served = OpenAIPolicy(url, "tiny", "", max_tokens=64, token_ids=True, name="lm", version="v0",
                              context=ContextParams(strategy="keep_all"), system=SYSTEM)  # fmt: skip
        episodes = [rollout.episode(task, served, sample=s, seed=s) for s in (0, 1)]
        assert served.window() == 2048
    for e in episodes:
        assert (e.status, e.termination, e.reward) == ("ok", "context_exhausted", 0.0)
        infos = [json.loads(s.info) for s in e.step_rows]
        assert len(infos) >= 2 and all(len(i["prompt_ids"]) + len(i["token_ids"]) <= 2048 for i in infos)
        for info in infos:  # the checkpoint's own log-probabilities, on exactly the tokens the server kept
            recorded = torch.tensor(info["token_logprobs"])
            expected = forward_logprobs(model, info["prompt_ids"], info["token_ids"], info["temperature"])
            torch.testing.assert_close(recorded, expected, atol=1e-4, rtol=0)
        scored_exactly_what_was_seen(e)
    forced = forced_fix(model, tokenizer, task)
    solved = [rollout.episode(task, forced, sample=s, seed=s) for s in (2, 3)]
    stats = learner_step(model, [*episodes, *solved])
    assert (stats.episodes, stats.excluded_not_ok, stats.zero_variance_groups, stats.grad_norm > 0) == (4, 0, 0, True)


@pytest.mark.pure
def test_the_trainer_scores_each_turn_in_the_context_it_was_sampled_in_when_turns_are_left_out(tiny_lm):
    """last_turns leaves the oldest turns out: the prompt stops extending the sequence, so the trainer starts a
    new one from it rather than scoring a token in a context the model never saw."""
    _, model, tokenizer = tiny_lm
    last_turn = ContextParams(strategy="last_turns", keep_turns=1)
    policy = HFPolicy(model, tokenizer, max_new_tokens=NEW_TOKENS, context=last_turn, system=SYSTEM, name="lm")
    agent = policy.begin(TaskView("t", ""), seed=4)
    decisions = [agent.act(f"observation {i}") for i in range(4)]
    assert [d.info["dropped_turns"] for d in decisions] == [0, 0, 1, 2]
    steps = [
        StepRecord("run", 0, "e", i, d.action.tool, "{}", "obs", True, 0, 0, d.tokens_in, d.tokens_out, d.logprob,
                   json.dumps(d.info))
        for i, d in enumerate(decisions)
    ]  # fmt: skip
    episode = EpisodeRecord(
        "run", 0, "e", "t", "ts", "easy", "lm", "v0", "t/lm", 0, 4, "bwrap", "", 1, "ok", "", "context_exhausted",
        0.0, "", "{}", "[]", "", 4, 4, 0, 0, 0, 0, 0, 0, 0, "", "", step_rows=steps,
    )  # fmt: skip
    assert len(episode_sequences(episode, 0)) >= 3  # a sequence of its own for each prompt with turns left out
    scored_exactly_what_was_seen(episode)
