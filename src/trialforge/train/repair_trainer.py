"""GRPO updates of the demo's repair policy, checkpointed to the object store.

Each episode of the repair policy made one sampled decision (which candidate
edit to apply); its log-probability under the current weights is the single
"token" of the sequence, so the GRPO-family loss applies unchanged.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import torch

from trialforge.rollout.repair import RepairPolicy
from trialforge.rollout.repair_edits import N_FEATURES
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EpisodeRecord
from trialforge.train.loss import group_advantages, policy_loss
from trialforge.train.settings import TrainParams


@dataclass
class UpdateStats:
    policy_version: str
    episodes: int
    trained_on: int
    zero_variance_groups: int
    excluded_not_ok: int
    loss: float
    clip_fraction: float
    mean_reward: float


@dataclass
class _Batch:
    decisions: list[list[tuple[torch.Tensor, int]]]  # per episode: (candidate features, chosen index) per edit
    old_logprobs: torch.Tensor  # [B, T], T = most decisions in one episode
    mask: torch.Tensor  # [B, T]: a real decision of an ok episode
    rewards: torch.Tensor
    groups: torch.Tensor
    valid: torch.Tensor


def _batch(episodes: list[EpisodeRecord]) -> _Batch:
    group_index: dict[str, int] = {}
    decisions, rewards, groups, valid = [], [], [], []
    for ep in episodes:
        steps = [(s, json.loads(s.info)) for s in ep.step_rows if s.logprob is not None]
        decisions.append(
            [(torch.tensor(info["features"], dtype=torch.float64), int(info["chosen"]), s.logprob) for s, info in steps]
        )
        ok = ep.status == "ok" and ep.reward is not None
        rewards.append(ep.reward if ok else 0.0)
        groups.append(group_index.setdefault(ep.group_id, len(group_index)))
        valid.append(ok)
    width = max((len(d) for d in decisions), default=0) or 1
    old = torch.zeros(len(episodes), width, dtype=torch.float64)
    mask = torch.zeros(len(episodes), width, dtype=torch.float64)
    for i, episode in enumerate(decisions):
        for t, (_, _, logprob) in enumerate(episode):
            old[i, t] = logprob
            mask[i, t] = float(valid[i])
    return _Batch(
        [[(f, c) for f, c, _ in d] for d in decisions],
        old,
        mask,
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(groups, dtype=torch.long),
        torch.tensor(valid, dtype=torch.bool),
    )


class RepairTrainer:
    """Holds the weights and the optimiser; ``update`` is one GRPO step over a rollout batch."""

    def __init__(self, params: TrainParams, weights: list[float] | None = None, version: int = 0) -> None:
        self.params = params
        init = torch.tensor(weights if weights is not None else [0.0] * N_FEATURES, dtype=torch.float64)
        self.weights = torch.nn.Parameter(init)
        self.optimizer = (
            torch.optim.SGD([self.weights], lr=params.lr)
            if params.optimizer == "sgd"
            else torch.optim.Adam([self.weights], lr=params.lr)
        )
        self.version = version

    def policy(self) -> RepairPolicy:
        return RepairPolicy(self.weights.detach().tolist(), version=f"v{self.version}")

    def update(self, episodes: list[EpisodeRecord]) -> UpdateStats:
        batch = _batch(episodes)
        advantages, groups = group_advantages(batch.rewards, batch.groups, batch.valid, self.params.advantage)
        stats = None
        for _ in range(self.params.epochs):
            loss, stats = policy_loss(self._logprobs(batch), batch.old_logprobs, advantages, batch.mask, self.params)
            if batch.mask.sum() == 0:
                break
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        self.version += 1
        valid_rewards = batch.rewards[batch.valid]
        return UpdateStats(
            policy_version=f"v{self.version}",
            episodes=len(episodes),
            trained_on=int(((advantages != 0) & (batch.mask.sum(-1) > 0)).sum()),
            zero_variance_groups=groups.zero_variance_groups,
            excluded_not_ok=int((~batch.valid).sum()),
            loss=stats.loss if stats else 0.0,
            clip_fraction=stats.clip_fraction if stats else 0.0,
            mean_reward=float(valid_rewards.mean()) if len(valid_rewards) else 0.0,
        )

    def _logprobs(self, batch: _Batch) -> torch.Tensor:
        """Log-probability of every recorded decision under the current weights ([B, T], 0 where padded)."""
        rows = []
        width = batch.mask.shape[1]
        for episode in batch.decisions:
            row = [torch.log_softmax(f @ self.weights, dim=0)[c] for f, c in episode]
            row += [self.weights.sum() * 0.0] * (width - len(row))  # padding keeps the graph uniform
            rows.append(torch.stack(row))
        return torch.stack(rows) if rows else torch.zeros(0, width, dtype=torch.float64)

    # --- checkpoints -----------------------------------------------------------------
    def save(self, store: ObjectStore, key: str) -> None:
        buf = io.BytesIO()
        state = {"weights": self.weights.detach(), "optimizer": self.optimizer.state_dict(), "version": self.version}
        torch.save(state, buf)
        store.put_bytes(key, buf.getvalue())

    @classmethod
    def load(cls, params: TrainParams, store: ObjectStore, key: str) -> RepairTrainer:
        state = torch.load(io.BytesIO(store.get_bytes(key)), weights_only=True)
        trainer = cls(params, state["weights"].tolist(), state["version"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        return trainer
