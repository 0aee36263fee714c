"""The learning gate: is there anything in the learner's batch to learn from, and does its reward look earned?"""

from __future__ import annotations

import json

import pytest
from test_curate_sampler import episode

from trialforge.config import load_params
from trialforge.errors import ConfigError
from trialforge.store.records import EpisodeRecord, StepRecord
from trialforge.train.health import Check, LearningGate, learning_health

pytestmark = pytest.mark.pure

GATE = LearningGate()
FIX = "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1 +1 @@\n-a\n+b\n"
GAMED = "diff --git a/tests/test_mod.py b/tests/test_mod.py\n--- a/tests/test_mod.py\n+++ b/tests/test_mod.py\n"


def groups(spec: dict[str, list[float]], *, tier: str = "medium", diff: str = FIX) -> list[EpisodeRecord]:
    out = []
    for task_id, rewards in spec.items():
        for i, reward in enumerate(rewards):
            e = episode(task_id, reward, sample=i)
            e.tier, e.final_diff = tier, diff if reward >= 1.0 else ""
            out.append(e)
    return out


def with_entropy(episodes: list[EpisodeRecord], entropy: float) -> list[EpisodeRecord]:
    for e in episodes:
        info = json.dumps({"chosen": 0, "entropy": entropy})
        e.step_rows = [StepRecord(e.run_id, 0, e.episode_id, 0, "run", "{}", "", False, 0.0, 0.0, 0, 1, -0.1, info)]
    return episodes


def verdicts(health) -> dict[str, str]:
    return {v.check: v.status for v in health.verdicts}


def test_a_batch_of_all_equal_groups_is_refused_with_its_reason():
    drawn = groups({"a": [0, 0, 0, 0], "b": [1, 1, 1, 1], "c": [0, 0, 0, 0]})
    health = learning_health(drawn, kept=[], previous=[], gate=GATE)
    assert not health.trainable
    assert (health.groups, health.informative_groups, health.kept_groups, health.effective_episodes) == (3, 0, 0, 0)
    assert health.zero_variance_share == 1.0
    assert verdicts(health)["effective_batch"] == "refuse" and verdicts(health)["zero_variance"] == "warn"
    refusal = next(v for v in health.verdicts if v.status == "refuse")
    assert "0 informative groups in the batch (< 1) of 3 rolled out" in refusal.reason


def test_an_informative_batch_trains_and_reports_its_figures():
    drawn = groups({"a": [0, 1, 0, 0], "b": [1, 1, 0, 1], "c": [0, 0, 0, 0]})
    health = learning_health(drawn, kept=["a", "b"], previous=[], gate=GATE)
    assert health.trainable and set(verdicts(health).values()) == {"ok"}
    assert (health.informative_groups, health.kept_groups, health.effective_episodes) == (2, 2, 8)
    assert health.zero_variance_share == pytest.approx(1 / 3, abs=1e-4)
    assert health.saturation == {"medium": {"groups": 3, "all_zero": 1, "all_one": 0}}
    assert health.pass_rate == pytest.approx(4 / 12, abs=1e-4) and health.previous_pass_rate is None
    assert health.entropy is None  # the records carry no decisions


def test_a_kept_group_that_is_not_informative_does_not_count():
    """The sampler's list and the rewards are read apart: a group must really hold two different rewards."""
    health = learning_health(groups({"a": [0, 0], "b": [0, 1]}), kept=["a", "b"], previous=[], gate=GATE)
    assert health.kept_groups == 1 and health.effective_episodes == 2


def test_a_tier_whose_groups_are_all_saturated_is_reported_per_tier():
    drawn = groups({"h1": [0, 0], "h2": [0, 0]}, tier="hard") + groups({"e1": [1, 0], "e2": [1, 1]}, tier="easy")
    health = learning_health(drawn, kept=["e1"], previous=[], gate=GATE)
    saturation = next(v for v in health.verdicts if v.check == "saturation")
    assert saturation.status == "warn" and saturation.reason == "tier hard: 2 of 2 groups all 0, 0 all 1"
    assert health.saturation["easy"] == {"groups": 2, "all_zero": 0, "all_one": 1}
    assert health.trainable  # a warning never stops the step


def test_entropy_collapse_is_read_from_the_recorded_decisions():
    informative = {"a": [0, 1], "b": [1, 0]}
    alive = learning_health(with_entropy(groups(informative), 1.2), kept=["a", "b"], previous=[], gate=GATE)
    assert alive.entropy == 1.2 and verdicts(alive)["entropy"] == "ok"
    collapsed = learning_health(with_entropy(groups(informative), 0.01), kept=["a", "b"], previous=[], gate=GATE)
    assert verdicts(collapsed)["entropy"] == "warn" and "collapsed" in collapsed.verdicts[3].reason


def test_a_reward_jump_carried_by_diffs_that_touch_tests_is_refused():
    before = groups({"a": [0, 0, 0, 1], "b": [0, 0, 0, 0]})
    honest = groups({"a": [1, 1, 0, 1], "b": [1, 0, 0, 1]})
    gamed = groups({"a": [1, 1, 0, 1], "b": [1, 0, 0, 1]}, diff=FIX + GAMED)
    fine = learning_health(honest, kept=["a", "b"], previous=before, gate=GATE)
    assert fine.trainable and verdicts(fine)["reward_hacking"] == "ok"
    assert (fine.previous_pass_rate, fine.pass_rate) == (0.125, 0.625)
    hacked = learning_health(gamed, kept=["a", "b"], previous=before, gate=GATE)
    assert not hacked.trainable and hacked.suspicious_pass_share == 1.0
    reason = next(v.reason for v in hacked.verdicts if v.check == "reward_hacking")
    assert "0.12 -> 0.62" in reason and "touch tests or carry integrity flags rose to 100%" in reason


def test_integrity_flags_on_passes_count_as_suspicious():
    before = groups({"a": [0, 0, 0, 0]})
    now = groups({"a": [1, 1, 1, 0]})
    for e in now:
        e.integrity_flags = json.dumps(["edits_test_or_config:conftest.py"]) if e.reward else "[]"
    assert not learning_health(now, kept=["a"], previous=before, gate=GATE).trainable


def test_each_check_can_be_set_to_warn_or_off_from_params():
    params = load_params(
        None,
        {
            "observe.learning.effective_batch.action": "warn",
            "observe.learning.zero_variance.action": "off",
            "observe.learning.entropy.threshold": 0.5,
        },
    )
    gate = params.observe.learning
    assert gate.effective_batch == Check(threshold=1, action="warn") and gate.entropy.threshold == 0.5
    health = learning_health(groups({"a": [0, 0]}), kept=[], previous=[], gate=gate)
    assert health.trainable and verdicts(health)["effective_batch"] == "warn"
    assert verdicts(health)["zero_variance"] == "off"
    with pytest.raises(ConfigError, match="action"):
        load_params(None, {"observe.learning.entropy.action": "maybe"})
