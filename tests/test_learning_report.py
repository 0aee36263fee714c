"""The learning signal in the summary and the report: the held-out curve beside the train curve, what the sampler
drew and the learning gate said per iteration (a skipped step with its reason), and per task family whether the
policy can reach the fix at all. Built from a small hand-made run: every expected number is worked out below.

Tasks: ``flip-a`` (train) and ``flip-b`` (eval) flip a comparison, in the repair policy's reach; ``drop-a``
(train) restores a dropped statement, out of reach. The learner ``repair``'s episodes (rewards of ok ones):

    iteration  flip-a (train)          drop-a (train)   flip-b (eval)
    0          0, 1                    0, 0             0, 0
    1          1, 1, env_error         0, timeout       1, 0
    2          -                       -                1, 1        (the final checkpoint's eval round alone)

and one gold episode on flip-a in iteration 0 (not the learner's: no family rate counts it). Iteration 0 trained;
iteration 1 was skipped: the learning gate found no informative group left in the batch.
"""

from __future__ import annotations

import json
from html import escape
from types import SimpleNamespace

import pandas as pd
import pytest
from fixtures.observe.runs import R2, episode_row, write_run
from rich.console import Console

from trialforge.config import load_params
from trialforge.curate.sampler import SamplerStats
from trialforge.loop.records import TrainResult, train_record_key
from trialforge.observe.families import family_metrics
from trialforge.observe.metrics import episode_metrics
from trialforge.observe.report import families_key, render_report
from trialforge.observe.run_report import finish_run
from trialforge.observe.summary import print_summary
from trialforge.store import datasets
from trialforge.store.objstore import ObjectStore, open_store
from trialforge.store.records import EPISODE_SCHEMA
from trialforge.tasks.schema import Source, Task
from trialforge.train.health import LearningHealth, Verdict

pytestmark = pytest.mark.pure

RUN = "learn-1"
TEST_PATCH = (
    "diff --git a/tests/test_span.py b/tests/test_span.py\n--- a/tests/test_span.py\n+++ b/tests/test_span.py\n"
)
FLIP = (
    "diff --git a/pkg/span.py b/pkg/span.py\n--- a/pkg/span.py\n+++ b/pkg/span.py\n"
    "@@ -3,2 +3,2 @@ def between(x, lo, hi):\n         return False\n-    return x < hi\n+    return x <= hi\n"
)
DROPPED = (
    "diff --git a/pkg/span.py b/pkg/span.py\n--- a/pkg/span.py\n+++ b/pkg/span.py\n"
    "@@ -1,2 +1,4 @@\n def between(x, lo, hi):\n+    if x < lo:\n+        return False\n     return x <= hi\n"
)
REWRITE = (
    "diff --git a/pkg/span.py b/pkg/span.py\n--- a/pkg/span.py\n+++ b/pkg/span.py\n"
    "@@ -4 +4 @@\n-    return x < hi\n+    return lo <= x <= hi\n"
)
ADDS_LINES = "the fix adds lines (a deleted statement or branch); the policy only rewrites a line"
NOTHING_TO_LEARN = (
    "0 informative groups in the batch (< 1) of 2 rolled out: every other group got equal rewards, so a step "
    "would carry no advantage"
)
FLAT = "50% of the groups rolled out had all-equal rewards (> 40%): rollouts are spent on tasks too hard or too easy"


def synthetic(task_id: str, family: str, patch: str, split: str = "train") -> Task:
    return Task(
        task_id=task_id,
        source=Source(kind="synthetic", ref=f"{family}:pkg/span.py:4"),
        repo="r",
        problem_statement="between() excludes its upper bound",
        gold_patch=patch,
        test_patch=TEST_PATCH,
        split=split,
    )


TASKS = [
    synthetic("flip-a", "flip_compare", FLIP),
    synthetic("flip-b", "flip_compare", FLIP, split="eval"),
    synthetic("drop-a", "drop_statement", DROPPED),
]
SPLIT = {t.task_id: t.split for t in TASKS}
# (iteration, task, policy, status, reward)
EPISODES = [
    (0, "flip-a", "repair", "ok", 0.0), (0, "flip-a", "repair", "ok", 1.0),
    (0, "drop-a", "repair", "ok", 0.0), (0, "drop-a", "repair", "ok", 0.0),
    (0, "flip-b", "repair", "ok", 0.0), (0, "flip-b", "repair", "ok", 0.0),
    (0, "flip-a", "gold", "ok", 1.0),
    (1, "flip-a", "repair", "ok", 1.0), (1, "flip-a", "repair", "ok", 1.0), (1, "flip-a", "repair", "env_error", None),
    (1, "drop-a", "repair", "ok", 0.0), (1, "drop-a", "repair", "timeout", None),
    (1, "flip-b", "repair", "ok", 1.0), (1, "flip-b", "repair", "ok", 0.0),
    (2, "flip-b", "repair", "ok", 1.0), (2, "flip-b", "repair", "ok", 1.0),
]  # fmt: skip


