"""TRL 1.16 integration: trialforge episodes as ``GRPOTrainer``'s tool environment (``environment_factory``).

GRPOTrainer builds one environment per rollout slot, calls ``reset(**row)``, offers its public methods as the model's
tools and calls ``get_reward()`` once per finished rollout. Here ``reset`` starts an episode on the server, each tool
call is one ``step`` and ``get_reward`` closes the episode and returns its verdict's reward, so no ``reward_funcs``
are needed; an unknown reward (any status but ``ok``) is None, never 0. ``task_dataset`` builds rows that name a task
or a seeded draw, so a group's rollouts play the same task. Size the trainer by the server: ``generation_batch_size``
at most ``max_live``, ``idle_timeout_s`` longer than a generation round.
Why each rule: docs/env-server.md, "Pointing a trainer at it".
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

from datasets import Dataset

from trialforge.envserver.client import EnvClient
from trialforge.envserver.protocol import Reset, Verdict

log = logging.getLogger(__name__)

TOKEN_VAR = "TRIALFORGE_ENV_TOKEN"
TOOLS = ("run", "view", "replace", "create", "submit")  # the methods below, as the server names its tools


class TrialforgeToolEnv:
    """One rollout slot: an episode from ``reset`` to ``get_reward``, reused for the next batch's episode."""

    def __init__(self, client: EnvClient, *, policy: str = "trl", policy_version: str = "unversioned") -> None:
        self._client = client
        self._policy = policy
        self._policy_version = policy_version
        self._episode: Reset | None = None
        self._turn = 0
        self._done = False
        self.verdict: Verdict | None = None  # the last episode's, once its reward has been read

    def reset(
        self,
        task_id: str | None = None,
        seed: int | None = None,
        split: Literal["train", "eval"] = "train",
        tier: str | None = None,
        **row: Any,
    ) -> str:
        """Start an episode of the row's task; its prompt is what the model is asked to do."""
        if self._episode is not None and self.verdict is None:
            self._close()  # the last episode's reward was never read: release its sandbox now
        self._episode = self._client.reset(
            task_id, split=split, tier=tier, seed=seed, policy=self._policy, policy_version=self._policy_version
        )
        self._turn, self._done, self.verdict = 0, False, None
        unknown = {t["function"]["name"] for t in self._episode.tools} - set(TOOLS)
        if unknown:  # e.g. `restore`, offered under rollout.allow_rollback: a method TRL could not show the model
            self._close()
            raise RuntimeError(f"the server offers tools this environment lacks: {sorted(unknown)}")
        return self._episode.prompt

    def get_reward(self) -> float | None:
        """The episode's verdict reward, closing it (grading the repository as it stands if never submitted)."""
        if self.verdict is None:
            self._close()
        assert self.verdict is not None
        if self.verdict.reward is None:
            v = self.verdict
            log.warning("episode %s of %s has no reward (%s: %s)", v.episode_id, v.task_id, v.status, v.cause)
        return self.verdict.reward

    # --- the model's tools: names, arguments and docstrings are the schemas it sees -------------------------------
    def run(self, command: str) -> str:
        """Run a shell command in the repository (cwd /work) and return its output.

        Args:
            command: The shell command.
        """
        return self._step("run", command=command)

    def view(self, path: str, start: int | None = None, end: int | None = None) -> str:
        """Show a file with line numbers, optionally only lines start..end (1-based, inclusive).

        Args:
            path: The file, relative to /work.
            start: The first line to show.
            end: The last line to show.
        """
        return self._step("view", path=path, start=start, end=end)

    def replace(self, path: str, old: str, new: str) -> str:
        """Replace the single occurrence of `old` with `new` in a file.

        Args:
            path: The file, relative to /work.
            old: The text to replace; it must occur exactly once.
            new: The text to put in its place.
        """
        return self._step("replace", path=path, old=old, new=new)

    def create(self, path: str, content: str) -> str:
        """Create or overwrite a file with the given content.

        Args:
            path: The file, relative to /work.
            content: The file's whole content.
        """
        return self._step("create", path=path, content=content)

    def submit(self) -> str:
        """Finish the episode; the repository as it is now will be graded."""
        return self._step("submit")

    # --- inside ----------------------------------------------------------------------------------------------------
    def _step(self, tool: str, **args: Any) -> str:
        # Raised errors reach the model as the tool's result ({"error": ...}) and count as failed tool calls.
        if self._episode is None:
            raise RuntimeError("no episode: GRPOTrainer calls reset before any tool")
        if self._done:
            raise RuntimeError("the episode has ended (submitted, or out of turns or time); no more tools run")
        given = {k: v for k, v in args.items() if v is not None}
        result = self._client.step(self._episode.episode_id, tool, given, turn=self._turn)
        self._turn, self._done = result.turn, result.done
        return result.observation

    def _close(self) -> None:
        assert self._episode is not None
        self.verdict = self._client.close(self._episode.episode_id)


class ToolEnvFactory:
    """``GRPOTrainer(environment_factory=...)`` for the server at ``url``: one HTTP client serves every slot (close
    it after training). ``token`` defaults to $TRIALFORGE_ENV_TOKEN; ``max_wait_s`` bounds waiting on a full server."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        policy: str = "trl",
        policy_version: str = "unversioned",
        max_wait_s: float = 600.0,
    ) -> None:
        token = token or os.environ.get(TOKEN_VAR)
        if not token:
            raise ValueError(f"pass the environment server's bearer token, or set {TOKEN_VAR}")
        self.client = EnvClient(url, token, max_wait_s=max_wait_s)
        self.policy = policy
        self.policy_version = policy_version

    def __call__(self) -> TrialforgeToolEnv:
        return TrialforgeToolEnv(self.client, policy=self.policy, policy_version=self.policy_version)

    def close(self) -> None:
        self.client.shutdown()


def task_dataset(
    task_ids: list[str] | None = None,
    *,
    draws: int = 0,
    split: Literal["train", "eval"] = "train",
    tier: str | None = None,
) -> Dataset:
    """Rows for ``train_dataset``: one per named task, else ``draws`` seeded draws from ``split`` (and ``tier``).
    Each prompt is an empty user message that ``reset`` fills with the episode's prompt."""
    if task_ids:
        rows: dict[str, list[Any]] = {"task_id": task_ids}
    elif draws > 0:
        rows = {"seed": list(range(draws)), "tier": [tier] * draws}
    else:
        raise ValueError("name task_ids, or set draws to draw that many tasks from the split")
    n = len(next(iter(rows.values())))
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * n, "split": [split] * n, **rows})
