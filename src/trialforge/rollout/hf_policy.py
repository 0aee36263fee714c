"""A policy run by a local causal language model (transformers, or any torch module with the same call).

The model must accept ``model(input_ids=..., past_key_values=..., use_cache=True)`` and return an object with
``.logits`` and ``.past_key_values``, as transformers' causal LMs do; a model or tokenizer given as a path is loaded
from local files only. Sampling is our own loop, seeded per episode and turn, recording the exact log-probability
each token was drawn from; the step's ``info`` keeps token ids, log-probabilities and entropy. Prompt formats and
why our own sampler: docs/rollouts.md, "Model policies".
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from trialforge.errors import ConfigError, PolicyError
from trialforge.rollout.chat import Conversation, system_prompt
from trialforge.rollout.context import ContextParams, plan
from trialforge.rollout.env import TOOLS
from trialforge.rollout.policies import Decision, TaskView


class HFPolicy:
    """One model and tokenizer shared by every episode (inference only, safe across threads)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        device: str = "cpu",
        context_tokens: int | None = None,
        context: ContextParams | None = None,
        system: str | None = None,
        name: str = "hf",
        version: str | None = None,
    ) -> None:
        """``model`` and ``tokenizer`` are objects or local paths (the tokenizer defaults to the model's path).

        ``context_tokens`` (else ``context.tokens``, else the model's ``max_position_embeddings``) is the window
        each turn's prompt and reply must fit, kept by ``context``'s strategy (``rollout.context``). ``system``
        replaces the default instructions (which list the tools and the JSON reply format). ``version`` defaults to
        the model's path.
        """
        path = str(model) if isinstance(model, str | Path) else None
        if path is not None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        if tokenizer is None and path is None:
            raise ConfigError("HFPolicy needs a tokenizer when the model is given as an object")
        if tokenizer is None or isinstance(tokenizer, str | Path):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or path), local_files_only=True)
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.native_tools = _renders_tools(tokenizer)
        self.system = system if system is not None else system_prompt(native_tools=self.native_tools)
        self.name = name
        self.version = version or path or getattr(model, "name_or_path", "") or "local"
        self.stop_ids = _stop_ids(model, tokenizer)
        self.context = context or ContextParams()
        limit = context_tokens or self.context.tokens or getattr(model.config, "max_position_embeddings", None)
        if not limit or limit <= max_new_tokens:
            raise ConfigError(
                f"context of {limit} tokens leaves no room for the prompt and {max_new_tokens} new tokens"
            )
        self.context_tokens = limit

    def begin(self, view: TaskView, seed: int) -> HFEpisode:
        return HFEpisode(self, seed)

    def encode(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = TOOLS) -> list[int]:
        """The prompt for the next reply: the tokenizer's chat template if it has one (given ``tools`` when it
        renders them), else a plain one. A template that does not render tools never sees them: the caller
        describes them in the messages (as ``system_prompt`` does)."""
        tok = self.tokenizer
        if self.native_tools:
            text = tok.apply_chat_template(_for_template(messages), tools=tools or None, add_generation_prompt=True,
                                           tokenize=False)  # fmt: skip
        elif getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            end = tok.eos_token or ""
            text = "".join(
                f"<|{m['role']}|>\n{m['content']}{end if m['role'] == 'assistant' else ''}\n" for m in messages
            )
            text += "<|assistant|>\n"
        return list(tok.encode(text, add_special_tokens=False))

    @torch.inference_mode()
    def draw(
        self,
        prompt_ids: list[int],
        generator: torch.Generator,
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
    ) -> tuple[list[int], list[float], float]:
        """Sample up to ``max_new_tokens`` tokens (to a stop token); return them, their log-probabilities and the
        mean entropy (nats) over the sampled tokens of the distribution each came from.

        That is ``log_softmax(logits / temperature)``, or at temperature 0 the model's own ``log_softmax(logits)``:
        the distribution whose log-probabilities are recorded. ``max_new_tokens`` and ``temperature`` default to
        the policy's; given here, they hold for this call alone (concurrent callers may each ask their own).
        """
        limit = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        temperature = self.temperature if temperature is None else temperature
        inputs = torch.tensor([prompt_ids], device=self.device)
        past = None
        ids: list[int] = []
        logprobs: list[float] = []
        entropies: list[torch.Tensor] = []
        for _ in range(limit):
            out = self.model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(logp.exp(), 1, generator=generator))
            else:
                logp = torch.log_softmax(logits, dim=-1)
                token = int(logp.argmax())
            ids.append(token)
            logprobs.append(float(logp[token]))
            entropies.append(torch.special.entr(logp.exp()).sum())  # -sum p log p; a token of p = 0 adds 0
            if token in self.stop_ids:
                break
            inputs = torch.tensor([[token]], device=self.device)
        entropy = float(torch.stack(entropies).mean()) if entropies else 0.0
        return ids, logprobs, entropy


class HFEpisode:
    def __init__(self, policy: HFPolicy, seed: int) -> None:
        self.policy = policy
        self.seed = seed
        self.turn = 0
        self.conversation = Conversation(policy.system, native_tools=policy.native_tools)

    def act(self, observation: str) -> Decision:
        policy = self.policy
        self.conversation.observe(observation)
        turn = plan(self.conversation.messages, lambda m: len(policy.encode(m)), policy.context_tokens,
                    policy.max_new_tokens, policy.context)  # fmt: skip
        prompt_ids = policy.encode(turn.messages)
        generator = torch.Generator(device=policy.device)
        generator.manual_seed((self.seed * 1_000_003 + self.turn) % 2**63)
        self.turn += 1
        ids, logprobs, entropy = policy.draw(prompt_ids, generator, max_new_tokens=turn.max_tokens)
        text = policy.tokenizer.decode([i for i in ids if i not in policy.stop_ids], skip_special_tokens=True)
        action = self.conversation.reply_text(text, call_id=f"call_{self.turn}")
        total = math.fsum(logprobs)
        if not math.isfinite(total):
            raise PolicyError(f"the model produced a non-finite log-probability ({total}) at turn {self.turn}")
        return Decision(
            action=action,
            logprob=total,
            tokens_in=len(prompt_ids),
            tokens_out=len(ids),
            info={
                "text": text,
                "prompt_ids": prompt_ids,
                "token_ids": ids,
                "token_logprobs": logprobs,
                "entropy": entropy,  # mean per-token entropy (nats) of the sampling distribution
                "temperature": policy.temperature,
                "dropped_turns": turn.dropped_turns,
                "max_tokens": turn.max_tokens,
            },
        )


def _renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows the model tool schemas (Hermes, Qwen, Llama 3.1 ...): a probe
    conversation rendered with and without tools differs. Such a model is prompted in its own tool format."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    probe = [{"role": "user", "content": "probe"}]
    plain = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
    return plain != tokenizer.apply_chat_template(probe, tools=TOOLS, add_generation_prompt=True, tokenize=False)


def _for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call arguments as objects: chat templates render them with ``tojson`` (transformers' convention),
    while the conversation keeps them as JSON text, as the OpenAI API does."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                     for c in message["tool_calls"]]  # fmt: skip
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def _stop_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(i) for i in source)
    if not ids:
        raise ConfigError("the tokenizer has no eos_token_id: the policy could not tell where a reply ends")
    return frozenset(ids)
