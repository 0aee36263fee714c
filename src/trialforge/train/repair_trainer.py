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

from trialforge.config import TrainParams
from trialforge.rollout.records import EpisodeRecord
from trialforge.rollout.repair import N_FEATURES, RepairPolicy
from trialforge.store.objstore import ObjectStore
from trialforge.train.loss import LossConfig, group_advantages, policy_loss


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
    features: list[torch.Tensor]  # per episode: [candidates, N_FEATURES]; empty when it made no decision
    chosen: torch.Tensor
    old_logprobs: torch.Tensor
    rewards: torch.Tensor
    groups: torch.Tensor
    valid: torch.Tensor
    decided: torch.Tensor


def _batch(episodes: list[EpisodeRecord]) -> _Batch:
    group_index: dict[str, int] = {}
    feats, chosen, old, rewards, groups, valid, decided = [], [], [], [], [], [], []
    for ep in episodes:
        decision = next((s for s in ep.step_rows if s.logprob is not None), None)
        info = json.loads(decision.info) if decision else {}
        feats.append(torch.tensor(info.get("features", []), dtype=torch.float64).reshape(-1, N_FEATURES))
        chosen.append(int(info.get("chosen", 0)))
        old.append(decision.logprob if decision else 0.0)
        ok = ep.status == "ok" and ep.reward is not None
        rewards.append(ep.reward if ok else 0.0)
        groups.append(group_index.setdefault(ep.group_id, len(group_index)))
        valid.append(ok)
        decided.append(decision is not None)
    return _Batch(
        feats,
        torch.tensor(chosen),
        torch.tensor(old, dtype=torch.float64),
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(groups),
        torch.tensor(valid),
        torch.tensor(decided),
    )


class RepairTrainer:
    """Holds the weights and the optimiser; ``update`` is one GRPO step over a rollout batch."""

    def __init__(self, params: TrainParams, weights: list[float] | None = None, version: int = 0) -> None:
        self.params = params
        init = torch.tensor(weights if weights is not None else [0.0] * N_FEATURES, dtype=torch.float64)
        self.weights = torch.nn.Parameter(init)
        self.optimizer = torch.optim.Adam([self.weights], lr=params.lr)
        self.version = version
        self.loss_cfg = LossConfig(advantage=params.advantage, clip_low=params.clip_low, clip_high=params.clip_high)

    def policy(self) -> RepairPolicy:
        return RepairPolicy(self.weights.detach().tolist(), version=f"v{self.version}")

    def update(self, episodes: list[EpisodeRecord]) -> UpdateStats:
        batch = _batch(episodes)
        advantages, groups = group_advantages(batch.rewards, batch.groups, batch.valid, self.params.advantage)
        mask = (batch.valid & batch.decided).to(torch.float64)[:, None]
        last = None
        for _ in range(self.params.epochs):
            logprobs = torch.stack([self._logprob(f, c) for f, c in zip(batch.features, batch.chosen, strict=True)])
            loss, last = policy_loss(logprobs[:, None], batch.old_logprobs[:, None], advantages, mask, self.loss_cfg)
            if mask.sum() == 0 or not loss.requires_grad:
                break
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        self.version += 1
        valid_rewards = batch.rewards[batch.valid]
        return UpdateStats(
            policy_version=f"v{self.version}",
            episodes=len(episodes),
            trained_on=int(((advantages != 0) & (mask[:, 0] > 0)).sum()),
            zero_variance_groups=groups.zero_variance_groups,
            excluded_not_ok=int((~batch.valid).sum()),
            loss=float(last.loss) if last else 0.0,
            clip_fraction=float(last.clip_fraction) if last else 0.0,
            mean_reward=float(valid_rewards.mean()) if len(valid_rewards) else 0.0,
        )

    def _logprob(self, features: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        if features.shape[0] == 0:
            return self.weights.sum() * 0.0  # no decision: masked out, but keeps the graph uniform
        return torch.log_softmax(features @ self.weights, dim=0)[chosen]

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
