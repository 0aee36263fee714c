"""What LLM policies share: the conversation an episode builds, tool-call parsing, and fitting a context.

The conversation is kept as OpenAI-style chat messages: a system prompt, the environment's first
observation as the user's message, then one assistant message per action followed by what the
environment answered. A model that calls tools natively (an OpenAI-compatible endpoint, or a local model
whose chat template renders tools) sees the answer as a ``tool`` message tied to its call; a model that
writes its call as plain text sees it as the next ``user`` message.

A model that replies with something that is not a tool call has made a mistake, not failed: its reply
becomes ``Action(tool="invalid", args={"error": ...})``, the environment answers with an error, and the
episode goes on with the mistake in its trajectory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trialforge.rollout.env import TOOLS, Action

INVALID_TOOL = "invalid"

_NATIVE_INSTRUCTIONS = (
    "You are a software engineer fixing an issue in a repository. Work by calling exactly one tool per reply; "
    "each tool's result comes back to you. Call submit when the fix is done."
)
_TEXT_INSTRUCTIONS = (
    "You are a software engineer fixing an issue in a repository. Work by replying with exactly one JSON object "
    '{"tool": NAME, "args": {...}} per reply; each tool\'s result comes back to you. Call submit when the fix '
    "is done. Tools:"
)


def system_prompt(native_tools: bool) -> str:
    """The instructions; a text-protocol model also gets each tool's signature, since it sees no schema."""
    if native_tools:
        return _NATIVE_INSTRUCTIONS
    return "\n".join([_TEXT_INSTRUCTIONS, *(tool_signature(tool) for tool in TOOLS)])


def tool_signature(tool: dict[str, Any]) -> str:
    """One line for an OpenAI tool schema, ``- name(arg: type, other: type (optional)): description``: what a
    model that sees no schema is told."""
    fn = tool["function"]
    params = fn.get("parameters") or {}
    required = set(params.get("required", []))
    args = ", ".join(
        f"{name}: {spec.get('type', 'any')}" + ("" if name in required else " (optional)")
        for name, spec in params.get("properties", {}).items()
    )
    return f"- {fn['name']}({args}): {fn.get('description') or ''}"


def invalid(error: str) -> Action:
    return Action(tool=INVALID_TOOL, args={"error": error})


def parse_tool_call(name: str, arguments: str | dict[str, Any] | None) -> Action:
    """An OpenAI-style function call (arguments as JSON text) as an Action.

    A tool name the environment does not know passes through (the environment answers that it is unknown);
    arguments that are not a JSON object make the action invalid.
    """
    if isinstance(arguments, dict):
        return Action(tool=name, args=arguments)
    try:
        args = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError as exc:
        return invalid(f"the arguments of {name!r} are not valid JSON ({exc.msg} at character {exc.pos})")
    if not isinstance(args, dict):
        return invalid(f"the arguments of {name!r} must be a JSON object, not {type(args).__name__}")
    return Action(tool=name, args=args)


def text_call(text: str) -> tuple[str, Action]:
    """A text reply split at its first tool-call object: the prose before it (a ``<tool_call>`` tag left out)
    and the call as an Action; the whole text and an invalid action when it holds none.

    A call is ``{"tool": NAME, "args": {...}}``, or ``{"name": NAME, "arguments": {...}}``, the shape
    instruction-tuned models write tool calls in (Hermes and Qwen wrap it in ``<tool_call>`` tags).
    """
    decoder = json.JSONDecoder()
    found_object = False
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            found_object = True
            keys = ("tool", "args") if "tool" in value else ("name", "arguments")
            tool, args = value.get(keys[0]), value.get(keys[1], {})
            if isinstance(tool, str) and isinstance(args, dict):
                return text[:start].rstrip().removesuffix("<tool_call>").rstrip(), Action(tool=tool, args=args)
        start = text.find("{", start + 1)
    if found_object:
        return text, invalid('no JSON object in the reply has a string "tool" and an object "args"')
    return text, invalid('the reply holds no JSON object {"tool": ..., "args": {...}}')


