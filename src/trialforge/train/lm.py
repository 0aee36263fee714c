"""GRPO-family updates of a transformers causal LM from the episodes of a local HF policy (``rollout.hf_policy``).

One ``update`` is one optimiser step over a batch: only ``ok`` episodes count; each becomes token sequences in which
generated tokens alone (mask 1) are scored, with its group's advantage (``group_advantages``) and log-probabilities
recomputed as the policy sampled them. Micro-batches accumulate the full batch's gradient, which is clipped, then the
optimiser steps and the version goes up by one. With ``lora`` (r > 0) peft adapters train on a frozen base, otherwise
every weight; rollouts sample with ``sampling_copy()``. ``save``/``load`` use Hugging Face checkpoints
(``train.hf_checkpoint``) from which a resumed run continues exactly.
Sequence layout and off-policy batches: docs/learning.md, "One update of the LM".
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from trialforge.errors import ConfigError
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EpisodeRecord
from trialforge.train import hf_checkpoint
from trialforge.train.device import TrainDevice, pick_device
from trialforge.train.loss import GRPO, LossVariant, group_advantages, policy_loss
from trialforge.train.settings import LoraParams, LossConfig


@dataclass(frozen=True)
class OptimConfig:
    """AdamW. The defaults are those of common GRPO recipes for LLMs."""

    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    eps: float = 1e-8


def with_lora(model: Any, spec: LoraParams) -> Any:
    """``model`` wrapped by peft with trainable LoRA adapters (``spec.r`` > 0) and every base weight frozen."""
    from peft import LoraConfig, get_peft_model
    from transformers.pytorch_utils import Conv1D

    targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    config = LoraConfig(
        task_type="CAUSAL_LM", r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=targets,
        fan_in_fan_out=any(isinstance(m, Conv1D) for m in model.modules()),  # GPT-2 stores its weights transposed
    )  # fmt: skip
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # e.g. a target module the model does not have
        raise ConfigError(f"cannot add LoRA adapters to {type(model).__name__}: {exc}") from exc


def is_peft(model: Any) -> bool:
    """Whether ``model`` is a peft model (without importing peft: a model built with it has imported it)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def _adapters(lora: LoraParams | None) -> LoraParams | None:
    """``lora`` when it asks for adapters; None for full fine-tuning (no spec, or rank 0)."""
    return lora if lora is not None and lora.r else None


def _check_lora(key: str, kind: str, model: Any, asked: LoraParams | None) -> None:
    """Refuse to resume checkpoint ``key`` with another LoRA setting than it was trained with."""
    saved = model.peft_config["default"] if kind == "lora" else None
    asked = _adapters(asked)
    if (saved is None) == (asked is None) and (
        saved is None or asked is None or (saved.r, saved.lora_alpha) == (asked.r, asked.alpha)
    ):
        return
    held = f"LoRA adapters of r={saved.r}, alpha={saved.lora_alpha}" if saved is not None else "a full model"
    wanted = f"LoRA of r={asked.r}, alpha={asked.alpha}" if asked is not None else "full fine-tuning (no LoRA)"
    raise ConfigError(
        f"checkpoint {key!r} holds {held}, but {wanted} was asked for: resume with the setting it was trained "
        "with, or start a new run"
    )


@dataclass(frozen=True)
class TokenSequence:
    """One training row: token ids, which of them the policy generated, and their recorded log-probs."""

    episode: int  # index of its episode in the batch
    ids: list[int]
    mask: list[int]  # 1 where the policy generated the token
    logprobs: list[float]  # behaviour log-prob where mask is 1, else 0
    temperatures: list[float]  # the sampling temperature of each generated token, 1 elsewhere


@dataclass(frozen=True)
class LMUpdateStats:
    policy_version: int  # the version after this update
    device: str
    episodes: int
    excluded_not_ok: int
    sequences: int
    micro_batches: int
    zero_variance_groups: int
    stale: bool  # the batch came from an older policy version
    loss: float
    pg_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    grad_norm: float  # before clipping
    tokens: int  # generated (trained-on) tokens
    forward_tokens: int  # every token passed through the model (padding excluded)
    seconds: float
    tokens_per_s: float  # forward_tokens / seconds: the update's throughput


