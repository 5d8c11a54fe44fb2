"""`create_app`: the FastAPI app over one `Engine` — routers, error handlers, limits, metrics, lifespan.

It serves one `MemoryPool`, of one model (or the `PoolConfig` of one) or of several.

>>> from agentmem import PoolConfig
>>> from agentmem.server import ServerSettings, create_app
>>> app = create_app(PoolConfig(n_ctx=4096), settings=ServerSettings(port=8080))  # doctest: +SKIP

Run it with uvicorn (`agentmem serve` does), or drive it in-process with
`httpx.AsyncClient(transport=httpx.ASGITransport(app))` for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentmem.config import PoolConfig
from agentmem.errors import AgentMemError
from agentmem.models import MemoryPool
from agentmem.server import agents_api, anthropic_routes, embeddings_api, ollama_routes, openai_routes, responses_api
from agentmem.server.anthropic_schemas import CountTokensRequest, MessagesRequest
from agentmem.server.auth import KeyRing, Principal
from agentmem.server.bodies import document_bodies
from agentmem.server.deps import engine, principal
from agentmem.server.engine import Engine
from agentmem.server.http_errors import ApiError, error_body, from_exception
from agentmem.server.idempotency import Replayed, Replays
from agentmem.server.metrics import CONTENT_TYPE, request_model
from agentmem.server.ollama_schemas import ChatRequest as OllamaChat
from agentmem.server.ollama_schemas import GenerateRequest as OllamaGenerate
from agentmem.server.responses_schemas import ResponseCreateRequest
from agentmem.server.responses_store import ResponseStore
from agentmem.server.schemas import ChatCompletionRequest, CompletionRequest
from agentmem.server.settings import ServerSettings

__all__ = ["BodyLimit", "create_app"]

logger = logging.getLogger(__name__)


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` gets 413 before the app sees it.

    The body is read (bounded) and replayed to the app; later `receive` calls go to the
    client, so disconnects are still seen while a response streams.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def _too_large(self, send: Send) -> None:
        body = json.dumps(error_body(413, f"the request body exceeds {self.max_bytes} bytes", code="request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class _CountRequests:
    """ASGI middleware: counts answers by model, route template and status (`agentmem_requests_total`).

    The model is the one the request was seated on (`metrics.note_model`, below this middleware).
    """

    def __init__(self, app: ASGIApp, *, owner: FastAPI) -> None:
        self.app, self.owner = app, owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def counting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with request_model() as model:
            try:
                await self.app(scope, receive, counting)
            finally:
                route = scope.get("route")
                path = getattr(route, "path", None) or "unmatched"
                eng: Engine | None = getattr(self.owner.state, "engine", None)
                if eng is not None:
                    eng.metrics.observe_request(path, status, model=model[0] if model else None)


def _install_handlers(app: FastAPI) -> None:
    def answer(err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return answer(exc)

    @app.exception_handler(Replayed)
    async def _replayed(_: Request, exc: Replayed) -> JSONResponse:
        return exc.response()

    @app.exception_handler(AgentMemError)
    async def _agentmem(_: Request, exc: AgentMemError) -> JSONResponse:
        return answer(from_exception(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        field = ".".join(loc) or None
        return answer(ApiError(400, f"{field or 'body'}: {first.get('msg', 'invalid request')}", code="invalid_request",
                               param=field))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return answer(ApiError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def _fault(_: Request, exc: Exception) -> JSONResponse:
        return answer(from_exception(exc))


def create_app(
    pool_or_config: MemoryPool | PoolConfig,
    *,
    settings: ServerSettings | None = None,
    keys: KeyRing | None = None,
    own_pool: bool | None = None,
    replica: Any = None,
) -> FastAPI:
    """The server app over one pool; `app.state.engine` is its `Engine`.

    Args:
        pool_or_config: an open `MemoryPool` (the caller keeps closing it, unless `own_pool`), a
            `PoolConfig` the app opens at startup and closes at shutdown (with `archive_path`,
            the close checkpoints every agent and the next start resumes them), or an open
            `MemoryPool` of several models: a request's `model` picks one (`registry.Models`).
        settings: server settings (defaults: `ServerSettings()`).
        keys: API keys (default: none, an open server).
        own_pool: close a given pool at shutdown too.
        replica: cluster mode: the `agentmem.cluster.Replica` of the pool (its leases).
    """
    settings = settings or ServerSettings()
    keys = keys or KeyRing()
    eng = Engine(pool_or_config, settings, own_pool=own_pool, replica=replica, tenants=keys.tenant_prefixes())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await eng.start()
        logger.info("agentmem serve: %s ready", eng.banner)
        try:
            yield
        finally:
            await eng.stop()

    docs = settings.api_docs  # off by default (#33 M3: they answered without a key)
    app = FastAPI(title="agentmem", summary="OpenAI-compatible server where every agent keeps its KV memory",
                  lifespan=lifespan, docs_url="/docs" if docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if docs else None)
    app.state.engine = eng
    app.state.keys = keys
    app.state.settings = settings
    app.state.responses = ResponseStore()  # POST /v1/responses keeps its responses here
    app.state.replays = Replays()  # answers kept for retries that send Idempotency-Key (bodies.json_body)
    _install_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(responses_api.router)
    app.include_router(anthropic_routes.router)
    app.include_router(ollama_routes.router)
    app.include_router(agents_api.router)
    document_bodies(app, [ChatCompletionRequest, CompletionRequest, ResponseCreateRequest, MessagesRequest,
                          CountTokensRequest, OllamaChat, OllamaGenerate, embeddings_api.EmbeddingsRequest])
    app.include_router(embeddings_api.router)

    @app.get("/metrics")
    async def metrics(who: Principal = Depends(principal), e: Engine = Depends(engine)) -> Response:
        """Prometheus text (admin keys only when keys are configured, unless `metrics_public`)."""
        if not (who.admin or settings.metrics_public):
            raise ApiError(403, "metrics need an admin key", code="forbidden")
        return Response(await asyncio.to_thread(e.metrics.render), media_type=CONTENT_TYPE)

    if replica is not None:
        from agentmem.cluster.replica import ReplicaHeader

        app.add_middleware(ReplicaHeader, replica_id=replica.owner)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(_CountRequests, owner=app)  # outermost: counts the 413s too
    return app

