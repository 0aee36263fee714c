"""An LM policy's token budget: what of an episode's conversation each turn sends, and how long its reply may be.

Every LM policy (a local transformers model, the served learner, an OpenAI-compatible endpoint) plans each turn with
``plan``: the conversation is cut down by the declared strategy (``rollout.context``), its prompt tokens counted (the
model's tokenizer, or an estimate from the server's usage numbers), and the reply's ``max_tokens`` capped by what the
window has left. When the next turn cannot fit, the policy raises ``ContextExhausted`` and the loop ends the episode
as termination ``context_exhausted``, graded on its diff like ``max_turns``: the model's outcome, trained on.
Strategies and how a served prompt is counted: docs/rollouts.md, "The context budget".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from trialforge.errors import TrialforgeError
from trialforge.rollout.chat import Fitted, chars, fit, keep_last
from trialforge.section import Section

# What servers say when a request does not fit the model (vLLM, OpenAI: "maximum context length";
# OpenAI's code "context_length_exceeded"; SGLang: "longer than the model's context length").
_CONTEXT_REFUSAL = re.compile(r"context[ _]length", re.IGNORECASE)


class ContextExhausted(TrialforgeError):
    """The episode's next turn does not fit the model's context: the episode ends, graded on its diff."""


class ContextParams(Section):
    """``rollout.context`` in params.yaml: how an LM policy's conversation is kept within its context."""

    # The window (prompt and reply) in tokens; None: a local model's max_position_embeddings, a served model's
    # max_model_len as its server lists it (else the server's refusal alone ends the episode).
    tokens: int | None = Field(None, ge=2)
    # keep_all: every turn, until the next does not fit; last_turns: the task and the latest keep_turns turns;
    # drop_oldest: the oldest turns are left out as needed for the prompt and a full reply to fit.
    strategy: Literal["keep_all", "last_turns", "drop_oldest"] = "drop_oldest"
    keep_turns: int = Field(4, ge=1)  # last_turns: how many of the latest turns (a reply and its answer) stay
    min_reply_tokens: int = Field(16, ge=1)  # a turn with less room than this for its reply ends the episode


@dataclass(frozen=True)
class Turn:
    """What one turn sends: the messages, how many turns were left out, and the reply's token cap."""

    messages: list[dict[str, Any]]
    dropped_turns: int
    max_tokens: int


def plan(
    messages: list[dict[str, Any]],
    count: Callable[[list[dict[str, Any]]], int],
    window: int | None,
    max_new_tokens: int,
    context: ContextParams,
) -> Turn:
    """The next turn of ``messages`` within ``window`` (None: unbounded), or ``ContextExhausted``."""
    fitted = Fitted(list(messages), 0)  # a copy: the conversation grows on after this turn
    if context.strategy == "last_turns":
        fitted = keep_last(messages, context.keep_turns)
    if window is None:
        return Turn(fitted.messages, fitted.dropped_turns, max_new_tokens)
    if context.strategy == "drop_oldest":
        fitted = fit(messages, lambda m: count(m) + max_new_tokens <= window)
    prompt = count(fitted.messages)
    room = window - prompt
    if room < min(context.min_reply_tokens, max_new_tokens):
        raise ContextExhausted(
            f"the prompt takes {prompt} of the context's {window} tokens ({fitted.dropped_turns} earlier turn(s) "
            f"left out by strategy {context.strategy}), leaving {max(room, 0)} for a reply"
        )
    return Turn(fitted.messages, fitted.dropped_turns, min(max_new_tokens, room))


def refuses_context(body: str) -> bool:
    """Whether a server's 4xx answer says the request did not fit the model's context."""
    return bool(_CONTEXT_REFUSAL.search(body))


class UsageCounter:
    """Prompt tokens of a served conversation estimated from the server's usage numbers (no local tokenizer).

    The last request's ``prompt_tokens`` is exact; characters added since count a token each (an upper bound for
    the BPE tokenizers of code models on ASCII text), characters removed at the last prompt's mean. Before the
    first answer a character of the messages counts a token and the tool schemas none (how a server renders them is
    unknown until it counts them): a first request that does not fit is refused by the server, which ends the episode
    all the same (``refuses_context``).
    """

    def __init__(self) -> None:
        self.sent_chars: int | None = None
        self.prompt_tokens = 0

    def __call__(self, messages: list[dict[str, Any]]) -> int:
        size = chars(messages)
        if self.sent_chars is None:
            return size
        grown = size - self.sent_chars
        if grown >= 0:
            return self.prompt_tokens + grown
        return max(self.prompt_tokens + round(grown * self.prompt_tokens / max(self.sent_chars, 1)), 0)

    def measured(self, messages: list[dict[str, Any]], prompt_tokens: int) -> None:
        """Record what the server counted for ``messages``."""
        if prompt_tokens > 0:
            self.sent_chars, self.prompt_tokens = chars(messages), prompt_tokens