@dataclass
class Conversation:
    """The messages of one episode, grown one observation and one reply at a time."""

    system: str
    native_tools: bool
    messages: list[dict[str, Any]] = field(default_factory=list)
    _pending_call: str | None = None  # id of the tool call the next observation answers
    _pending_error: str | None = None  # why the last reply was not a valid action

    def __post_init__(self) -> None:
        self.messages.append({"role": "system", "content": self.system})

    def observe(self, observation: str) -> None:
        """Add what the environment showed: the task first, then the answer to each action."""
        if self._pending_call is not None:
            self.messages.append({"role": "tool", "tool_call_id": self._pending_call, "content": observation})
        else:
            if self._pending_error is not None:
                observation = f"Your reply was not a valid tool call: {self._pending_error}.\n{observation}"
            self.messages.append({"role": "user", "content": observation})
        self._pending_call = self._pending_error = None

    def reply_text(self, text: str, call_id: str) -> Action:
        """Add a reply a model wrote as text and return its action. With ``native_tools`` (a chat template that
        renders tool calls, e.g. Hermes or Qwen) a valid call is kept as the message's ``tool_calls``, its prose
        as the content, and the answer comes back as a ``tool`` message; otherwise the text stays as written."""
        prose, action = text_call(text)
        if self.native_tools and action.tool != INVALID_TOOL:
            self.reply(prose, action, call_id)
        else:
            self.reply(text, action)
        return action

    def reply(self, content: str | None, action: Action, call_id: str | None = None) -> None:
        """Add the model's reply; ``call_id`` names a native tool call (answered by a ``tool`` message)."""
        message: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if call_id is not None and action.tool != INVALID_TOOL:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": action.tool, "arguments": json.dumps(action.args)},
                }
            ]
            self._pending_call = call_id
        if action.tool == INVALID_TOOL:
            self._pending_error = str(action.args.get("error", "malformed reply"))
        self.messages.append(message)


@dataclass(frozen=True)
class Fitted:
    messages: list[dict[str, Any]]
    dropped_turns: int


def fit(messages: list[dict[str, Any]], fits: Callable[[list[dict[str, Any]]], bool]) -> Fitted:
    """Drop the oldest whole turns (a reply and the answers to it) until ``fits`` accepts the messages.

    The system prompt and the task (the first user message) always stay, and so does the latest turn; the
    task message says how many turns were left out. Returns the smallest such conversation when even that
    does not fit: the caller decides whether that is an error.
    """
    turns = _turns(messages[2:])
    dropped = 0
    while True:
        candidate = _elided(messages[:2], turns, dropped)
        if fits(candidate) or dropped >= len(turns) - 1:
            return Fitted(candidate, dropped)
        dropped += 1


def keep_last(messages: list[dict[str, Any]], keep: int) -> Fitted:
    """The system prompt, the task (saying how many turns were left out) and the latest ``keep`` whole turns."""
    turns = _turns(messages[2:])
    dropped = max(len(turns) - keep, 0)
    return Fitted(_elided(messages[:2], turns, dropped), dropped)


def _elided(head: list[dict[str, Any]], turns: list[list[dict[str, Any]]], dropped: int) -> list[dict[str, Any]]:
    kept = head if dropped == 0 else [head[0], _with_note(head[1], dropped)]
    return kept + [m for turn in turns[dropped:] for m in turn]


def _turns(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    turns: list[list[dict[str, Any]]] = []
    for message in messages:
        if message["role"] == "assistant" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def _with_note(task: dict[str, Any], dropped: int) -> dict[str, Any]:
    note = f"\n\n[trialforge: {dropped} earlier turn(s) of this episode were left out to fit the context]"
    return {**task, "content": task["content"] + note}


def chars(messages: list[dict[str, Any]]) -> int:
    """A cheap size measure: characters of content and tool-call arguments."""
    total = 0
    for message in messages:
        total += len(message.get("content") or "")
        for call in message.get("tool_calls", []):
            total += len(call["function"]["arguments"]) + len(call["function"]["name"])
    return total
