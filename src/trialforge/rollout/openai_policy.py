"""A policy served by any OpenAI-compatible chat endpoint (vLLM, SGLang, hosted APIs), through tool calling.

Each turn posts the conversation with ``tools=TOOLS`` to ``{base_url}/chat/completions``; the first tool call of the
first choice is the action. Transport failures are retried, then raised as ``InferenceError`` (the episode is an
``env_error``); a refused request is ``PolicyError``, save one the server refuses for not fitting the model's context
(``ContextExhausted``: the episode ends graded); what the model says is never an error. Each turn is planned within
the context (``rollout.context``) with prompt tokens estimated from the server's usage numbers. With ``token_ids`` each
step records what a trainer needs to rescore the reply. Details: docs/rollouts.md, "Model policies".
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from trialforge.errors import ConfigError, InferenceError, PolicyError
from trialforge.rollout.chat import Conversation, invalid, parse_tool_call, system_prompt
from trialforge.rollout.context import ContextExhausted, ContextParams, UsageCounter, plan, refuses_context
from trialforge.rollout.env import TOOLS
from trialforge.rollout.policies import Decision, TaskView

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class OpenAIPolicy:
    """Chat completions with tool calling; one shared HTTP client (thread-safe) for all episodes."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        temperature: float = 1.0,
        max_tokens: int = 1024,
        logprobs: bool = True,
        context_tokens: int | None = None,
        context: ContextParams | None = None,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        system: str | None = None,
        name: str = "openai",
        version: str | None = None,
        token_ids: bool = False,
        on_missing_model: Callable[[], None] | None = None,
    ) -> None:
        """``api_key`` None reads ``OPENAI_API_KEY`` (no Authorization header when neither is set).

        ``logprobs`` asks for the sampled tokens' log-probabilities (vLLM and SGLang return them; turn it off
        for an endpoint that rejects the field). ``context`` keeps each turn within the model's window:
        ``context_tokens``, else ``context.tokens``, else the ``max_model_len`` the server lists for ``model``
        (vLLM's ``/models`` does), else none (the server's refusal alone ends the episode).
        ``system`` replaces the default instructions. ``version`` tags the episodes (default: ``model``).
        ``token_ids``: record the token ids a trainer needs (module docstring); it needs ``logprobs``.
        """
        if token_ids and not logprobs:
            raise ConfigError("recording token ids for training needs the log-probabilities too (logprobs=True)")
        self.system = system if system is not None else system_prompt(native_tools=True)
        self.name = name
        self.version = version or model
        self.token_ids = token_ids
        self.on_missing_model = on_missing_model
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.max_retries = max_retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.context = context or ContextParams()
        self._window: tuple[int | None] | None = None if context_tokens is None else (context_tokens,)
        self._window_lock = threading.Lock()
        self.max_backoff_s = max_backoff_s
        self._jitter = wait_random_exponential(multiplier=backoff_s, max=max_backoff_s)
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(headers=headers, timeout=timeout_s)

    def begin(self, view: TaskView, seed: int) -> OpenAIEpisode:
        return OpenAIEpisode(self, seed)

    def close(self) -> None:
        self._client.close()

    def window(self) -> int | None:
        """The context window in tokens (``__init__``); the server is asked once."""
        with self._window_lock:
            if self._window is None:
                self._window = (self.context.tokens or self._listed_window(),)
            return self._window[0]

    def _listed_window(self) -> int | None:
        try:
            answer = self._client.get(self.url.removesuffix("/chat/completions") + "/models")
            listed = answer.json().get("data", []) if answer.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            listed = []
        lengths = [m.get("max_model_len") for m in listed if isinstance(m, dict) and m.get("id") == self.model]
        return lengths[0] if lengths and isinstance(lengths[0], int) and lengths[0] > 1 else None

    def complete(
        self, messages: list[dict[str, Any]], seed: int, max_tokens: int | None = None
    ) -> tuple[dict[str, Any], int, float]:
        """POST one chat completion (``max_tokens`` None: the policy's): the parsed response body, the attempts it
        took and the seconds waited between."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "tools": TOOLS,
            "tool_choice": "auto",
            "temperature": self.temperature,
            "max_tokens": max_tokens or self.max_tokens,
            "seed": seed % 2**31,
        }
        if self.logprobs:
            body["logprobs"] = True
        if self.token_ids:
            body["return_token_ids"] = True
        retrying = Retrying(
            retry=retry_if_exception_type(_Retryable),
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            after=self._failed,
            reraise=True,
        )
        try:
            data = retrying(self._post, body)
        except _Retryable as exc:
            attempts = retrying.statistics["attempt_number"]
            raise InferenceError(f"{self.url} failed {attempts} times; last: {exc}") from exc
        return data, retrying.statistics["attempt_number"], retrying.statistics["idle_for"]

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._client.post(self.url, json=body)
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"transport error ({type(exc).__name__}: {exc})") from exc
        if response.status_code == 200:
            return _json(response)
        failure = f"HTTP {response.status_code}: {response.text[:500]}"
        if response.status_code == 404 and self.on_missing_model is not None:
            self.on_missing_model()  # e.g. load the adapter a restarted server lost, then ask again
            raise _Retryable(failure)
        if response.status_code in (400, 413) and refuses_context(response.text):
            raise ContextExhausted(f"{self.url} refused the request for the model's context ({failure})")
        if response.status_code not in RETRYABLE_STATUS:
            raise PolicyError(f"{self.url} refused the request ({failure}); not retried")
        raise _Retryable(failure, _retry_after(response))

    def _wait(self, state: RetryCallState) -> float:
        """Exponential backoff with full jitter; the server's Retry-After, when given, is a floor."""
        delay = self._jitter(state)
        hint = _failure(state).retry_after
        return delay if hint is None else max(delay, min(hint, self.max_backoff_s))

    def _failed(self, state: RetryCallState) -> None:
        log.warning(
            "chat completion attempt %d/%d failed: %s", state.attempt_number, self.max_retries + 1, _failure(state)
        )