def rows() -> list[dict]:
    out = []
    for n, (iteration, task, policy, status, reward) in enumerate(EPISODES):
        spec = (f"x{n:02d}", "t1", policy, status, "", "submitted", reward, 1, 2, 1, 0.1, 1.0, 1.0)
        row = episode_row(RUN, iteration, spec)
        out.append(row | {"task_id": task, "group_id": f"{task}/{policy}", "split": SPLIT[task]})
    return out


def verdict(check: str, status: str, value: float | None, threshold: float, reason: str = "") -> Verdict:
    return Verdict(check, status, value, threshold, reason)  # type: ignore[arg-type]


def health(groups: int, informative: int, kept: int, zero_share: float, verdicts: list[Verdict]) -> dict:
    return LearningHealth(
        groups=groups,
        informative_groups=informative,
        kept_groups=kept,
        effective_episodes=2 * kept,
        zero_variance_share=zero_share,
        saturation={
            "easy": {"groups": 1, "all_zero": 0, "all_one": 0},
            "hard": {"groups": 1, "all_zero": 1, "all_one": 0},
        },
        entropy=0.693,
        pass_rate=0.25,
        previous_pass_rate=None,
        suspicious_pass_share=None,
        verdicts=verdicts,
    ).as_dict()


TRAINED = {
    "decision": "trained", "policy_version": "v1", "episodes": 4, "trained_on": 4, "zero_variance_groups": 1,
    "excluded_not_ok": 0, "loss": 0.125, "clip_fraction": 0.0,
    "sampler": SamplerStats(drawn=3, kept=1, dropped_zero_variance=2, extra_draws=1, rounds=2, budget=4,
                            exhausted="tasks", expected_pass_rate=0.4, in_band=True).as_dict(),
    "health": health(2, 1, 1, 0.5, [verdict("effective_batch", "ok", 1, 1),
                                     verdict("zero_variance", "warn", 0.5, 0.4, FLAT)]),
}  # fmt: skip
SKIPPED = {
    "decision": "skipped", "policy_version": "v1", "reasons": [NOTHING_TO_LEARN],
    "sampler": SamplerStats(drawn=6, kept=0, dropped_zero_variance=5, extra_draws=4, rounds=3, surplus=1, budget=6,
                            exhausted="budget", expected_pass_rate=0.3, in_band=True).as_dict(),
    "health": health(2, 0, 0, 1.0, [verdict("effective_batch", "refuse", 0, 1, NOTHING_TO_LEARN),
                                     verdict("entropy", "off", None, 0.05)]),
}  # fmt: skip
UPDATES = [TRAINED | {"iteration": 0, "behaviour_lag": 0}, SKIPPED | {"iteration": 1, "behaviour_lag": 0}]


def write_learning_run(store: ObjectStore) -> None:
    """The episodes as the rollout publishes them, and each iteration's train record as the train step stores it."""
    for iteration in (0, 1, 2):
        batch = [r for r in rows() if r["iteration"] == iteration]
        partition = {"run": RUN, "iteration": str(iteration)}
        datasets.write_rows(store, "episodes", batch, EPISODE_SCHEMA, partition=partition, part="batch-0")
    for iteration, stats, checkpoint in ((0, TRAINED, "checkpoints/r/repair-v1.pt"), (1, SKIPPED, None)):
        record = TrainResult(checkpoint=checkpoint, stats=stats)
        store.put_bytes(train_record_key(RUN, iteration), record.model_dump_json().encode())


@pytest.fixture
def store(tmp_path) -> ObjectStore:
    objects = open_store(f"file://{tmp_path / 'store'}")
    write_learning_run(objects)
    return objects


def section(html: str, anchor: str) -> str:
    return html.split(f'<section id="{anchor}">', 1)[1].split("</section>", 1)[0]


# --- families ---------------------------------------------------------------------------------------------


def test_family_metrics_count_tasks_reach_and_the_learners_first_and_last_pass_rates():
    got = family_metrics(TASKS, pd.DataFrame(rows()), "repair")
    assert list(got) == ["drop_statement", "flip_compare"]
    assert got["flip_compare"] == {
        "tasks": {"train": 1, "eval": 1},
        "reachable": 2,
        "unreachable_reasons": {},
        # the gold pass and the env_error (no side) leave the learner's rates alone
        "train": {"first_iteration": 0, "first": 0.5, "last_iteration": 1, "last": 1.0},
        "heldout": {"first_iteration": 0, "first": 0.0, "last_iteration": 2, "last": 1.0},
        "learnable": "yes",
    }
    assert got["drop_statement"] == {
        "tasks": {"train": 1, "eval": 0},
        "reachable": 0,
        "unreachable_reasons": {ADDS_LINES: 1},
        "train": {"first_iteration": 0, "first": 0.0, "last_iteration": 1, "last": 0.0},  # a timeout fails too
        "heldout": None,
        "learnable": f"no: {ADDS_LINES}",
    }