def episode_sequences(ep: EpisodeRecord, index: int) -> list[TokenSequence]:
    """The token sequences of one episode (layout: docs/learning.md, "One update of the LM")."""
    rows: list[TokenSequence] = []
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    temps: list[float] = []
    for step in ep.step_rows:
        info = json.loads(step.info) if step.info else {}
        if "prompt_ids" not in info or "token_ids" not in info:
            raise ConfigError(
                f"episode {ep.episode_id} step {step.step} (policy {ep.policy!r}) has no prompt_ids/token_ids in "
                "its info: the LM trainer learns only from episodes of a local HF policy"
            )
        prompt, generated, lps = info["prompt_ids"], info["token_ids"], info["token_logprobs"]
        if len(lps) != len(generated):
            raise ConfigError(
                f"episode {ep.episode_id} step {step.step}: {len(generated)} token ids but {len(lps)} log-probs"
            )
        if prompt[: len(ids)] != ids:  # the context changed under the policy: score this step in its own
            rows.append(TokenSequence(index, ids, mask, logprobs, temps))
            ids, mask, logprobs, temps = [], [], [], []
        delta = prompt[len(ids) :]
        temperature = float(info.get("temperature") or 1.0)
        ids = ids + delta + generated
        mask = mask + [0] * len(delta) + [1] * len(generated)
        logprobs = logprobs + [0.0] * len(delta) + [float(x) for x in lps]
        temps = temps + [1.0] * len(delta) + [temperature] * len(generated)
    rows.append(TokenSequence(index, ids, mask, logprobs, temps))
    return [r for r in rows if any(r.mask[1:])]  # position 0 has no context to be scored in


@dataclass
class _MicroBatch:
    ids: Tensor  # [b, L] right-padded
    attention: Tensor  # [b, L]
    mask: Tensor  # [b, L - 1]: target t + 1 was generated
    old: Tensor  # [b, L - 1] recorded log-probs of the targets
    temps: Tensor  # [b, L - 1]
    advantages: Tensor  # [b]
    behaviour: Tensor | None = None  # [b, L - 1], set for stale batches under TIS


def _collate(rows: list[TokenSequence], advantages: Tensor, device: torch.device) -> _MicroBatch:
    width = max(len(r.ids) for r in rows)

    def pad(values: list[list[Any]], fill: float, dtype: torch.dtype) -> Tensor:
        return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=dtype, device=device)

    ids = pad([r.ids for r in rows], 0, torch.long)
    attention = pad([[1] * len(r.ids) for r in rows], 0, torch.long)
    mask = pad([r.mask for r in rows], 0, torch.float32)[:, 1:]
    old = pad([r.logprobs for r in rows], 0.0, torch.float32)[:, 1:]
    temps = pad([r.temperatures for r in rows], 1.0, torch.float32)[:, 1:]
    adv = torch.stack([advantages[r.episode] for r in rows]).to(device=device, dtype=torch.float32)
    return _MicroBatch(ids, attention, mask, old, temps, adv)


def _split(rows: list[TokenSequence], parts: int) -> list[list[TokenSequence]]:
    size = math.ceil(len(rows) / parts)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


