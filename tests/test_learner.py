"""The learner behind one interface: a transformers LM (``train.model``) trained through the same loop as the
demo's repair policy, its checkpoints in the store and its version in the next rollouts' records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.errors import ConfigError
from trialforge.orchestrate.iterations import train_in_process
from trialforge.orchestrate.shards import load_episodes
from trialforge.rollout.repair import RepairPolicy
from trialforge.runtime import open_runtime
from trialforge.train.learner import LM, learner_name, open_learner

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK_IDS = ("ledgerlite-3", "textkit-21")


def small(tmp_path: Path, **more: object) -> dict:
    src = REPO_ROOT / "tasks_src"
    return {
        "run.store": f"file://{tmp_path / 'store'}",
        "run.out_dir": str(tmp_path / "out"),
        "sources.tickets": str(src / "tickets" / "github_issues.jsonl"),
        "sources.repos": str(src / "repos"),
        "validate.runs": 1,
        "rollout.group_size": 2,
        "rollout.max_turns": 2,
        "curate.sampler.max_extra_draws": 0,
        "train.iterations": 2,
        **more,
    }


def test_a_transformers_lm_is_rolled_out_trained_and_checkpointed_through_the_loop(tiny_lm, tmp_path) -> None:
    path, _, _ = tiny_lm
    knobs = {"train.model": str(path), "rollout.policies": [LM], "rollout.max_new_tokens": 12, "train.lr": 1e-4}
    params = load_params(None, small(tmp_path, **knobs))
    assert learner_name(params) == LM
    with open_runtime(params) as rt:
        ingested, _ = pipeline.ingest(rt)
        tasks, _ = pipeline.validate(rt, [t for t in ingested if t.task_id in TASK_IDS])
        loop = train_in_process(rt, tasks, "lm-run")
        by_iteration = {it: load_episodes(rt.store, "lm-run", it, LM) for it in (0, 1)}
        keys = sorted(rt.store.list("checkpoints/lm-run/"))
        resumed = open_learner(params, rt.store, loop.checkpoint)

    assert keys == [f"checkpoints/lm-run/lm-v{n}.{ext}" for n in (1, 2) for ext in ("json", "pt")]
    assert resumed.version == 2 and loop.checkpoint == "checkpoints/lm-run/lm-v2.pt"
    assert [(u["policy_version"], u["device"]) for u in loop.updates] == [(1, "cpu float32"), (2, "cpu float32")]
    for iteration, episodes in by_iteration.items():
        assert episodes and {e.policy_version for e in episodes} == {f"v{iteration}"}  # the update's version flows on
        assert all(e.status == "ok" and e.reward == 0.0 for e in episodes)  # random weights fix nothing
        steps = [s for e in episodes for s in e.step_rows]
        assert all(s.tokens_out > 0 and s.logprob is not None for s in steps)
        assert all(json.loads(s.info)["token_ids"] for s in steps)  # what the trainer rescoring needs


def test_the_learner_must_be_among_the_policies_it_is_named_for(tmp_path) -> None:
    params = load_params(None, small(tmp_path, **{"rollout.policies": ["gold", LM]}))
    assert learner_name(params) == RepairPolicy.name  # no train.model: the demo's policy learns
    with pytest.raises(ConfigError, match=r"unknown policies \['lm'\]"):
        pipeline.make_policies(params.rollout.policies, [], open_learner(params, None, None).policy())  # type: ignore[arg-type]
