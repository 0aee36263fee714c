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

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    overrides = {
        "run.store": f"file://{tmp / 'store'}",
        "run.out_dir": str(tmp / "out"),
        "validate.runs": 1,
        "rollout.group_size": 2,
        "train.iterations": 2,
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


def test_gold_scores_one_and_noop_zero_on_every_valid_task(demo_run):
    tmp, stdout = demo_run
    metrics = json.loads((tmp / "out" / "metrics.json").read_text())
    assert metrics["tasks"]["validate"]["kept"] >= 12
    assert metrics["episodes"]["env_error_rate"] == 0.0
    episodes = _read(tmp, "episodes")
    ok = episodes[episodes["status"] == "ok"]
    assert len(ok) == len(episodes)
    assert set(ok[ok["policy"] == "gold"]["reward"]) == {1.0}
    assert set(ok[ok["policy"] == "noop"]["reward"]) == {0.0}
    assert set(ok["task_id"]) == set(ok[ok["policy"] == "gold"]["task_id"])  # gold ran on every valid task
    assert "gold" in stdout and "Tasks" in stdout


def test_rejected_tasks_are_reported_with_reasons(demo_run):
    tmp, _ = demo_run
    metrics = json.loads((tmp / "out" / "metrics.json").read_text())
    assert metrics["tasks"]["ingest"]["dropped"] == {"no_linked_fix": 1}
    assert "no_fail_to_pass" in metrics["tasks"]["validate"]["dropped"]
    # the held-out ticket's duplicate, and synthesized tasks whose patch touches the code of a held-out task
    dropped = metrics["tasks"]["decontaminate"]["dropped"]
    assert set(dropped) == {"ngram:heldout_eval"} and dropped["ngram:heldout_eval"] >= 1


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
    assert set(repair["policy_version"]) == {"v0", "v1"}  # the update's version flows into the next rollouts


def test_training_step_checkpoints_to_the_store(demo_run):
    tmp, _ = demo_run
    metrics = json.loads((tmp / "out" / "metrics.json").read_text())
    assert [u["policy_version"] for u in metrics["updates"]] == ["v1", "v2"]
    checkpoints = sorted(p.name for p in (tmp / "store" / "checkpoints").rglob("*.pt"))
    assert checkpoints == ["repair-v1.pt", "repair-v2.pt"]


def test_synthesized_tasks_join_the_tickets_and_reach_the_learner(demo_run):
    tmp, _ = demo_run
    episodes = _read(tmp, "episodes")
    synthetic = {t for t in episodes["task_id"] if "-syn-" in t}
    assert len(synthetic) >= 6  # sources.synthesize: 4 per bundled repository, less the ones the gates dropped
    gold = episodes[(episodes["policy"] == "gold") & episodes["task_id"].isin(synthetic)]
    assert set(gold["reward"]) == {1.0}
    repair = episodes[(episodes["policy"] == "repair") & episodes["task_id"].isin(synthetic)]
    assert len(repair) > 0 and set(repair["status"]) == {"ok"}  # their failing tests are what it learns from
