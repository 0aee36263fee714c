"""The GRPO-family policy loss: group-relative advantages and a clipped, token-level surrogate.

Two pure-torch functions, each checkable line by line against its paper: ``group_advantages``, one scalar advantage
per episode from the rewards of its group (GRPO, Shao et al. 2024; Dr.GRPO, Liu et al. 2025; RLOO, Ahmadian et al.
2024), and ``policy_loss``, the PPO clipped surrogate with DAPO clip-higher (Yu et al. 2025), optional dual-clip (Ye
et al. 2020), k3 KL to a reference policy (Schulman 2020), truncated importance sampling for off-policy rollouts, and
a choice of token/sequence aggregation. Sign convention: the returned loss is *minimised*, so a token's
policy-gradient term is ``-A * ratio`` (clipped); a positive advantage pushes its tokens' log-probabilities up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from trialforge.train.settings import AdvantageMethod, LossConfig

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
ADVANTAGE_METHODS: tuple[str, ...] = get_args(AdvantageMethod)
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
MAX_LOG_RATIO = 20.0  # |logp - old_logp| is clamped here before exp, as verl does, so one bad token cannot overflow


@dataclass(frozen=True)
class LossVariant:
    """Variants of the surrogate beyond the knobs a run sets (``LossConfig``, params.yaml's ``train``): no run
    selects them, so a run's loss is the defaults, token-mean GRPO without KL."""

    dual_clip: float | None = None  # c > 1: for A < 0 the token loss is at most -c * A (dual-clip PPO)
    aggregation: Aggregation = "token-mean"
    norm_length: int | None = None  # seq-mean-token-sum-norm divisor (Dr.GRPO); None = mask width T
    kl_coef: float = 0.0  # weight of the k3 KL to ref_logprobs; 0 = off
    eps: float = 1e-6  # added to the group std (grpo)

    def __post_init__(self) -> None:
        problems = []
        if self.aggregation not in AGGREGATIONS:
            problems.append(f"aggregation={self.aggregation!r} is not one of {AGGREGATIONS}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            problems.append(f"dual_clip={self.dual_clip} must be > 1 (or None to disable)")
        if self.norm_length is not None and self.norm_length <= 0:
            problems.append(f"norm_length={self.norm_length} must be > 0 (or None for the mask width)")
        if self.kl_coef < 0:
            problems.append(f"kl_coef={self.kl_coef} must be >= 0")
        if problems:
            raise ValueError("invalid LossVariant: " + "; ".join(problems))


GRPO = LossVariant()


@dataclass(frozen=True)
class GroupStats:
    """What ``group_advantages`` saw. Only groups that are neither zero-variance nor undersized carry signal."""

    groups: int  # distinct group ids in the batch
    zero_variance_groups: int  # >= 2 valid members, all with the same reward: advantage 0
    undersized_groups: int  # < 2 valid members: no baseline, advantage 0
    invalid_episodes: int  # valid=False: excluded from every group statistic, advantage 0
    valid_episodes: int


@dataclass(frozen=True)
class LossStats:
    """Detached numbers for logging; each is aggregated over masked-in tokens."""

    loss: float  # pg_loss + kl_coef * kl
    pg_loss: float  # the (clipped, TIS-weighted) policy-gradient term, aggregated like the loss
    kl: float  # k3 KL to the reference policy, aggregated like the loss; 0 without ref_logprobs
    clip_fraction: float  # share of tokens where a clip (PPO or dual) replaced the unclipped term
    ratio_mean: float  # token mean of exp(logp - old_logp)
    tokens: int  # masked-in tokens


def group_advantages(
    rewards: Tensor, group_ids: Tensor, valid: Tensor, method: str, eps: float = 1e-6
) -> tuple[Tensor, GroupStats]:
    """One advantage per episode, relative to the other valid episodes of its group.

    With ``r`` the valid rewards of episode i's group, ``n = len(r)``, ``mean = r.mean()`` and
    ``std`` the *population* std ``sqrt(mean((r - mean)**2))`` (divisor n, not n - 1):

    * grpo:   ``A_i = (r_i - mean) / (std + eps)``
    * drgrpo: ``A_i = r_i - mean``  (Dr.GRPO drops the std, which up-weights easy and hard tasks)
    * rloo:   ``A_i = r_i - mean(r_j, j != i) = n / (n - 1) * (r_i - mean)``

    Invalid episodes (``valid=False``: the episode did not finish "ok") never enter ``mean``/``std`` and
    get ``A = 0``. Groups with fewer than 2 valid members, and groups whose valid rewards are all equal,
    get exactly ``A = 0``. Note: verl and TRL divide by ``torch.std`` (Bessel-corrected, divisor n - 1);
    for a group of n that is ``sqrt((n - 1) / n)`` times our advantage.

    Shapes: ``rewards`` float [B], ``group_ids`` integer [B], ``valid`` bool [B]. Returns advantages [B]
    (detached, dtype of ``rewards``) and a ``GroupStats``.
    """
    if method not in ADVANTAGE_METHODS:
        raise ValueError(f"advantage method {method!r} is not one of {ADVANTAGE_METHODS}")
    if not (rewards.dim() == 1 and rewards.shape == group_ids.shape == valid.shape):
        raise ValueError(
            f"rewards, group_ids and valid must all be 1-D of the same length [B]; got rewards "
            f"{tuple(rewards.shape)}, group_ids {tuple(group_ids.shape)}, valid {tuple(valid.shape)}"
        )
    if not rewards.is_floating_point() or valid.dtype != torch.bool:
        raise ValueError(f"rewards must be float and valid bool; got {rewards.dtype} and {valid.dtype}")

    rewards = rewards.detach()
    advantages = torch.zeros_like(rewards)
    zero_variance = undersized = 0
    group_list = group_ids.unique()
    for g in group_list:
        members = (group_ids == g) & valid
        r = rewards[members]
        n = r.numel()
        if n < 2:
            undersized += 1
            continue
        if bool(r.max() == r.min()):
            zero_variance += 1
            continue
        centred = r - r.mean()
        if method == "grpo":
            advantages[members] = centred / (r.std(correction=0) + eps)
        elif method == "drgrpo":
            advantages[members] = centred
        else:  # rloo
            advantages[members] = centred * n / (n - 1)
    n_valid = int(valid.sum())
    stats = GroupStats(len(group_list), zero_variance, undersized, len(valid) - n_valid, n_valid)
    return advantages, stats


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: LossConfig,
    ref_logprobs: Tensor | None = None,
    behaviour_logprobs: Tensor | None = None,
    variant: LossVariant = GRPO,
) -> tuple[Tensor, LossStats]:
    """The clipped GRPO-family surrogate, to be minimised. Per token t of sequence i, with ``A = A_i``:

        ratio = exp(logp - old_logp)
        pg    = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))    # = -min(rA, clip(r)A)
        pg    = min(pg, -c * A)                       where A < 0, if dual_clip c (Ye et al. 2020)
        pg    = pg * min(exp(old_logp - behaviour_logp), tis_cap)   (detached), if both are given
        kl    = exp(ref - logp) - (ref - logp) - 1                  (k3; >= 0), if ref_logprobs given
        loss  = aggregate(pg + kl_coef * kl)

    Clipping: a token with A > 0 and ratio > 1 + clip_high, or A < 0 and ratio < 1 - clip_low, takes the
    constant clipped value and passes no gradient. Dual-clip additionally caps the loss of A < 0 tokens
    whose ratio has grown past c, where the unbounded ``-A * ratio`` would otherwise dominate.

    Aggregation over masked-in tokens (m = mask):

    * token-mean:              ``sum(loss * m) / sum(m)``
    * seq-mean-token-mean:     mean over sequences with >= 1 token of ``sum_t(loss * m) / sum_t(m)``
    * seq-mean-token-sum-norm: ``mean_i(sum_t(loss * m) / norm_length)`` over all B sequences; norm_length
      defaults to the mask width T, a constant (Dr.GRPO), so long answers are not down-weighted.

    ``cfg`` gives clip_low, clip_high and tis_cap (a run's ``train`` section is one); ``variant`` dual_clip,
    kl_coef, aggregation and norm_length.

    Shapes: logprobs, old_logprobs, mask, ref_logprobs, behaviour_logprobs [B, T]; advantages [B].
    ``mask`` is 1 for policy-generated tokens and 0 for prompt, tool-output and padding tokens.
    """
    _check_shapes(logprobs, old_logprobs, advantages, mask, ref_logprobs, behaviour_logprobs)
    if variant.kl_coef > 0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={variant.kl_coef} needs ref_logprobs; pass them or set kl_coef=0")
    m = mask.to(logprobs.dtype)
    A = advantages.detach().to(logprobs.dtype)[:, None]

    ratio = torch.exp((logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    unclipped = -A * ratio
    clipped = -A * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    pg = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if variant.dual_clip is not None:
        dual = (A < 0) & (pg > -variant.dual_clip * A)
        pg = torch.where(dual, -variant.dual_clip * A, pg)
        was_clipped = was_clipped | dual
    if cfg.tis_cap is not None and behaviour_logprobs is not None:
        pg = pg * torch.exp(old_logprobs - behaviour_logprobs).clamp(max=cfg.tis_cap).detach()

    if ref_logprobs is not None:
        d = ref_logprobs - logprobs
        kl = torch.exp(d) - d - 1
    else:
        kl = torch.zeros_like(pg)

    def aggregate(x: Tensor) -> Tensor:
        per_seq = (x * m).sum(-1)
        if variant.aggregation == "token-mean":
            return per_seq.sum() / m.sum().clamp(min=1)
        if variant.aggregation == "seq-mean-token-mean":
            tokens = m.sum(-1)
            has = (tokens > 0).to(x.dtype)
            return (per_seq / tokens.clamp(min=1) * has).sum() / has.sum().clamp(min=1)
        return (per_seq / (variant.norm_length or m.shape[-1])).mean()  # seq-mean-token-sum-norm

    loss = aggregate(pg + variant.kl_coef * kl)

    with torch.no_grad():
        n_tokens = m.sum().clamp(min=1)
        stats = LossStats(
            loss=float(loss),
            pg_loss=float(aggregate(pg)),
            kl=float(aggregate(kl)),
            clip_fraction=float((was_clipped * m).sum() / n_tokens),
            ratio_mean=float((ratio * m).sum() / n_tokens),
            tokens=int(m.sum()),
        )
    return loss, stats


def _check_shapes(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Tensor | None,
    behaviour_logprobs: Tensor | None,
) -> None:
    """Raise ValueError naming every tensor whose shape disagrees with logprobs [B, T] / advantages [B]."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T] per-token log-probs; got shape {tuple(logprobs.shape)}")
    token_level: dict[str, Tensor | None] = {
        "old_logprobs": old_logprobs,
        "mask": mask,
        "ref_logprobs": ref_logprobs,
        "behaviour_logprobs": behaviour_logprobs,
    }
    wrong = [f"{k} {tuple(t.shape)}" for k, t in token_level.items() if t is not None and t.shape != logprobs.shape]
    if advantages.shape != logprobs.shape[:1]:
        wrong.append(f"advantages {tuple(advantages.shape)} (want [B] = {tuple(logprobs.shape[:1])})")
    if wrong:
        raise ValueError(f"shape mismatch with logprobs {tuple(logprobs.shape)}: " + ", ".join(wrong))
