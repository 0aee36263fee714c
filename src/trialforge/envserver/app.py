"""The HTTP face of the episode hub: four routes, a bearer token, a cap on request bodies.

``GET /health`` answers without the token (for load balancers; it tells only counts). Every other route needs
``Authorization: Bearer TOKEN``. A refused request says why in ``{"detail": ...}``; a full server answers 429
with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trialforge.envserver.protocol import CloseRequest, Health, Reset, ResetRequest, StepRequest, StepResult, Verdict
from trialforge.envserver.sessions import EpisodeHub, HubError
from trialforge.httpserve import BodyCap

EXPIRE_EVERY_S = 5.0  # how often old verdicts are forgotten and ended episodes written


class _Unauthorized(HubError):
    def __init__(self) -> None:
        super().__init__(401, "a valid bearer token is required")


def make_app(hub: EpisodeHub, token: str, max_body_bytes: int) -> FastAPI:
    bearer = HTTPBearer(auto_error=False)

    def authorized(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise _Unauthorized()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def expire() -> None:
            while True:
                await asyncio.sleep(EXPIRE_EVERY_S)
                hub.forget_old()
                await anyio.to_thread.run_sync(hub.flush)  # store writes block; requests must not wait on them

        janitor = asyncio.create_task(expire())
        try:
            yield
        finally:
            janitor.cancel()

    app = FastAPI(title="trialforge environment server", lifespan=lifespan, docs_url=None, redoc_url=None)
    auth = [Depends(authorized)]

    @app.exception_handler(HubError)
    async def refused(request: Request, exc: HubError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
        if isinstance(exc, _Unauthorized):
            headers = {"WWW-Authenticate": "Bearer"}
        return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=headers)

    @app.get("/health")
    async def health() -> Health:
        return Health(live=hub.running, max_live=hub.config.max_live, tasks=len(hub.tasks))

    @app.post("/reset", dependencies=auth)
    async def reset(body: ResetRequest) -> Reset:
        return await hub.reset(body)

    @app.post("/step", dependencies=auth)
    async def step(body: StepRequest) -> StepResult:
        return await hub.step(body)

    @app.post("/close", dependencies=auth)
    async def close(body: CloseRequest) -> Verdict:
        return await hub.close(body.episode_id)

    return BodyCap(app, max_body_bytes, lambda _status, detail: {"detail": detail})  # type: ignore[return-value]
