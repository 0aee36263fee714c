"""Who answers for an episode (docs/learning.md, "Who answers for an episode"): each row of the table, produced for
real in a bubblewrap sandbox (a scripted policy, the tiny transformers model, a real HTTP endpoint playing faults)
and classified as the table says: a model ending is graded and carries a reward, an infrastructure one does not.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from support.chat_server import Fault
from support.worlds import LINEAGE, bundled_world, kill_bwrap, make_rollout

from trialforge.observe.attribution import endings
from trialforge.observe.metrics import iteration_metrics
from trialforge.observe.summary import endings_line
from trialforge.rollout.chat import INVALID_TOOL
from trialforge.rollout.endings import ENDINGS, INFRASTRUCTURE, MODEL, ending
from trialforge.rollout.env import Action, EnvLimits, opening
from trialforge.rollout.loop import EpisodeJob, episode_id
from trialforge.rollout.openai_policy import OpenAIPolicy
from trialforge.rollout.policies import Decision, EpisodePolicy, NoopPolicy, ReplayPolicy, TaskView, patch_to_actions
from trialforge.sandbox.base import Limits
from trialforge.store.records import EpisodeRecord
from trialforge.train.health import LearningGate, learning_health

TASK_ID = "ledgerlite-3"


@pytest.fixture(scope="module")
def world(bwrap_backend, tmp_path_factory) -> SimpleNamespace:
    return bundled_world(tmp_path_factory.mktemp("endings"), bwrap_backend, (TASK_ID,), author_only=True)


def run(world: SimpleNamespace, backend: Any, policy: Any, task: Any = None, **fields: Any) -> EpisodeRecord:
    """One episode of ``policy`` on the world's task (or ``task``), not retried; ``fields``: the Rollout's."""
    recovery = {k: fields.pop(k) for k in ("max_recoveries",) if k in fields}
    rollout = dataclasses.replace(make_rollout(world, backend, env_retries=0, **recovery), **fields)
    return rollout.episode(task or world.tasks[0], policy, sample=0, seed=1)


def replay(actions: list[Action]) -> ReplayPolicy:
    return ReplayPolicy({TASK_ID: actions}, name="scripted")


class KillsItsSandbox:
    """Takes its own sandbox away before its first action, as a reaper or a lost disk would."""

    name, version = "killer", "scripted"

    def __init__(self, backend: Any, task: Any) -> None:
        self.backend = backend
        self.episode = episode_id(LINEAGE, EpisodeJob(task, self, 0, 1))

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        return self

    def act(self, observation: str) -> Decision:
        kill_bwrap(self.backend, self.episode)
        return Decision(Action(tool="run", args={"command": "ls"}))


def endpoint(chat_server: Any) -> OpenAIPolicy:
    return OpenAIPolicy(chat_server.url, "m", api_key="", timeout_s=5.0, max_retries=1, backoff_s=0.01,
                        max_backoff_s=0.02)  # fmt: skip


@pytest.mark.sandbox
def test_every_way_an_episode_ends_is_classified_as_the_table_says(world, bwrap_backend, chat_server, tiny_lm):
    from trialforge.rollout.hf_policy import HFPolicy

    task = world.tasks[0]
    gold = patch_to_actions(task.gold_patch)
    got: dict[str, EpisodeRecord] = {}
    got["submitted"] = run(world, bwrap_backend, replay(gold))
    got["submitted_unchanged"] = run(world, bwrap_backend, NoopPolicy())
    views = [Action(tool=INVALID_TOOL, args={"error": "prose"}), *[Action(tool="view", args={"path": "x"})] * 5]
    got["max_turns"] = run(world, bwrap_backend, replay(views), env_limits=EnvLimits(max_turns=3))
    bad = [Action(tool=INVALID_TOOL, args={"error": "no call"}), Action(tool="frobnicate"), Action(tool="view")]
    limits = EnvLimits(max_turns=9, max_bad_actions=3)
    got["invalid_actions"] = run(world, bwrap_backend, replay([*bad, *gold]), env_limits=limits)
    # The tiny model: its first prompt fits with 12 tokens to spare; its second does not.
    _, model, tokenizer = tiny_lm
    roomy = HFPolicy(model, tokenizer, max_new_tokens=8)
    first = roomy.begin(TaskView(TASK_ID, ""), 1).act(opening(task.problem_statement))
    tight = HFPolicy(model, tokenizer, max_new_tokens=8, context_tokens=first.tokens_in + 12, name="lm")
    got["context_exhausted"] = run(world, bwrap_backend, tight)

    got["sandbox"] = run(world, bwrap_backend, KillsItsSandbox(bwrap_backend, task), max_recoveries=0)
    chat_server.play(Fault(503), Fault(503))
    got["inference"] = run(world, bwrap_backend, endpoint(chat_server))
    chat_server.play(Fault(400, message="unsupported parameter"))
    got["policy_fault"] = run(world, bwrap_backend, endpoint(chat_server))
    got["timeout"] = run(world, bwrap_backend, replay(gold), limits=Limits(episode_timeout_s=0.001))
    unappliable = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    got["verifier"] = run(world, bwrap_backend, NoopPolicy(), task.model_copy(update={"test_patch": unappliable}))

    assert sorted(got) == sorted(ENDINGS)  # every row of the table is produced here
    for key, record in got.items():
        assert ending(record.status, record.termination, record.cause, bool(record.final_diff)) == key, record
        if ENDINGS[key] == MODEL:  # graded: a reward the loss sees
            assert record.status == "ok" and record.reward is not None, (key, record.status, record.cause)
        else:  # unknown: never a reward, never the loss
            assert record.status != "ok" and record.reward is None, (key, record.status)
    assert got["submitted"].reward == 1.0
    assert got["context_exhausted"].reward == 0.0 and len(got["context_exhausted"].step_rows) == 1
    assert got["invalid_actions"].steps == 3 and got["max_turns"].steps == 3
    assert "inference" in got["inference"].cause and got["sandbox"].status == "env_error"

    frame = pd.DataFrame([r.row() for r in got.values()])
    assert endings(frame) == list(got)
    counts = iteration_metrics(frame, pd.DataFrame())["endings"]
    assert counts[MODEL] == dict.fromkeys([k for k, who in ENDINGS.items() if who == MODEL], 1)
    assert counts[INFRASTRUCTURE] == dict.fromkeys([k for k, who in ENDINGS.items() if who == INFRASTRUCTURE], 1)
    assert endings_line(counts).startswith("endings: model (graded) submitted 1, submitted_unchanged 1, max_turns 1")


@pytest.mark.pure
def test_the_gate_warns_when_the_models_failures_of_format_or_budget_dominate_a_batch():
    def episode(i: int, termination: str) -> EpisodeRecord:
        return EpisodeRecord(
            "run", 0, f"e{i}", "t", "ts", "easy", "lm", "v0", "t/lm", i, i, "bwrap", "", 1, "ok", "", termination,
            float(i == 0), "", "{}", "[]", "", 1, 1, 0, 0, 0, 0, 0, 0, 0, "", "",
        )  # fmt: skip

    batch = [episode(0, "submitted"), *(episode(i, "context_exhausted") for i in (1, 2)), episode(3, "invalid_actions")]
    health = learning_health(batch, ["t"], [], LearningGate())
    verdict = next(v for v in health.verdicts if v.check == "model_failures")
    assert health.model_failures == {"context_exhausted": 2, "invalid_actions": 1}
    assert (verdict.status, verdict.value) == ("warn", 0.75)
    assert "context_exhausted 2, invalid_actions 1" in verdict.reason and "rollout.context" in verdict.reason
    assert health.informative_groups == 1 and health.trainable  # graded 0s beside a 1: a group to learn from
    calm = learning_health(batch[:2], ["t"], [], LearningGate())
    assert next(v for v in calm.verdicts if v.check == "model_failures").status == "ok"