class _Retryable(Exception):
    """A failed attempt worth another: a transport error or a retryable status (with the server's Retry-After)."""

    def __init__(self, failure: str, retry_after: float | None = None) -> None:
        super().__init__(failure)
        self.retry_after = retry_after


def _failure(state: RetryCallState) -> _Retryable:
    assert state.outcome is not None  # tenacity asks only after an attempt failed with a _Retryable
    return state.outcome.exception()  # type: ignore[return-value]


class OpenAIEpisode:
    def __init__(self, policy: OpenAIPolicy, seed: int) -> None:
        self.policy = policy
        self.seed = seed
        self.conversation = Conversation(policy.system, native_tools=True)
        self.counter = UsageCounter()

    def act(self, observation: str) -> Decision:
        policy = self.policy
        self.conversation.observe(observation)
        turn = plan(self.conversation.messages, self.counter, policy.window(), policy.max_tokens, policy.context)
        seed = self.seed + len(self.conversation.messages)
        data, attempts, waited = policy.complete(turn.messages, seed, turn.max_tokens)
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise PolicyError(f"{self.policy.url} answered without choices[0].message: {str(data)[:300]}") from exc
        calls = message.get("tool_calls") or []
        if calls:
            call = calls[0]
            function = call.get("function") or {}
            action = parse_tool_call(str(function.get("name", "")), function.get("arguments"))
            call_id = call.get("id") or f"call-{len(self.conversation.messages)}"
        else:
            action, call_id = invalid("the reply has no tool call"), None
        self.conversation.reply(message.get("content"), action, call_id)
        usage = data.get("usage") or {}
        self.counter.measured(turn.messages, int(usage.get("prompt_tokens") or 0))
        token_logprobs = _token_logprobs(choice)
        info: dict[str, Any] = {
            "response_id": data.get("id", ""),
            "finish_reason": choice.get("finish_reason"),
            "attempts": attempts,
            "retry_wait_s": round(waited, 3),
            "dropped_turns": turn.dropped_turns,
            "max_tokens": turn.max_tokens,
        }
        if message.get("content"):
            info["content"] = message["content"]
        if token_logprobs is not None:
            info["token_logprobs"] = token_logprobs
        if self.policy.token_ids:
            info |= _sampled(data, choice, token_logprobs, self.policy)
        return Decision(
            action=action,
            logprob=sum(token_logprobs) if token_logprobs else None,
            tokens_in=int(usage.get("prompt_tokens") or 0),
            tokens_out=int(usage.get("completion_tokens") or 0),
            info=info,
        )


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError as exc:
        raise PolicyError(f"{response.url} answered 200 with a body that is not JSON: {response.text[:300]}") from exc
    if not isinstance(data, dict):
        raise PolicyError(f"{response.url} answered 200 with JSON that is not an object: {str(data)[:300]}")
    return data


def _sampled(
    data: dict[str, Any], choice: dict[str, Any], logprobs: list[float] | None, policy: OpenAIPolicy
) -> dict[str, Any]:
    """What the trainer needs from one reply: the token ids of the prompt and of the sample, their
    log-probabilities, the temperature, and an estimate of the sampling entropy (the mean of -log p over the
    sampled tokens, unbiased for the mean per-token entropy the health check watches)."""
    prompt, ids = data.get("prompt_token_ids"), choice.get("token_ids")
    if not isinstance(prompt, list) or not isinstance(ids, list):
        raise ConfigError(
            f"{policy.url} returned no prompt_token_ids/token_ids: training on a server's samples needs a server "
            "that answers return_token_ids (a vLLM release that has it, or `trialforge serve lm`)"
        )
    if logprobs is None or len(logprobs) != len(ids):
        raise InferenceError(
            f"{policy.url} returned {len(ids)} token ids but {len(logprobs or [])} log-probabilities for them"
        )
    return {
        "prompt_ids": [int(i) for i in prompt],
        "token_ids": [int(i) for i in ids],
        "temperature": policy.temperature,
        "entropy": -sum(logprobs) / len(logprobs) if logprobs else 0.0,
    }


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


def _token_logprobs(choice: dict[str, Any]) -> list[float] | None:
    """Per-token log-probabilities of the sampled tokens (``choices[0].logprobs.content[*].logprob``)."""
    content = (choice.get("logprobs") or {}).get("content")
    if not content:
        return None
    return [float(item["logprob"]) for item in content if isinstance(item, dict) and "logprob" in item]
