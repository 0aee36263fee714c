"""The coding environment: a task's repository in a sandbox, driven by tool calls.

The sandbox holds the repository at its base state and nothing else (no test
patch, no gold patch, no history). Observations are text; anything cut is
marked, so a policy never mistakes a truncated file for a whole one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from trialforge.envspec import Build
from trialforge.errors import SandboxError
from trialforge.sandbox.base import TRUNCATION_MARK, Limits, Sandbox
from trialforge.section import Section
from trialforge.tasks.extbuild import inputs_digest, run_build

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command in the repository (cwd /work) and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "view",
            "description": "Show a file with line numbers, optionally only lines start..end (1-based, inclusive).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "start": {"type": "integer"},
                    "end": {"type": "integer"},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "replace",
            "description": "Replace the single occurrence of `old` with `new` in a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                "required": ["path", "old", "new"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "create",
            "description": "Create or overwrite a file with the given content.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish the episode; the repository as it is now will be graded.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
TOOL_NAMES = frozenset(t["function"]["name"] for t in TOOLS)
_PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
_TYPES: dict[str, type] = {"string": str, "integer": int}


def argument_problem(tool: str, args: dict[str, Any]) -> str | None:
    """What is wrong with ``args`` for ``tool`` by its schema (unknown, missing or mistyped), or None.

    Checked before the tool runs: a model's call arrives as arbitrary JSON, and a mistyped argument must be an
    observation it can correct, never an exception deep in a file operation.
    """
    schema = _PARAMETERS[tool]
    properties = schema.get("properties", {})
    problems = [f"unknown argument {k!r}" for k in sorted(set(args) - set(properties))]
    problems += [f"missing argument {k!r}" for k in schema.get("required", []) if k not in args]
    for key, value in args.items():
        kind = properties.get(key, {}).get("type")
        if kind is not None and (not isinstance(value, _TYPES[kind]) or isinstance(value, bool)):
            problems.append(f"{key!r} must be of type {kind}, not {type(value).__name__}")
    return "; ".join(problems) or None


def well_formed(action: Action, offered: frozenset[str]) -> bool:
    """Whether ``action`` calls one of the ``offered`` tools with arguments its schema accepts."""
    if action.tool not in offered:
        return False
    return action.tool not in _PARAMETERS or argument_problem(action.tool, action.args) is None


def opening(problem_statement: str) -> str:
    """The first user message of every episode."""
    return (
        "You are in a Python repository at /work. Fix the issue below so that its tests pass, "
        "then call submit.\n\n" + problem_statement
    )


class Action(BaseModel):
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class EnvLimits(Section):
    """An episode's bounds beside its sandbox's ``Limits`` (``rollout`` in params.yaml: ``RolloutParams`` derives
    from this class)."""

    max_turns: int = Field(12, ge=1)  # turns (actions) an episode may take
    observation_cap: int = 8000  # characters of one observation; the middle of a longer one is dropped
    # replies in a row that are no well-formed call of an offered tool before the episode ends as termination
    # invalid_actions (graded: the model's outcome); 0: no limit, the episode goes on to max_turns
    max_bad_actions: int = Field(0, ge=0)


@dataclass
class StepOutcome:
    observation: str
    done: bool
    error: bool  # the action itself was invalid (a policy error the policy sees, not an infrastructure fault)
    exec_s: float


class CodingEnv:
    def __init__(
        self,
        sandbox: Sandbox,
        problem_statement: str,
        limits: EnvLimits,
        sandbox_limits: Limits | None = None,
        build: Build | None = None,
    ) -> None:
        """``sandbox_limits``: the sandbox's, whose ``exec_timeout_s`` bounds a command and ``episode_timeout_s``
        the episode (defaults: ``Limits()``). ``build``: the repository's extension modules, rebuilt before each
        command where their sources changed, so an edit to a .c file takes effect as it would in grading."""
        self.sandbox = sandbox
        self.build = build
        self.built_inputs = ""  # the digest of the build inputs at the last build that succeeded
        self.problem_statement = problem_statement
        self.limits = limits
        self.timeouts = sandbox_limits or Limits()
        self.turn = 0
        self.started = time.monotonic()

    def first_observation(self) -> str:
        return opening(self.problem_statement)

    def out_of_time(self) -> bool:
        return time.monotonic() - self.started > self.timeouts.episode_timeout_s

    def step(self, action: Action) -> StepOutcome:
        self.turn += 1
        start = time.monotonic()
        if action.tool not in TOOL_NAMES:
            return StepOutcome(f"error: unknown tool {action.tool!r}; tools: {sorted(TOOL_NAMES)}", False, True, 0.0)
        if problem := argument_problem(action.tool, action.args):
            return StepOutcome(f"error: {action.tool}: {problem}", False, True, 0.0)
        if action.tool == "submit":
            return StepOutcome("submitted", True, False, 0.0)
        try:
            text = getattr(self, f"_{action.tool}")(**action.args)
            error = False
        except (TypeError, ValueError, KeyError, FileNotFoundError, UnicodeDecodeError) as exc:
            text, error = f"error: {exc}", True
        except SandboxError as exc:
            # a bad path, or a file past the workspace's quota, is the policy's doing; the rest is infrastructure
            if exc.cause not in ("path", "quota"):
                raise
            text, error = f"error: {exc}", True
        return StepOutcome(self._cap(text), False, error, time.monotonic() - start)

    def _cap(self, text: str) -> str:
        cap = self.limits.observation_cap
        if len(text) <= cap:
            return text
        half = cap // 2
        return text[:half] + TRUNCATION_MARK.format(dropped=len(text) - 2 * half) + text[-half:]

    # --- tools -----------------------------------------------------------------------
    def _run(self, command: str) -> str:
        note = self._rebuild() if self.build is not None else ""
        result = self.sandbox.exec(["bash", "-c", command], timeout=self.timeouts.exec_timeout_s)
        status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        return f"{note}[{status}]\n{result.stdout}{result.stderr}"

    def _rebuild(self) -> str:
        """Build the extensions when their inputs changed since the last build that succeeded here (the first
        command always builds: a checkpoint's tree may hold objects older than its sources); a note when it failed."""
        assert self.build is not None
        timeout = self.timeouts.exec_timeout_s
        inputs = inputs_digest(self.sandbox, self.build, timeout_s=timeout)
        if inputs and inputs == self.built_inputs:
            return ""
        built = run_build(self.sandbox, self.build, timeout_s=timeout)
        if not built.ok:  # the command still runs, on the extensions as they were last built
            return f"[the extension modules did not build: {built.why}]\n"
        self.built_inputs = inputs
        return ""

    def _view(self, path: str, start: int | None = None, end: int | None = None) -> str:
        lines = self.sandbox.read_file(path).decode("utf-8").splitlines()
        lo = max(start or 1, 1)
        hi = min(end or len(lines), len(lines))
        return "\n".join(f"{n:>5}  {lines[n - 1]}" for n in range(lo, hi + 1))

    def _replace(self, path: str, old: str, new: str) -> str:
        text = self.sandbox.read_file(path).decode("utf-8")
        count = text.count(old)
        if count != 1:
            raise ValueError(f"`old` occurs {count} times in {path}; it must occur exactly once")
        self.sandbox.write_file(path, text.replace(old, new).encode("utf-8"))
        return f"replaced 1 occurrence in {path}"

    def _create(self, path: str, content: str) -> str:
        self.sandbox.write_file(path, content.encode("utf-8"))
        return f"wrote {len(content)} characters to {path}"