def test_a_family_with_some_fixes_out_of_reach_is_partly_learnable_and_one_without_episodes_has_no_rates():
    tasks = [synthetic("a", "flip_compare", FLIP), synthetic("b", "flip_compare", REWRITE)]
    got = family_metrics(tasks, pd.DataFrame(), "repair")["flip_compare"]
    assert got["learnable"] == "partly: 1 of 2 reachable"
    assert got["train"] is None and got["heldout"] is None


# --- the printed summary ------------------------------------------------------------------------------------


def summary_text(metrics: dict) -> str:
    console = Console(record=True, width=200)
    print_summary(metrics, console)
    return console.export_text()


def test_summary_prints_the_heldout_curve_the_learning_health_and_the_families():
    episodes = pd.DataFrame(rows())
    text = summary_text(
        {
            "episodes": episode_metrics(episodes),
            "updates": UPDATES,
            "families": family_metrics(TASKS, episodes, "repair"),
        }
    )
    lines = text.splitlines()
    # mean reward of ok episodes per iteration 0, 1, 2: train 1/4, 2/3 then none; held-out 0, 1/2, 1
    assert any("repair (held-out)" in line and "0.00 0.50 1.00" in line for line in lines)
    assert any("repair " in line and "0.25 0.67 -" in line for line in lines)
    skipped = next(line for line in lines if " skipped " in line)
    assert "0/2" in skipped and "100%" in skipped
    assert "  iteration 1: refuse effective_batch: 0 informative groups in the batch (< 1) of 2" in text
    trained = next(line for line in lines if " trained " in line)
    assert "1/2" in trained and "0.693" in trained
    assert "  iteration 0: warn zero_variance: 50% of the groups" in text
    assert "Families" in text
    flip = next(line for line in lines if "flip_compare" in line)
    assert "0.50 → 1.00" in flip and "0.00 → 1.00" in flip and " yes " in flip
    assert "│ no " in next(line for line in lines if "drop_statement" in line)
    assert "  drop_statement: 1 out of reach: the fix adds lines (a deleted statement or branch)" in text


def test_summary_of_an_old_run_prints_without_heldout_rows_or_learning_tables():
    old = pd.DataFrame(rows()).drop(columns="split")  # before episodes carried their split: all train
    text = summary_text({"episodes": episode_metrics(old), "updates": []})
    assert "held-out" not in text and "Learning health" not in text and "Families" not in text


# --- the report ---------------------------------------------------------------------------------------------


def test_report_shows_the_learning_signal_from_the_stored_records(store, tmp_path):
    store.put_bytes(families_key(RUN), json.dumps(family_metrics(TASKS, pd.DataFrame(rows()), "repair")).encode())
    html = render_report(store, RUN, tmp_path / "report.html").read_text()
    signal = section(html, "learning-signal")
    assert '<figure data-chart="heldout_vs_train">' in signal
    assert '"name":"repair held-out"' in signal and '"name":"repair train"' in signal
    # budget, drawn, kept, dropped, refills, surplus, rounds, band swaps; then why it ended short
    n = "".join(f'<td class="n">{v}</td>' for v in (6, 6, 0, 5, 4, 1, 3, 0))
    assert f'<tr><td class="n">1</td><td>skipped</td>{n}<td>budget</td>' in signal
    assert f'<span class="bad">refuse</span>: {escape(NOTHING_TO_LEARN)}' in signal
    assert f'<span class="warn">warn</span>: {escape(FLAT)}' in signal
    assert "<td>1 all 0, 0 all 1 of 1</td>" in signal  # the hard tier's one group got nothing right
    assert f'<span class="bad">no: {ADDS_LINES}</span>' in signal and '<span class="good">yes</span>' in signal
    training = section(html, "training")
    assert "<td>skipped</td><td>v1</td><td>-</td>" in training and training.count("<tr>") == 3


def test_report_of_an_old_run_shows_what_exists(tmp_path):
    objects = open_store(f"file://{tmp_path / 'store'}")
    write_run(objects, "old", R2, {})  # no split column, no train record, no family record
    signal = section(render_report(objects, "old", tmp_path / "old.html").read_text(), "learning-signal")
    assert "No held-out episodes" in signal and "No train record is stored" in signal
    assert "No family record is stored" in signal and "<figure" not in signal


# --- closing a run ------------------------------------------------------------------------------------------


def test_finish_run_adds_the_families_to_the_metrics_and_the_report(store, tmp_path, capsys):
    rt = SimpleNamespace(params=load_params(None, {"run.out_dir": str(tmp_path / "out")}), store=store)
    metrics = finish_run(rt, RUN, TASKS, [], UPDATES, {})  # type: ignore[arg-type]
    assert metrics["families"]["drop_statement"]["learnable"] == f"no: {ADDS_LINES}"
    assert json.loads(store.get_bytes(families_key(RUN))) == metrics["families"]
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["families"] == metrics["families"]
    assert f"no: {ADDS_LINES}" in section((tmp_path / "out" / "report.html").read_text(), "learning-signal")
    assert "repair (held-out)" in capsys.readouterr().out
