"""The training side's settings (``train`` in params.yaml): the learner, its optimisation, LoRA, and where its
rollouts sample. ``Params`` embeds ``TrainParams`` as is; the modules of ``train`` read it directly."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trialforge.rollout.repair import RepairPolicy
from trialforge.section import Section

LM_MAX_LR = 1e-2


class LoraParams(Section):
    """LoRA adapters (peft) for the LM learner instead of full fine-tuning (``train.lm.LMTrainer``'s ``lora``): the
    update is ``alpha / r * B @ A`` beside each frozen weight."""

    r: int = Field(0, ge=0)  # adapter rank; 0: no adapters, every weight trains (full fine-tuning)
    alpha: int = Field(32, ge=1)  # the adapters' update is scaled by alpha / r
    dropout: float = Field(0.0, ge=0.0, lt=1.0)  # on the adapters' input while training (never while sampling)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"  # module names, or every linear layer but the head

    @field_validator("target_modules", mode="before")
    @classmethod
    def _targets(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "all-linear":
            raise ValueError(
                f"{value!r} is neither 'all-linear' nor a list: give module names as a list, e.g. [q_proj, v_proj]"
            )
        if isinstance(value, list):
            if not value:
                raise ValueError("an empty list adapts nothing: name modules, e.g. [q_proj, v_proj], or 'all-linear'")
            bad = [v for v in value if not isinstance(v, str) or not v.strip()]
            if bad:
                raise ValueError(f"module names must be non-empty strings, not {bad}")
            if len(set(value)) != len(value):
                raise ValueError(f"{value} names a module more than once")
        return value


class InferenceParams(Section):
    """Where the LM learner's rollouts sample (``trialforge.inference``): in the rollout's own process, or an
    OpenAI-compatible server (vLLM, SGLang, ``trialforge serve lm``) that gets each new version's weights."""

    url: str = ""  # the server's API root, e.g. http://127.0.0.1:8000/v1; "": sample in process (transformers)
    # Starts that server for the run (an argument list, split like a shell but run without one); trialforge waits
    # until it answers at `url`, restarts it if it dies and stops it at the end. {model} is replaced by the
    # weights to serve: train.model, or after a restart the latest full-weight version; {name} by model_name (or
    # train.model), the name to serve them under. "": the server is yours.
    command: str = ""
    api: Literal["vllm", "sglang"] = "vllm"  # how weights reach it: vllm loads LoRA adapters at run time,
    # sglang replaces the full weights in place (/update_weights_from_disk)
    model_name: str = ""  # the name the server serves train.model under; "": train.model as given (vLLM's default)
    api_key_env: str = ""  # the variable holding the server's key (vLLM's --api-key); "": no Authorization header
    weights_dir: str = ""  # where each version is written for the server to read; "": OUT_DIR/served-weights
    ready_timeout_s: float = Field(600.0, gt=0)  # a started server must answer within this
    max_restarts: int = Field(3, ge=0)  # a started server that dies more often than this stays down
    timeout_s: float = Field(300.0, gt=0)  # per request
    max_retries: int = Field(6, ge=0)  # per request, on transport errors, 429 and 5xx: a restart fits in them

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// URL, not {url!r}")
        return url.rstrip("/")

    def api_key(self) -> str:
        """The server's key, read from ``api_key_env`` where the run starts ("": none)."""
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""

    def headers(self) -> dict[str, str]:
        key = self.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    @model_validator(mode="after")
    def _started_at_url(self) -> InferenceParams:
        if self.command and not self.url:
            raise ValueError("a command starts a server, but url (where it will answer) is empty: set both")
        if self.command and self.api == "sglang" and "{name}" not in self.command:
            raise ValueError(
                "a server restarted with api sglang starts from the latest weights' directory, so its command must "
                "name what to serve them under: add --served-model-name {name}"
            )
        return self


LM = "lm"  # the policy name of a language-model learner's episodes


AdvantageMethod = Literal["grpo", "drgrpo", "rloo"]


class LossConfig(Section):
    """The loss's knobs a run sets (``train.loss.policy_loss``; the variants no run selects are its
    ``LossVariant``). Defaults: GRPO with DAPO clip-higher, a stale batch's importance weights capped at 2."""

    advantage: AdvantageMethod = "grpo"
    clip_low: float = Field(0.2, ge=0, lt=1)  # the ratio is clipped below at 1 - clip_low
    clip_high: float = Field(0.28, ge=0)  # ... and above at 1 + clip_high (DAPO clip-higher)
    # truncated importance sampling cap on exp(old - behaviour) for a stale batch (LM); None: off
    tis_cap: float | None = Field(2.0, gt=0)


class TrainParams(LossConfig):
    """``train`` in params.yaml: the learner, its optimisation and loss (``LossConfig``), LoRA, and where its
    rollouts sample."""

    iterations: int = Field(1, ge=1)
    lr: float = 0.05
    # advantage, clip_low, clip_high, tis_cap: ``LossConfig``
    epochs: int = Field(4, ge=1)
    # The repair policy's optimiser. Adam's first step moves every weight by the learning rate whatever its
    # gradient (sign descent): a few groups then set every edit kind's weight as firmly as the evidence-backed
    # ones. SGD's step follows the gradient's size. (An LM always trains with AdamW.)
    optimizer: Literal["adam", "sgd"] = "adam"
    max_staleness: int = Field(0, ge=0)  # rollouts may run this many policy versions ahead of the update (0: in step)
    model: str = ""  # a local transformers causal LM directory to train (policy `lm`); "": the demo's `repair`
    grad_accum_steps: int = Field(1, ge=1)  # micro-batches per update (LM)
    max_grad_norm: float = Field(1.0, gt=0)  # gradient clipping (LM)
    gradient_checkpointing: bool = False  # trade compute for activation memory (LM)
    lora: LoraParams = LoraParams()  # LM: LoRA adapters (r > 0) or full fine-tuning (r = 0)
    inference: InferenceParams = InferenceParams()  # LM: where its rollouts sample

    @model_validator(mode="after")
    def _served(self) -> TrainParams:
        served = self.inference
        if not served.url:
            return self
        if not self.model:
            raise ValueError("train.inference.url serves the LM learner, but train.model is empty: set train.model")
        if served.api == "vllm" and not self.lora.r:
            raise ValueError(
                "train.inference.api vllm takes new weights over HTTP only as LoRA adapters (/v1/load_lora_adapter): "
                "set train.lora.r, or api: sglang to replace full weights (/update_weights_from_disk)"
            )
        if served.api == "sglang" and self.lora.r:
            raise ValueError("train.inference.api sglang replaces full weights: set train.lora.r to 0, or api: vllm")
        if served.api == "sglang" and self.max_staleness:
            raise ValueError(
                "train.inference.api sglang replaces the weights in place, so a rollout of an older version still "
                "running would sample from the new ones: set train.max_staleness to 0, or use LoRA (api: vllm), "
                "where every version is an adapter of its own"
            )
        return self

    @model_validator(mode="after")
    def _lm_rate(self) -> TrainParams:
        if self.model and self.lr > LM_MAX_LR:
            raise ValueError(
                f"train.lr={self.lr:g} is a rate for the demo's 21-weight repair policy; one step of it would wreck "
                f"a language model: set train.lr with train.model (at most {LM_MAX_LR:g}; GRPO recipes use ~1e-6)"
            )
        if self.lora.r and not self.model:
            raise ValueError(
                f"train.lora.r={self.lora.r} adds LoRA adapters to a language model, but train.model is empty (the "
                "demo's repair policy has no layers to adapt): set train.model, or train.lora.r to 0"
            )
        return self

    @property
    def learner(self) -> str:
        """The policy name of the learner's episodes: a language model's (``train.model``), or the repair policy's."""
        return LM if self.model else RepairPolicy.name
