"""Clients of the environment server, blocking and asyncio, for trainers and their adapters.

A full server (429), and a reset whose sandbox could not start (503: the failed episode is recorded, a new
one may start), are tried again as Retry-After says, up to ``max_wait_s``; any other error status raises
``EnvServerError`` with the server's reason.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import anyio
import httpx
from pydantic import BaseModel

from trialforge.envserver.protocol import CloseRequest, Reset, ResetRequest, StepRequest, StepResult, Verdict

_M = TypeVar("_M", bound=BaseModel)


class EnvServerError(RuntimeError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"environment server answered {status}: {detail}")
        self.status = status
        self.detail = detail


class _Wait:
    """How long to wait before trying a full server again, and when to give up."""

    def __init__(self, max_wait_s: float) -> None:
        self.deadline = time.monotonic() + max_wait_s

    def after(self, response: httpx.Response) -> float | None:
        """Seconds to wait before retrying ``response``'s request; None: it is final."""
        if response.status_code not in (429, 503):  # full; or the episode's sandbox did not start (reset again)
            return None
        delay = float(response.headers.get("Retry-After", "1"))
        return delay if time.monotonic() + delay <= self.deadline else None


def _parse(response: httpx.Response, model: type[_M]) -> _M:
    if response.status_code != 200:
        try:
            detail = str(response.json().get("detail", response.text))
        except ValueError:
            detail = response.text
        raise EnvServerError(response.status_code, detail[:2000])
    return model.model_validate(response.json())


def _reset_body(task_id: str | None, **fields: Any) -> dict[str, Any]:
    return ResetRequest(task_id=task_id, **{k: v for k, v in fields.items() if v is not None}).model_dump()


def _step_body(episode_id: str, tool: str, args: dict[str, Any] | None, turn: int | None) -> dict[str, Any]:
    return StepRequest(episode_id=episode_id, tool=tool, args=args or {}, turn=turn).model_dump()


class EnvClient:
    """Blocking client: ``reset`` -> ``step``... -> ``close``."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 900.0, max_wait_s: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)
        self.max_wait_s = max_wait_s

    def _post(self, path: str, body: dict[str, Any], model: type[_M]) -> _M:
        wait = _Wait(self.max_wait_s)
        while True:
            response = self.http.post(path, json=body)
            delay = wait.after(response)
            if delay is None:
                return _parse(response, model)
            time.sleep(delay)

    def reset(self, task_id: str | None = None, **fields: Any) -> Reset:
        return self._post("/reset", _reset_body(task_id, **fields), Reset)

    def step(
        self, episode_id: str, tool: str, args: dict[str, Any] | None = None, turn: int | None = None
    ) -> StepResult:
        return self._post("/step", _step_body(episode_id, tool, args, turn), StepResult)

    def close(self, episode_id: str) -> Verdict:
        return self._post("/close", CloseRequest(episode_id=episode_id).model_dump(), Verdict)

    def shutdown(self) -> None:
        self.http.close()


class AsyncEnvClient:
    """The same calls for asyncio trainers (verl's agent loop, verifiers)."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 900.0, max_wait_s: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        self.http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)
        self.max_wait_s = max_wait_s

    async def _post(self, path: str, body: dict[str, Any], model: type[_M]) -> _M:
        wait = _Wait(self.max_wait_s)
        while True:
            response = await self.http.post(path, json=body)
            delay = wait.after(response)
            if delay is None:
                return _parse(response, model)
            await anyio.sleep(delay)

    async def reset(self, task_id: str | None = None, **fields: Any) -> Reset:
        return await self._post("/reset", _reset_body(task_id, **fields), Reset)

    async def step(
        self, episode_id: str, tool: str, args: dict[str, Any] | None = None, turn: int | None = None
    ) -> StepResult:
        return await self._post("/step", _step_body(episode_id, tool, args, turn), StepResult)

    async def close(self, episode_id: str) -> Verdict:
        return await self._post("/close", CloseRequest(episode_id=episode_id).model_dump(), Verdict)

    async def shutdown(self) -> None:
        await self.http.aclose()
