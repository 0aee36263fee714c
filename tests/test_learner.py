"""The learner behind one interface: a transformers LM (``train.model``) trained through the same loop as the
demo's repair policy, its checkpoints in the store and its version in the next rollouts' records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trialforge import pipeline
from trialforge.config import load_params
from trialforge.errors import ConfigError
from trialforge.loop.iteration import train_in_process
from trialforge.loop.learner import open_learner
from trialforge.loop.records import load_episodes
from trialforge.rollout.repair import RepairPolicy
from trialforge.runtime import open_runtime
from trialforge.train.settings import LM

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK_IDS = ("ledgerlite-3", "textkit-21")
HELD_OUT = "schedwise-52"


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


@pytest.mark.sandbox
def test_a_transformers_lm_is_rolled_out_trained_and_checkpointed_through_the_loop(tiny_lm, tmp_path) -> None:
    path, _, _ = tiny_lm
    knobs = {"train.model": str(path), "rollout.policies": [LM], "rollout.max_new_tokens": 12, "train.lr": 1e-4}
    knobs["observe.learning.effective_batch.action"] = "warn"  # random weights earn only 0s: train on them anyway
    params = load_params(None, small(tmp_path, **knobs))
    assert params.train.learner == LM
    with open_runtime(params) as rt:
        ingested, _ = pipeline.ingest(rt)
        tasks, _ = pipeline.validate(rt, [t for t in ingested if t.task_id in TASK_IDS])
        loop = train_in_process(rt, tasks, "lm-run")
        by_iteration = {it: load_episodes(rt.store, "lm-run", it, LM) for it in (0, 1)}
        keys = sorted(rt.store.list("checkpoints/lm-run/"))
        resumed = open_learner(params, rt.store, loop.checkpoint)

    manifests = [k for k in keys if k.endswith("/manifest.json")]  # one Hugging Face checkpoint per version
    assert manifests == [f"checkpoints/lm-run/lm-v{n}/manifest.json" for n in (1, 2)]
    assert resumed.version == 2 and loop.checkpoint == "checkpoints/lm-run/lm-v2.pt"
    assert [(u["policy_version"], u["device"]) for u in loop.updates] == [(1, "cpu float32"), (2, "cpu float32")]
    verdicts = [{v["check"]: v["status"] for v in u["health"]["verdicts"]} for u in loop.updates]
    assert all(v["effective_batch"] == "warn" for v in verdicts) and all(
        u["decision"] == "trained" for u in loop.updates
    )
    assert all(u["health"]["entropy"] > 0 for u in loop.updates)  # the LM records its sampling entropy
    for iteration, episodes in by_iteration.items():
        assert episodes and {e.policy_version for e in episodes} == {f"v{iteration}"}  # the update's version flows on
        assert all(e.status == "ok" and e.reward == 0.0 for e in episodes)  # random weights fix nothing
        steps = [s for e in episodes for s in e.step_rows]
        assert all(s.tokens_out > 0 and s.logprob is not None for s in steps)
        assert all(json.loads(s.info)["token_ids"] for s in steps)  # what the trainer rescoring needs


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_batch_with_nothing_to_learn_takes_no_step_no_version_and_no_checkpoint(tmp_path) -> None:
    """Two turns are too few for the repair policy to fix anything: every group is all 0, the gate refuses.
    A held-out task is scored every iteration and after the last one, with the same seeds, and never drawn."""
    params = load_params(None, small(tmp_path, **{"rollout.policies": ["gold", "repair"]}))
    with open_runtime(params) as rt:
        ingested, _ = pipeline.ingest(rt)
        chosen = [t for t in ingested if t.task_id in (*TASK_IDS, HELD_OUT)]
        chosen = [t.model_copy(update={"split": "eval"}) if t.task_id == HELD_OUT else t for t in chosen]
        tasks, _ = pipeline.validate(rt, chosen)
        loop = train_in_process(rt, tasks, "empty-run")
        episodes = {it: load_episodes(rt.store, "empty-run", it, "repair") for it in (0, 1, 2)}
        assert rt.store.list("checkpoints/empty-run/") == []
        records = [json.loads(rt.store.get_bytes(f"runs/empty-run/train-{it}.json")) for it in (0, 1)]

    versions = {it: {e.policy_version for e in eps} for it, eps in episodes.items()}
    assert loop.checkpoint is None and versions == {0: {"v0"}, 1: {"v0"}, 2: {"v0"}}
    held_out = {it: [(e.task_id, e.split, e.seed) for e in eps if e.split == "eval"] for it, eps in episodes.items()}
    assert {task for rows in held_out.values() for task, _, _ in rows} == {HELD_OUT}
    assert len(held_out[0]) == params.rollout.eval_group_size and held_out[0] == held_out[1] == held_out[2]
    assert {e.task_id for e in episodes[2]} == {HELD_OUT}  # after the last update: the held-out round alone
    assert all(e.task_id != HELD_OUT for it in (0, 1) for e in episodes[it] if e.split == "train")
    assert [u["decision"] for u in loop.updates] == ["skipped", "skipped"]
    assert [u["policy_version"] for u in loop.updates] == ["v0", "v0"]
    for update, record in zip(loop.updates, records, strict=True):
        assert record["checkpoint"] is None and record["stats"]["decision"] == "skipped"
        assert "0 informative groups in the batch (< 1)" in update["reasons"][0]
        health = update["health"]
        assert health["informative_groups"] == 0 and health["zero_variance_share"] == 1.0
        assert health["groups"] == update["sampler"]["drawn"] == 2  # gold's groups never count


@pytest.mark.pure
def test_the_learner_must_be_among_the_policies_it_is_named_for(tmp_path) -> None:
    params = load_params(None, small(tmp_path, **{"rollout.policies": ["gold", LM]}))
    assert params.train.learner == RepairPolicy.name  # no train.model: the demo's policy learns
    with pytest.raises(ConfigError, match=r"unknown policies \['lm'\]"):
        pipeline.make_policies(params.rollout.policies, [], open_learner(params, None, None).policy(), params.rollout)  # type: ignore[arg-type]


@pytest.mark.pure
def test_the_repair_policys_learning_rate_is_refused_for_a_language_model(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"train.lr=20 is a rate for the demo's 21-weight repair policy"):
        load_params(REPO_ROOT / "params.yaml", {"train.model": str(tmp_path)})  # the demo's lr, an LM to train
    assert load_params(REPO_ROOT / "params.yaml", {"train.model": str(tmp_path), "train.lr": 1e-6}).train.lr == 1e-6