class LMTrainer:
    """The model, its optimiser, the policy version and the data cursor; ``update`` is one GRPO step."""

    def __init__(
        self,
        model: Any,
        optim: OptimConfig | None = None,
        loss: LossConfig | None = None,
        device: TrainDevice | None = None,
        *,
        variant: LossVariant = GRPO,
        grad_accum_steps: int = 1,
        max_grad_norm: float | None = 1.0,
        gradient_checkpointing: bool = False,
        data_seed: int = 0,
        lora: LoraParams | None = None,
        base_model: str | None = None,
    ) -> None:
        """``model``: a transformers causal LM, or a local path to one (loaded with ``local_files_only``), or a
        peft model (its trainable parameters train). ``lora``: wrap ``model`` with these adapters (None or rank 0:
        train it as it is). ``variant``: the loss's variant (``train.loss.LossVariant``). ``base_model``: the base
        model's directory recorded in checkpoints (default: ``model``'s path, or its ``name_or_path``)."""
        if grad_accum_steps < 1:
            raise ConfigError(f"grad_accum_steps={grad_accum_steps} must be >= 1")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ConfigError(f"max_grad_norm={max_grad_norm} must be > 0 (or None to only measure the norm)")
        if isinstance(model, str | Path):
            from transformers import AutoModelForCausalLM

            base_model = base_model if base_model is not None else str(model)
            model = AutoModelForCausalLM.from_pretrained(str(model), local_files_only=True)
        self.base_model = base_model if base_model is not None else str(getattr(model, "name_or_path", "") or "")
        if (lora := _adapters(lora)) is not None:
            if is_peft(model):
                raise ConfigError("the model already has peft adapters: give lora=None to train them")
            model = with_lora(model, lora)
        self.device = device or pick_device()
        self.model = model.to(self.device.torch_device)
        if gradient_checkpointing:  # transformers 5 renamed it; older versions have only the old name
            model = self.model  # (a peft model passes these on to its base model)
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        self.optim_cfg = optim or OptimConfig()
        self.loss_cfg = loss or LossConfig()
        self.variant = variant
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],  # LoRA: the adapters alone
            lr=self.optim_cfg.lr,
            betas=self.optim_cfg.betas,
            weight_decay=self.optim_cfg.weight_decay,
            eps=self.optim_cfg.eps,
        )
        self.grad_accum_steps = grad_accum_steps
        self.max_grad_norm = max_grad_norm
        self.version = 0
        self.data_seed = data_seed
        self.cursor = 0  # batches drawn so far by next_batch

    @property
    def kind(self) -> hf_checkpoint.Kind:
        return "lora" if is_peft(self.model) else "full"

    # --- data ------------------------------------------------------------------------------------
    def next_batch(self, pool_size: int, batch_size: int) -> list[int]:
        """Indices of the next batch drawn from a pool of ``pool_size`` items (groups, tasks); advances the cursor.

        The draw depends only on ``data_seed`` and the cursor, both checkpointed, so a resumed run draws
        the batch the interrupted one would have drawn.
        """
        rng = random.Random(self.data_seed * 1_000_003 + self.cursor)
        self.cursor += 1
        return sorted(rng.sample(range(pool_size), min(batch_size, pool_size)))

    # --- the update ------------------------------------------------------------------------------
    def update(self, episodes: list[EpisodeRecord], behaviour_version: int | None = None) -> LMUpdateStats:
        """One optimiser step over ``episodes``; ``behaviour_version`` is the policy version that produced them."""
        start = time.perf_counter()
        valid = [ep.status == "ok" and ep.reward is not None for ep in episodes]
        kept = [ep for ep, ok in zip(episodes, valid, strict=True) if ok]
        group_index: dict[str, int] = {}
        groups = torch.tensor([group_index.setdefault(ep.group_id, len(group_index)) for ep in kept], dtype=torch.long)
        rewards = torch.tensor([float(ep.reward) for ep in kept], dtype=torch.float64)  # type: ignore[arg-type]
        advantages, group_stats = group_advantages(
            rewards, groups, torch.ones(len(kept), dtype=torch.bool), self.loss_cfg.advantage, self.variant.eps
        )
        rows = [row for i, ep in enumerate(kept) for row in episode_sequences(ep, i)]
        stale = behaviour_version is not None and behaviour_version < self.version
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals = self._accumulate(rows, advantages, stale) if rows else None
        grad_norm = self._clip_and_step() if rows else 0.0
        self.version += 1
        seconds = time.perf_counter() - start
        forward_tokens = sum(len(r.ids) for r in rows)
        t = totals or {}
        return LMUpdateStats(
            policy_version=self.version,
            device=self.device.describe(),
            episodes=len(episodes),
            excluded_not_ok=len(episodes) - len(kept),
            sequences=len(rows),
            micro_batches=len(_split(rows, self.grad_accum_steps)) if rows else 0,
            zero_variance_groups=group_stats.zero_variance_groups,
            stale=stale,
            loss=t.get("loss", 0.0),
            pg_loss=t.get("pg_loss", 0.0),
            kl=t.get("kl", 0.0),
            clip_fraction=t.get("clip_fraction", 0.0),
            ratio_mean=t.get("ratio_mean", 0.0),
            grad_norm=grad_norm,
            tokens=sum(sum(r.mask[1:]) for r in rows),
            forward_tokens=forward_tokens,
            seconds=seconds,
            tokens_per_s=forward_tokens / seconds if seconds > 0 else 0.0,
        )

    def token_logprobs(self, batch: _MicroBatch) -> Tensor:
        """[b, L - 1]: log-probability of token t + 1 given tokens <= t, at the token's sampling temperature."""
        with self.device.autocast():
            out = self.model(input_ids=batch.ids, attention_mask=batch.attention, use_cache=False)
        logits = out.logits[:, :-1].float() / batch.temps[..., None]
        return torch.log_softmax(logits, dim=-1).gather(-1, batch.ids[:, 1:, None]).squeeze(-1)

    def _accumulate(self, rows: list[TokenSequence], advantages: Tensor, stale: bool) -> dict[str, float]:
        """Forward and backward every micro-batch, each loss weighted by its share; return the batch's stats."""
        cfg, variant = self.loss_cfg, self.variant
        width = max(len(r.ids) for r in rows) - 1
        if variant.aggregation == "seq-mean-token-sum-norm" and variant.norm_length is None:
            variant = dataclasses.replace(variant, norm_length=width)  # one divisor for every micro-batch
        total_tokens = sum(sum(r.mask[1:]) for r in rows)  # a token at position 0 has no context to score it in
        total_seqs = len(rows)
        totals = dict.fromkeys(("loss", "pg_loss", "kl", "clip_fraction", "ratio_mean"), 0.0)
        for chunk in _split(rows, self.grad_accum_steps):
            batch = _collate(chunk, advantages, self.device.torch_device)
            if stale and cfg.tis_cap is not None:
                with torch.no_grad():
                    self.model.eval()
                    batch.behaviour, batch.old = batch.old, self.token_logprobs(batch)
                    self.model.train()
            loss, stats = policy_loss(
                self.token_logprobs(batch), batch.old, batch.advantages, batch.mask, cfg,
                behaviour_logprobs=batch.behaviour, variant=variant,
            )  # fmt: skip
            tokens = int(batch.mask.sum())
            share = tokens / total_tokens if variant.aggregation == "token-mean" else len(chunk) / total_seqs
            (loss * share).backward()
            for key in ("loss", "pg_loss", "kl"):
                totals[key] += getattr(stats, key) * share
            for key in ("clip_fraction", "ratio_mean"):
                totals[key] += getattr(stats, key) * tokens / total_tokens
        return totals

    def _clip_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm or math.inf)
        self.optimizer.step()
        return float(norm)

    def _frozen(self) -> set[str]:
        """Names of the parameters training never changes (LoRA: every base weight)."""
        return {name for name, p in self.model.named_parameters() if not p.requires_grad}

    def snapshot(self) -> dict[str, Tensor]:
        """A CPU copy of the weights for a rollout worker (``loop.staleness``), keyed as ``model.state_dict()``
        (it loads into a copy of ``model``); later updates leave it alone. Frozen weights (LoRA's base model)
        are shared, not copied: no update changes them."""
        frozen = self._frozen()
        return {k: v.detach().to("cpu", copy=k not in frozen) for k, v in self.model.state_dict().items()}

    def sampling_copy(self) -> Any:
        """The model for rollouts: a copy later updates leave alone (LoRA: the peft model, so what samples is
        what trains, its frozen base weights shared with the trainer's model rather than copied)."""
        shared = {id(p): p for p in self.model.parameters() if not p.requires_grad}
        return copy.deepcopy(self.model, memo=shared)

    # --- checkpoints -----------------------------------------------------------------------------
    def save(self, store: ObjectStore, key: str) -> hf_checkpoint.Manifest:
        """Write checkpoint ``key`` (``loop.records.checkpoint_key`` names it ``checkpoints/RUN/lm-vN.pt``; its
        objects live under ``checkpoints/RUN/lm-vN/``, layout in ``train.hf_checkpoint``)."""
        state = {
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "cursor": self.cursor,
            "data_seed": self.data_seed,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "python": random.getstate(),
            },
        }
        return hf_checkpoint.write_checkpoint(
            store, key, self.model, state, kind=self.kind, base_model=self.base_model, version=self.version
        )

    @classmethod
    def load(cls, store: ObjectStore, key: str, base: Any = None, **kwargs: Any) -> LMTrainer:
        """A trainer restored from checkpoint ``key``; ``kwargs`` as for the constructor, but ``lora`` only checks:
        the checkpoint says whether it holds adapters, and a ``lora`` that disagrees (a spec for a full
        checkpoint, None for a LoRA one) is refused.

        A full checkpoint is its own model. A LoRA checkpoint's adapters go on ``base``, the base model (an
        object, which they are injected into, or a local path; None: the directory its manifest names).
        Restores the process's torch and Python RNGs too, as a restarted run needs for its dropout and
        sampling to continue where the saved one left off.
        """
        asked = kwargs.pop("lora", ...)  # absent: whatever the checkpoint holds
        with hf_checkpoint.downloaded(store, key) as (manifest, root):
            model = hf_checkpoint.load_model(root / hf_checkpoint.MODEL_DIR, manifest, base)
            if asked is not ...:
                _check_lora(key, manifest.kind, model, asked)
            state = torch.load(root / hf_checkpoint.TRAINER_STATE, weights_only=True, map_location="cpu")
        if isinstance(base, str | Path):
            kwargs.setdefault("base_model", str(base))
        kwargs.setdefault("base_model", manifest.base_model)
        trainer = cls(model, data_seed=state["data_seed"], **kwargs)
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.version = state["version"]
        trainer.cursor = state["cursor"]
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        random.setstate(state["rng"]["python"])
        return trainer
