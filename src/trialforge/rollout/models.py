"""Language-model policies named in params (``rollout.models``): any OpenAI-compatible endpoint (vLLM,
SGLang, a hosted API) or a local transformers model, rolled out beside the scripted policies.

They are fixed policies, measured and never trained (the learner is ``train.model``'s, or the demo's
``repair``). A name defined here is listed in ``rollout.policies`` like ``gold``; its episodes carry that
name, and as version the endpoint's model name or the local model's path. Each runs
``rollout.reference_group_size`` episodes per task, in the round of the scripted policies.

Params hold no secret: an endpoint's key is read from the environment variable ``api_key_env`` names,
where the run starts (and where each worker runs).
"""

from __future__ import annotations

import os
import threading
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trialforge.errors import ConfigError
from trialforge.rollout.context import ContextParams
from trialforge.rollout.policies import Policy


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = Field(None, ge=0.0)  # None: rollout.temperature (0: greedy)


class OpenAIModel(_Spec):
    kind: Literal["openai"]
    base_url: str  # the API root, e.g. http://127.0.0.1:8000/v1 (``/chat/completions`` is appended)
    model: str  # the model name the server knows
    api_key_env: str = "OPENAI_API_KEY"  # the variable holding the key; unset or empty: no Authorization header
    max_tokens: int | None = Field(None, ge=1)  # per reply; None: rollout.max_new_tokens
    logprobs: bool = True  # ask for the sampled tokens' log-probabilities (off for an endpoint that refuses it)
    context_tokens: int | None = Field(None, ge=2)  # None: rollout.context.tokens, else the server's max_model_len
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(4, ge=0)  # on connection errors, timeouts, 429 and 5xx

    @field_validator("base_url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, not {url!r}")
        return url


class TransformersModel(_Spec):
    kind: Literal["transformers"]
    model: str  # a local directory written by save_pretrained (model and tokenizer); never downloaded
    device: str = "auto"  # auto: cuda when torch sees a GPU, else cpu; or cpu, cuda, cuda:N
    max_new_tokens: int | None = Field(None, ge=1)  # per reply; None: rollout.max_new_tokens
    context_tokens: int | None = Field(None, ge=2)  # None: rollout.context.tokens, else max_position_embeddings


ModelSpec = Annotated[OpenAIModel | TransformersModel, Field(discriminator="kind")]


def model_policy(
    name: str, spec: OpenAIModel | TransformersModel, temperature: float, max_new_tokens: int, context: ContextParams
) -> Policy:
    """The policy ``spec`` describes, under ``name``, keeping ``context`` (``rollout.context``); one per process for
    equal arguments (a local model loads once for all the shards a worker runs)."""
    key = (name, spec.model_dump_json(), temperature, max_new_tokens, context.model_dump_json())
    with _lock:
        if key not in _built:
            _built[key] = _build(name, spec, temperature, max_new_tokens, context)
        return _built[key]


_built: dict[tuple[str, str, float, int, str], Policy] = {}
_lock = threading.Lock()


def _build(
    name: str, spec: OpenAIModel | TransformersModel, temperature: float, max_new_tokens: int, context: ContextParams
) -> Policy:
    temperature = spec.temperature if spec.temperature is not None else temperature
    if isinstance(spec, OpenAIModel):
        from trialforge.rollout.openai_policy import OpenAIPolicy

        return OpenAIPolicy(
            spec.base_url,
            spec.model,
            os.environ.get(spec.api_key_env, ""),
            timeout_s=spec.timeout_s,
            max_retries=spec.max_retries,
            temperature=temperature,
            max_tokens=spec.max_tokens or max_new_tokens,
            logprobs=spec.logprobs,
            context_tokens=spec.context_tokens,
            context=context,
            name=name,
        )
    if not os.path.isdir(spec.model):
        raise ConfigError(f"rollout.models.{name}.model: {spec.model!r} is not a directory (a save_pretrained model)")
    import torch

    from trialforge.rollout.hf_policy import HFPolicy

    device = spec.device if spec.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"rollout.models.{name}.device is {device!r}, but torch sees no GPU here (auto: one if any)")
    return HFPolicy(
        spec.model,
        max_new_tokens=spec.max_new_tokens or max_new_tokens,
        temperature=temperature,
        device=device,
        context_tokens=spec.context_tokens,
        context=context,
        name=name,
    )
