"""The policy the train step updates, behind one interface: the embedded demo's repair policy or a transformers LM.

``train.model`` chooses: empty for the demo's repair policy (``rollout.repair``, trained by ``train.repair_trainer``),
or a local transformers causal-LM directory (rolled out by ``rollout.hf_policy``, trained by ``train.lm``). Either
way the learner's episodes carry its name as their policy (``repair`` or ``lm``) and its version ``vN`` after N
updates, and every update writes the checkpoint ``checkpoints/RUN/NAME-vN.pt`` (for the LM, the Hugging Face directory
``checkpoints/RUN/lm-vN/``) from which any process loads the policy. ``rollout_policy`` is what a rollout samples the
learner with: an inference server given each version's weights (``train.inference.url``, ``train.served``), else the
learner itself in the rollout's process. Why and how: docs/learning.md, "The learner".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from trialforge.config import Params
from trialforge.rollout.policies import Policy
from trialforge.rollout.repair import RepairPolicy
from trialforge.store.objstore import ObjectStore
from trialforge.store.records import EpisodeRecord
from trialforge.train.repair_trainer import RepairTrainer
from trialforge.train.settings import LM


class Learner(Protocol):
    name: str  # the policy name of its episodes

    @property
    def version(self) -> int: ...  # updates taken

    def policy(self) -> Policy:
        """The current weights as a rollout policy: a snapshot later updates leave alone."""
        ...

    def update(self, episodes: list[EpisodeRecord], behaviour_version: int | None) -> dict[str, Any]:
        """One GRPO-family step; ``behaviour_version`` is the version that produced ``episodes``."""
        ...

    def save(self, store: ObjectStore, key: str) -> None: ...


def rollout_policy(params: Params, store: ObjectStore, checkpoint: str | None) -> Policy:
    """The learner as of ``checkpoint`` (None: its initial weights) as a rollout policy."""
    if params.train.inference.url:
        from trialforge.train.served import served_policy

        rp = params.rollout
        return served_policy(
            params.train, store, checkpoint, LM, out_dir=params.run.out_dir, temperature=rp.temperature,
            max_new_tokens=rp.max_new_tokens, context=rp.context,
        )  # fmt: skip
    return open_learner(params, store, checkpoint).policy()


def open_learner(params: Params, store: ObjectStore, checkpoint: str | None) -> Learner:
    """The learner of ``params``, from ``checkpoint`` (None: its initial weights)."""
    if params.train.model:
        return LMLearner(params, store, checkpoint)
    tp = params.train
    trainer = RepairTrainer.load(tp, store, checkpoint) if checkpoint else RepairTrainer(tp)
    return RepairLearner(trainer)


class RepairLearner:
    name = RepairPolicy.name

    def __init__(self, trainer: RepairTrainer) -> None:
        self.trainer = trainer

    @property
    def version(self) -> int:
        return self.trainer.version

    def policy(self) -> Policy:
        return self.trainer.policy()

    def update(self, episodes: list[EpisodeRecord], behaviour_version: int | None) -> dict[str, Any]:
        return vars(self.trainer.update(episodes))  # the recorded log-probabilities serve as the old ones

    def save(self, store: ObjectStore, key: str) -> None:
        self.trainer.save(store, key)


class LMLearner:
    name = LM

    def __init__(self, params: Params, store: ObjectStore, checkpoint: str | None) -> None:
        from trialforge.train.lm import LMTrainer, OptimConfig

        tp = params.train
        knobs: dict[str, Any] = {
            "optim": OptimConfig(lr=tp.lr),
            "loss": tp,  # the train section is the loss's config
            "grad_accum_steps": tp.grad_accum_steps,
            "max_grad_norm": tp.max_grad_norm,
            "gradient_checkpointing": tp.gradient_checkpointing,
            "lora": tp.lora,  # rank 0: full fine-tuning
        }
        if checkpoint:
            self.trainer = LMTrainer.load(store, checkpoint, tp.model, **knobs)  # its data seed is saved
        else:
            self.trainer = LMTrainer(tp.model, data_seed=params.run.seed, **knobs)
        self.params = params

    @property
    def version(self) -> int:
        return self.trainer.version

    def policy(self) -> Policy:
        from trialforge.rollout.hf_policy import HFPolicy

        rp = self.params.rollout
        model = self.trainer.sampling_copy()  # sampling never sees a half-done update
        return HFPolicy(
            model,
            self.params.train.model,
            device=str(self.trainer.device.torch_device),
            max_new_tokens=rp.max_new_tokens,
            temperature=rp.temperature,
            context=rp.context,
            name=LM,
            version=f"v{self.version}",
        )

    def update(self, episodes: list[EpisodeRecord], behaviour_version: int | None) -> dict[str, Any]:
        return dataclasses.asdict(self.trainer.update(episodes, behaviour_version=behaviour_version))

    def save(self, store: ObjectStore, key: str) -> None:
        self.trainer.save(store, key)
