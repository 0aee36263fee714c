"""The GRPO-family loss against numbers worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from trialforge.train.loss import LossConfig, LossVariant, group_advantages, policy_loss

pytestmark = pytest.mark.pure


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.allclose(actual, expected), f"{actual} != {expected}"


def logs(*rows: list[float]) -> torch.Tensor:
    """Per-token log-probs from per-token probabilities or ratios."""
    return t(*rows).log()


def off_policy(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """logprobs (with grad) and old_logprobs whose ratio exp(logp - old) is exactly ``ratios``."""
    old = torch.full((len(ratios), len(ratios[0])), -1.0, dtype=torch.float64)
    logp = (old + logs(*ratios)).requires_grad_()
    return logp, old


# --- group_advantages -------------------------------------------------------------------------------

# Group 0 rewards [1, 0, 0, 0]: mean 0.25, population var (0.75² + 3·0.25²)/4 = 0.1875, std √3/4.
# Group 1 rewards [3, 1, 2]:    mean 2,    population var (1 + 1 + 0)/3 = 2/3,         std √(2/3).
REWARDS = t(1, 0, 0, 0, 3, 1, 2)
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1])
S3, S15 = math.sqrt(3), math.sqrt(1.5)
EXPECTED = {
    # (r - mean) / std: 0.75/(√3/4) = √3, -0.25/(√3/4) = -1/√3;  ±1/√(2/3) = ±√1.5, 0
    "grpo": [S3, -1 / S3, -1 / S3, -1 / S3, S15, -S15, 0.0],
    # r - mean
    "drgrpo": [0.75, -0.25, -0.25, -0.25, 1.0, -1.0, 0.0],
    # r_i - mean(others): 1 - 0 = 1, 0 - 1/3 = -1/3;  3 - 1.5 = 1.5, 1 - 2.5 = -1.5, 2 - 2 = 0
    "rloo": [1.0, -1 / 3, -1 / 3, -1 / 3, 1.5, -1.5, 0.0],
}


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo"])
def test_advantages_match_hand_computed_values(method):
    adv, stats = group_advantages(REWARDS, GROUPS, torch.ones(7, dtype=torch.bool), method, eps=0.0)
    assert_close(adv, t(*EXPECTED[method]))
    assert (stats.groups, stats.zero_variance_groups, stats.undersized_groups) == (2, 0, 0)
    assert (stats.valid_episodes, stats.invalid_episodes) == (7, 0)


def test_grpo_adds_eps_to_the_std():
    # rewards [1, 0]: mean 0.5, population std 0.5 -> A = ±0.5 / (0.5 + 0.5) = ±0.5 with eps = 0.5
    adv, _ = group_advantages(t(1, 0), torch.tensor([0, 0]), torch.tensor([True, True]), "grpo", eps=0.5)
    assert_close(adv, t(0.5, -0.5))


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo"])
def test_invalid_episode_is_excluded_from_its_group_and_gets_zero(method):
    groups, valid = torch.tensor([0, 0, 0, 0]), torch.tensor([True, True, False, True])
    adv, stats = group_advantages(t(1, 0, 5, 0), groups, valid, method)
    changed, _ = group_advantages(t(1, 0, -100, 0), groups, valid, method)
    assert torch.equal(adv, changed)
    assert adv[2] == 0.0
    assert (stats.valid_episodes, stats.invalid_episodes) == (3, 1)
    if method == "drgrpo":  # valid rewards [1, 0, 0]: mean 1/3 (the invalid 5 is not in it)
        assert_close(adv, t(2 / 3, -1 / 3, 0, -1 / 3))


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo"])
def test_zero_variance_and_undersized_groups_get_exactly_zero(method):
    # group 0: [0.1, 0.1, 0.1] — in float64 its mean is 0.10000000000000002, so "exactly 0" needs a real check
    # group 1: [1, 0] carries signal; group 2: one valid member (the other is invalid) -> no baseline
    rewards = t(0.1, 0.1, 0.1, 1, 0, 1, 0)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    valid = torch.tensor([True, True, True, True, True, True, False])
    adv, stats = group_advantages(rewards, groups, valid, method)
    assert adv[[0, 1, 2, 5, 6]].tolist() == [0.0] * 5
    assert adv[3] > 0 > adv[4]
    assert (stats.groups, stats.zero_variance_groups, stats.undersized_groups) == (3, 1, 1)
    assert (stats.valid_episodes, stats.invalid_episodes) == (6, 1)


def test_group_advantages_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"rewards \(3,\), group_ids \(2,\)"):
        group_advantages(t(1, 0, 1), torch.tensor([0, 0]), torch.tensor([True, True]), "grpo")
    with pytest.raises(ValueError, match="'ppo' is not one of"):
        group_advantages(t(1, 0), torch.tensor([0, 0]), torch.tensor([True, True]), "ppo")


# --- policy_loss --------------------------------------------------------------------------------------


def test_on_policy_token_mean_is_minus_mean_advantage():
    logp = logs([0.5, 0.2, 0.9], [0.3, 0.3, 0.6])
    adv = t(1.0, -0.5)
    loss, stats = policy_loss(logp, logp.clone(), adv, torch.ones(2, 3), LossConfig())
    # ratio 1 everywhere: pg = -A per token; token-mean = -(3·1 + 3·(-0.5)) / 6 = -0.25 = -mean(A)
    assert loss.item() == pytest.approx(-0.25)
    assert (stats.loss, stats.pg_loss, stats.kl) == pytest.approx((-0.25, -0.25, 0.0))
    assert (stats.ratio_mean, stats.clip_fraction, stats.tokens) == (pytest.approx(1.0), 0.0, 6)


def test_clip_low_and_high():
    # row 0 has A = +1, row 1 has A = -1; clip range [0.8, 1.28]
    logp, old = off_policy([[1.5, 1.1, 0.5], [0.5, 1.1, 1.5]])
    loss, stats = policy_loss(logp, old, t(1.0, -1.0), torch.ones(2, 3), LossConfig(clip_low=0.2, clip_high=0.28))
    # A>0: ratio 1.5 -> clipped to 1.28: pg = -1.28; ratio 1.1: -1.1; ratio 0.5 (below, A>0 is not clipped): -0.5
    # A<0: ratio 0.5 -> clipped to 0.8: pg = 0.8;   ratio 1.1: 1.1;  ratio 1.5 (above, A<0 is not clipped): 1.5
    # token-mean = (-1.28 - 1.1 - 0.5 + 0.8 + 1.1 + 1.5) / 6 = 0.52 / 6
    assert loss.item() == pytest.approx(0.52 / 6)
    assert stats.clip_fraction == pytest.approx(2 / 6)
    loss.backward()
    # d pg / d logp = -A · ratio for unclipped tokens, 0 for clipped ones; / 6 tokens
    assert_close(logp.grad, t([0, -1.1, -0.5], [0, 1.1, 1.5]) / 6)


def test_dual_clip_bounds_negative_advantage_tokens_only():
    logp, old = off_policy([[5.0, 2.0, 0.5], [5.0, 1.0, 1.0]])
    adv, mask = t(-1.0, 1.0), torch.ones(2, 3)
    # A = -1: PPO gives max(r, clip(r)) = [5, 2, 0.8]; dual-clip c = 3 caps at -c·A = 3 -> [3, 2, 0.8]
    # A = +1: PPO gives [-1.28, -1, -1]; dual-clip never applies to A > 0 (min with -3 would give -3)
    loss, stats = policy_loss(logp, old, adv, mask, LossConfig(), variant=LossVariant(dual_clip=3.0))
    assert loss.item() == pytest.approx((3 + 2 + 0.8 - 1.28 - 1 - 1) / 6)  # 2.52 / 6 = 0.42
    assert stats.clip_fraction == pytest.approx(3 / 6)  # dual on r=5 (A<0), low on r=0.5, high on r=5 (A>0)
    loss.backward()
    assert_close(logp.grad, t([0, 2, 0], [0, -1, -1]) / 6)
    no_dual, _ = policy_loss(logp, old, adv, mask, LossConfig())
    assert no_dual.item() == pytest.approx((5 + 2 + 0.8 - 1.28 - 1 - 1) / 6)


def test_k3_kl_against_the_reference_policy():
    logp = logs([0.5, 0.25])
    ref = logs([0.25, 0.5])
    # d = ref - logp = [ln 0.5, ln 2]; k3 = e^d - d - 1 = [0.5 + ln2 - 1, 2 - ln2 - 1] = [ln2 - 0.5, 1 - ln2]
    # token mean of k3 = (ln2 - 0.5 + 1 - ln2) / 2 = 0.25; on-policy pg with A = 1 is -1 per token
    kl = LossVariant(kl_coef=0.1)
    loss, stats = policy_loss(logp, logp.clone(), t(1.0), torch.ones(1, 2), LossConfig(), ref_logprobs=ref, variant=kl)
    assert stats.kl == pytest.approx(0.25)
    assert loss.item() == pytest.approx(-1 + 0.1 * 0.25)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(logp, logp.clone(), t(1.0), torch.ones(1, 2), LossConfig(), variant=kl)


def test_truncated_importance_sampling_caps_the_behaviour_ratio():
    logp = logs([0.5, 0.5]).requires_grad_()
    old = logp.detach().clone()
    behaviour = old - logs([0.5, 4.0])  # exp(old - behaviour) = [0.5, 4.0]
    # w = min([0.5, 4.0], cap 2) = [0.5, 2]; on-policy pg with A = 1 is -1 -> [-0.5, -2]; mean -1.25
    loss, _ = policy_loss(logp, old, t(1.0), torch.ones(1, 2), LossConfig(tis_cap=2.0), behaviour_logprobs=behaviour)
    assert loss.item() == pytest.approx(-1.25)
    loss.backward()
    assert_close(logp.grad, t([-0.5, -2.0]) / 2)  # w is a constant: d/dlogp = -A·ratio·w / 2
    off, _ = policy_loss(logp, old, t(1.0), torch.ones(1, 2), LossConfig(tis_cap=None), behaviour_logprobs=behaviour)
    assert off.item() == pytest.approx(-1.0)  # tis_cap=None: no correction


# Rows: 2 tokens with A = 2, 4 tokens with A = -0.5, an invalid episode with no tokens (A = 5, masked out).
# On-policy pg = -A per token: row sums -4, +2, 0.
AGG_MASK = t([1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0])


@pytest.mark.parametrize(
    ("aggregation", "norm_length", "expected"),
    [
        ("token-mean", None, (-4 + 2) / 6),  # 6 tokens
        ("seq-mean-token-mean", None, (-4 / 2 + 2 / 4) / 2),  # (-2 + 0.5) / 2; the empty row is skipped
        ("seq-mean-token-sum-norm", None, (-4 / 4 + 2 / 4 + 0) / 3),  # divisor = mask width T = 4, all 3 rows
        ("seq-mean-token-sum-norm", 8, (-4 / 8 + 2 / 8 + 0) / 3),
    ],
)
def test_aggregations(aggregation, norm_length, expected):
    logp = torch.full((3, 4), -0.7, dtype=torch.float64)
    variant = LossVariant(aggregation=aggregation, norm_length=norm_length)
    loss, stats = policy_loss(logp, logp.clone(), t(2.0, -0.5, 5.0), AGG_MASK, LossConfig(), variant=variant)
    assert loss.item() == pytest.approx(expected)
    assert stats.tokens == 6


def test_gradient_flows_only_through_masked_in_tokens():
    logp, old = off_policy([[1.1, 3.0, 0.9, 7.0]])  # the masked-out tokens have ratios far out of range
    loss, stats = policy_loss(logp, old, t(1.0), t([1, 0, 1, 0]), LossConfig())
    loss.backward()
    # only tokens 0 and 2 count: pg = -(1.1 + 0.9) / 2; grad = -A·ratio / 2 there, 0 elsewhere
    assert loss.item() == pytest.approx(-1.0)
    assert_close(logp.grad, t([-1.1, 0, -0.9, 0]) / 2)
    assert (stats.clip_fraction, stats.ratio_mean, stats.tokens) == (0.0, pytest.approx(1.0), 2)


def test_shape_mismatches_name_the_shapes():
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"old_logprobs \(2, 4\)"):
        policy_loss(logp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3), LossConfig())
    with pytest.raises(ValueError, match=r"advantages \(3,\)"):
        policy_loss(logp, logp, torch.zeros(3), torch.ones(2, 3), LossConfig())
    with pytest.raises(ValueError, match=r"mask \(3, 2\)"):
        policy_loss(logp, logp, torch.zeros(2), torch.ones(3, 2), LossConfig())


def test_config_rejects_values_that_cannot_work():
    with pytest.raises(ValueError, match=r"dual_clip=0\.5 must be > 1"):
        LossVariant(dual_clip=0.5)
    with pytest.raises(ValueError, match="aggregation='seq-sum'"):
        LossVariant(aggregation="seq-sum")  # type: ignore[arg-type]
