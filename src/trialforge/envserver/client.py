"""Clients of the environment server, blocking and asyncio, for trainers and their adapters.

A full server (429), and a reset whose sandbox could not start (503: the failed episode is recorded, a new
one may start), are tried again as Retry-After says, up to ``max_wait_s``; any other error status raises
``EnvServerError`` with the server's reason.
"""

from __future__ import annotations

from typing import Any, TypeVar

import anyio
import httpx
from pydantic import BaseModel
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_result, stop_before_delay

from trialforge.envserver.protocol import CloseRequest, Reset, ResetRequest, StepRequest, StepResult, Verdict

_M = TypeVar("_M", bound=BaseModel)


class EnvServerError(RuntimeError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"environment server answered {status}: {detail}")
        self.status = status
        self.detail = detail


_BUSY = (429, 503)  # full; or the episode's sandbox did not start (reset again)


def _patience(max_wait_s: float) -> dict[str, Any]:
    """tenacity's arguments: a busy answer is asked again after its Retry-After, until waiting once more would
    pass ``max_wait_s``; then the last answer is the result (``_parse`` raises its status). Transport errors
    are not retried."""
    return {
        "retry": retry_if_result(lambda response: response.status_code in _BUSY),
        "wait": _retry_after,
        "stop": stop_before_delay(max_wait_s),
        "retry_error_callback": _last_answer,
    }


def _retry_after(state: RetryCallState) -> float:
    assert state.outcome is not None  # tenacity waits only after an attempt answered busy
    return float(state.outcome.result().headers.get("Retry-After", "1"))


def _last_answer(state: RetryCallState) -> httpx.Response:
    assert state.outcome is not None
    return state.outcome.result()


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
        response = Retrying(**_patience(self.max_wait_s))(self.http.post, path, json=body)
        return _parse(response, model)

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
        response = await AsyncRetrying(sleep=anyio.sleep, **_patience(self.max_wait_s))(self.http.post, path, json=body)
        return _parse(response, model)

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
