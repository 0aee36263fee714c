"""The main job end to end: the real Prefect flow, real sandboxes, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO_ROOT

pytestmark = [pytest.mark.sandbox, pytest.mark.services, pytest.mark.slow]  # a flow on Prefect's ephemeral server


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    overrides = {
        "run.store": f"file://{tmp / 'store'}",
        "run.out_dir": str(tmp / "out"),
        "validate.runs": 1,
        "sources.synthesize": 4,
        "rollout.group_size": 4,
        "rollout.eval_group_size": 2,
        "train.iterations": 2,
        "observe.prices.cpu_hour": 0.05,
        "observe.prices.memory_gb_hour": 0.01,
    }
    argv = [sys.executable, "-m", "trialforge.cli", "run"]
    for key, value in overrides.items():
        argv += ["-S", f"{key}={value}"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, env=os.environ.copy(), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp, done.stdout


def _read(root: Path, dataset: str) -> pd.DataFrame:
    from trialforge.store import datasets
    from trialforge.store.objstore import open_store

    return datasets.read_pandas(open_store(f"file://{root / 'store'}"), dataset)


def test_gold_scores_one_and_noop_zero_beside_every_task_the_learner_ran(demo_run):
    tmp, stdout = demo_run
    metrics = json.loads((tmp / "out" / "metrics.json").read_text())
    assert metrics["tasks"]["validate"]["kept"] >= 12
    assert metrics["episodes"]["env_error_rate"] == 0.0
    episodes = _read(tmp, "episodes")
    ok = episodes[episodes["status"] == "ok"]
    assert len(ok) == len(episodes)
    assert set(ok[ok["policy"] == "gold"]["reward"]) == {1.0}
    assert set(ok[ok["policy"] == "noop"]["reward"]) == {0.0}
    for iteration, rows in ok[ok["iteration"].astype(int) < 2].groupby("iteration"):  # 2: the final eval alone
        used = set(rows[rows["policy"] == "repair"]["task_id"])
        assert set(rows[rows["policy"] == "gold"]["task_id"]) == used, iteration  # the canary beside each reward
    assert "gold" in stdout and "Tasks" in stdout


def test_the_run_says_what_its_episodes_cost_in_metrics_and_report(demo_run):
    tmp, _ = demo_run
    cost = json.loads((tmp / "out" / "metrics.json").read_text())["cost"]["overall"]
    totals, episodes = cost["totals"], _read(tmp, "episodes")
    assert cost["episodes"] == len(episodes) and cost["valid"] == int((episodes["status"] == "ok").sum())
    assert totals["sandbox_s"] == pytest.approx(episodes["duration_s"].sum(), rel=1e-4)
    priced = totals["reserved_cpu_s"] / 3600 * 0.05 + totals["reserved_memory_gb_s"] / 3600 * 0.01
    assert cost["money"] == pytest.approx(priced, rel=1e-4) and cost["money"] > 0
    assert cost["per_valid_trajectory"]["all_in"] == pytest.approx(cost["money"] / cost["valid"], rel=1e-3)
    assert sum(t["episodes"] for t in cost["by_tier"].values()) == len(episodes)
    # used CPU from the sandboxes' cgroups: every episode measured (root), the verifier's part where one graded
    assert episodes["cpu_s"].notna().all() and cost["cpu_measured"] == len(episodes)
    graded = episodes[episodes["final_diff"] != ""]
    assert len(graded) and (graded["verify_cpu_s"] > 0).any()
    used = episodes["cpu_s"].sum() + episodes["verify_cpu_s"].sum()
    assert totals["used_cpu_s"] == pytest.approx(used, rel=1e-4) and 0 < cost["cpu_used_share"] < 1
    report = (tmp / "out" / "report.html").read_text()
    assert '<section id="cost">' in report and "USD in all" in report and "cgroups counted" in report


def test_rejected_tasks_are_reported_with_reasons(demo_run):
    tmp, _ = demo_run
    metrics = json.loads((tmp / "out" / "metrics.json").read_text())
    assert metrics["tasks"]["ingest"]["dropped"] == {"no_linked_fix": 1}
    assert "no_fail_to_pass" in metrics["tasks"]["validate"]["dropped"]
    # the held-out ticket's duplicate, and synthesized tasks whose patch touches the code of a held-out task
    dropped = metrics["tasks"]["decontaminate"]["dropped"]
    assert dropped["ngram:heldout_eval"] >= 1 and set(dropped) <= {"ngram:heldout_eval", "ngram:eval_split"}


def test_parquet_carries_lineage_rewards_and_steps(demo_run):
    tmp, _ = demo_run
    episodes = _read(tmp, "episodes")
    steps = _read(tmp, "steps")
    metrics = json.loads((tmp / "out" / "metrics.json").read_text())
    assert set(episodes["task_set_version"]) == {metrics["task_set_version"]}
    assert {"gold", "noop", "repair"} <= set(episodes["policy"])
    assert episodes["reward"].notna().all()
    assert set(steps["episode_id"]) == set(episodes["episode_id"])
    assert episodes.set_index("episode_id")["steps"].to_dict() == steps.groupby("episode_id").size().to_dict()
    repair = episodes[episodes["policy"] == "repair"]
    by_iteration = repair.groupby(repair["iteration"].astype(int))["policy_version"].agg(set).to_dict()
    updates = metrics["updates"]
    taken = [u["decision"] == "trained" for u in updates]
    # the version after each step flows into the next rollouts; a skipped step leaves it where it was
    assert by_iteration == {0: {"v0"}, 1: {f"v{int(taken[0])}"}, 2: {f"v{sum(taken)}"}}


def test_each_step_is_taken_or_refused_by_the_learning_gate_and_checkpointed(demo_run):
    tmp, stdout = demo_run
    metrics = json.loads((tmp / "out" / "metrics.json").read_text())
    updates = metrics["updates"]
    assert [u["iteration"] for u in updates] == [0, 1] and {u["decision"] for u in updates} <= {"trained", "skipped"}
    trained = 0
    for u in updates:
        verdicts = {v["check"]: v["status"] for v in u["health"]["verdicts"]}
        checks = {"effective_batch", "zero_variance", "saturation", "entropy", "reward_hacking", "model_failures"}
        assert set(verdicts) == checks
        assert (u["decision"] == "skipped") == ("refuse" in verdicts.values())
        trained += u["decision"] == "trained"
        assert u["policy_version"] == f"v{trained}"
        assert u["sampler"]["drawn"] == u["health"]["groups"] <= u["sampler"]["budget"]
    checkpoints = sorted(p.name for p in (tmp / "store" / "checkpoints").rglob("*.pt"))
    assert checkpoints == [f"repair-v{n}.pt" for n in range(1, trained + 1)]
    assert "Learning health" in stdout and "held-out" in stdout


def test_the_learner_is_scored_on_held_out_tasks_every_iteration_and_after_the_last(demo_run):
    tmp, _ = demo_run
    metrics = json.loads((tmp / "out" / "metrics.json").read_text())
    episodes = _read(tmp, "episodes")
    held_out = episodes[(episodes["split"] == "eval") & (episodes["policy"] == "repair")]
    trained_on = episodes[(episodes["split"] == "train") & (episodes["policy"] == "repair")]
    assert len(held_out) and not set(held_out["task_id"]) & set(trained_on["task_id"])
    assert sorted(held_out["iteration"].astype(int).unique()) == [0, 1, 2]
    assert len(metrics["episodes"]["heldout_by_iteration"]["repair"]) == 3
    assert {f for f in metrics["families"]} >= {"ticket:github"}


def test_synthesized_tasks_join_the_tickets_and_reach_the_learner(demo_run):
    tmp, _ = demo_run
    episodes = _read(tmp, "episodes")
    synthetic = {t for t in _read(tmp, "tasks")["task_id"] if "-syn-" in t}
    # sources.synthesize: 4 per bundled repository, less those the gates drop (each failing test must be anchored)
    assert len(synthetic) >= 3
    gold = episodes[(episodes["policy"] == "gold") & episodes["task_id"].isin(synthetic)]
    assert set(gold["reward"]) == {1.0}
    repair = episodes[(episodes["policy"] == "repair") & episodes["task_id"].isin(synthetic)]
    assert len(repair) > 0 and set(repair["status"]) == {"ok"}  # their failing tests are what it learns from
