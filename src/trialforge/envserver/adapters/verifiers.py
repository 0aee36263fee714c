"""A verifiers 0.4.0 environment (``verifiers.v1``) whose rollouts are episodes on a trialforge environment server.

``TrialforgeTaskset`` yields one task per named task or seeded draw; ``TrialforgeEnv.run`` plays the user (``reset``,
the server's prompt as the first turn, ``close``, the verdict's reward onto the trace); ``TrialforgeHarness``, the
agent's program run in-process, turns each tool call into a ``step``. A reward the server could not establish is
never a number: ``run`` raises ``VerifierError``, and the verdict is on ``trace.info["trialforge"]`` either way. The
package ``trialforge_env`` re-exports this module so that verifiers' loader finds the taskset ``trialforge-env``.
How verifiers loads and runs it: docs/env-server.md, "Pointing a trainer at it".
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

import httpx
import verifiers.v1 as vf
from pydantic import ConfigDict, Field, model_validator
from verifiers.v1.dialects.chat import message_to_wire

from trialforge.envserver.client import AsyncEnvClient
from trialforge.envserver.protocol import Reset, Verdict
from trialforge.errors import VerifierError

PLUGIN_ID = "trialforge-env"

__all__ = [
    "PLUGIN_ID",
    "TrialforgeConfig",
    "TrialforgeEnv",
    "TrialforgeEnvConfig",
    "TrialforgeHarness",
    "TrialforgeHarnessConfig",
    "TrialforgeTask",
    "TrialforgeTaskset",
]


class TrialforgeData(vf.TaskData):
    task_id: str | None = None  # None: drawn from split and tier with `seed`
    split: Literal["train", "eval"] = "train"
    tier: str | None = None
    seed: int | None = None


class TrialforgeState(vf.State):
    """One rollout's live episode, shared by the env (reset, close) and the harness (steps)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: AsyncEnvClient | None = None
    episode: Reset | None = None
    turn: int = 0  # actions the server has taken, sent with each step so a retried request is answered once
    done: bool = False


class TrialforgeTask(vf.Task[TrialforgeData, TrialforgeState]):
    pass


class TrialforgeConfig(vf.TasksetConfig):
    url: str  # the environment server, e.g. http://127.0.0.1:8765
    token_var: str = "TRIALFORGE_ENV_TOKEN"  # the environment variable holding its bearer token
    task_ids: list[str] = Field(default_factory=list)
    draws: int = Field(0, ge=0)  # with no task_ids: this many tasks drawn from split and tier, seeds 0..draws-1
    split: Literal["train", "eval"] = "train"
    tier: str | None = None
    policy: str = "verifiers"  # recorded as the episodes' policy
    policy_version: str = "unversioned"

    @model_validator(mode="after")
    def _some_tasks(self) -> TrialforgeConfig:
        if not self.task_ids and not self.draws:
            raise ValueError("name task_ids, or set draws to draw that many tasks from the split")
        return self


class TrialforgeTaskset(vf.Taskset[TrialforgeTask, TrialforgeConfig]):
    def load(self) -> list[TrialforgeTask]:
        c = self.config
        if c.task_ids:
            rows = [TrialforgeData(name=t, task_id=t, split=c.split) for t in c.task_ids]
        else:
            rows = [
                TrialforgeData(name=f"{c.split}:{c.tier or 'any'}:{s}", split=c.split, tier=c.tier, seed=s)
                for s in range(c.draws)
            ]
        return [TrialforgeTask(row, c.task) for row in rows]


class TrialforgeHarnessConfig(vf.HarnessConfig):
    id: str = PLUGIN_ID
    request_timeout_s: float = Field(900.0, gt=0)  # one model call through the interception


class TrialforgeHarness(vf.Harness[TrialforgeHarnessConfig]):
    """The model in a loop over the episode's tools; each tool call is one ``step`` on the server."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True  # the env opens the exchange with the server's prompt as the user's turn
    EXECUTES_CODE = False  # commands run in trialforge's sandbox, never in this runtime
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> vf.ProgramResult:
        state = trace.state
        if not isinstance(state, TrialforgeState) or state.episode is None or state.client is None:
            raise RuntimeError("TrialforgeHarness runs only inside TrialforgeEnv, which opens the episode")
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [message_to_wire(m) for m in prompt or []]
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=endpoint, headers=headers, timeout=self.config.request_timeout_s) as llm:
            while not state.done:
                body = {"model": ctx.model, "messages": messages, "tools": state.episode.tools}
                response = await llm.post("/chat/completions", json=body)
                if response.status_code != 200:  # a refused turn (a limit, a @stop) or a model failure
                    raise RuntimeError(f"model call answered {response.status_code}: {response.text[:500]}")
                reply = response.json()["choices"][0]["message"]
                calls = reply.get("tool_calls") or []
                if not calls:
                    break  # the model answered in words: the env closes the episode, graded as it stands
                messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": calls})
                for call in calls:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": await _step(state, call)})
                    if state.done:
                        break
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


async def _step(state: TrialforgeState, call: dict[str, Any]) -> str:
    """One tool call as one step; arguments that are not a JSON object are the model's error, told to it."""
    assert state.client is not None and state.episode is not None
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except json.JSONDecodeError as exc:
        return f"error: the arguments are not JSON ({exc})"
    if not isinstance(args, dict):
        return "error: the arguments must be a JSON object"
    result = await state.client.step(state.episode.episode_id, call["function"]["name"], args, turn=state.turn)
    state.turn, state.done = result.turn, result.done
    return result.observation


class TrialforgeEnvConfig(vf.EnvConfig):
    # The harness runs in this process; the runtime verifiers requires is a scratch directory it never uses.
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


class TrialforgeEnv(vf.Env[TrialforgeEnvConfig]):
    """reset -> the agent's exchange -> close, with one server client shared by the env's episodes."""

    _client: AsyncEnvClient | None = None

    async def start(self) -> None:
        config = self._config()
        token = os.environ.get(config.token_var)
        if not token:
            raise ValueError(f"set {config.token_var} to the environment server's bearer token")
        self._client = AsyncEnvClient(config.url, token)

    async def stop(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.shutdown()

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        client, config, data = self._client, self._config(), task.data
        if client is None:
            raise RuntimeError("TrialforgeEnv runs episodes only while serving (env.serving())")
        assert isinstance(data, TrialforgeData)
        reset = await client.reset(
            data.task_id,
            split=data.split,
            tier=data.tier,
            seed=data.seed,
            policy=config.policy,
            policy_version=config.policy_version,
        )
        try:
            async with agents.agent.interaction(task) as interaction:
                interaction.trace.state.client = client
                interaction.trace.state.episode = reset
                await interaction.turn(reset.prompt)
        finally:  # whatever happened, the server's sandbox is released now, not at its idle timeout
            verdict = await client.close(reset.episode_id)
        _record(interaction.trace, verdict)

    def _config(self) -> TrialforgeConfig:
        config = self.taskset.config
        assert isinstance(config, TrialforgeConfig)
        return config


def _record(trace: vf.Trace, verdict: Verdict) -> None:
    """The verdict onto the trace: its reward when known; an unknown one fails the episode, never reads as 0."""
    trace.info["trialforge"] = verdict.model_dump()
    if verdict.reward is None:
        raise VerifierError(
            f"episode {verdict.episode_id} of {verdict.task_id} has no reward: {verdict.status} ({verdict.cause})"
        )
    trace.record_reward("trialforge", verdict.reward)
