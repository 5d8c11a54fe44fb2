"""The OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`.

A request's `model` picks the model when the server has several (`serving.find_agent`);
the response's `model` is the one that answered.

Each route converts its validated body once into the engine's call request
(`ChatCompletionRequest.to_call`, `CompletionRequest.to_call`: `call_request`), prepares it
and hands it to `serving.respond` (agent resolution, admission, disconnect watching, SSE):
see `serving.py`. The two routes differ only in their `_Shape`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from agentmem.server import responses as R
from agentmem.server.auth import Principal
from agentmem.server.bodies import body_schema, json_body
from agentmem.server.calls import PoolCall
from agentmem.server.deps import engine, principal
from agentmem.server.engine import Engine, Event, Outcome
from agentmem.server.queue import Lease
from agentmem.server.registry import Target
from agentmem.server.schemas import ChatCompletionRequest, CompletionRequest
from agentmem.server.serving import admitted, find_agent, off_loop, respond

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter()

_MODEL_FIELDS = ("state", "device", "weights_bytes", "ctx_bytes", "agents", "in_use", "loads", "unloads",
                 "prefetch_loads", "last_load_s")
"""What `/v1/models` says of each model, with several (`MemoryPool.models()`; bytes: known once loaded)."""


@dataclass(frozen=True)
class _Shape:
    """How one OpenAI route prepares its call and writes its answer (chat completions or legacy completions)."""

    prefix: str
    prepare: Callable[[Engine, Target, Any], Awaitable[PoolCall]]
    reply: Callable[[R.Ids, Outcome], dict[str, Any]]
    text: Callable[[R.Ids, str], dict[str, Any]]
    tail: Callable[[R.Ids, Outcome, bool], list[dict[str, Any]]]
    head: Callable[[R.Ids], list[dict[str, Any]]]


def _completion_tail(ids: R.Ids, out: Outcome, include_usage: bool) -> list[dict[str, Any]]:
    """The chunks that end a completion stream: the finish reason, then the usage chunk if asked for."""
    chunks = [R.completion_chunk(ids, "", out.finish_reason, agentmem=out.extension())]
    if include_usage:
        chunks.append({**ids.head("text_completion"), "choices": [], "usage": out.usage()})
    return chunks


_CHAT = _Shape("chatcmpl", Engine.prepare_chat, R.chat_completion,
               lambda ids, text: R.chat_chunk(ids, {"content": text}), R.chat_tail, lambda ids: [R.chat_chunk(ids, {"role": "assistant", "content": ""})])
_COMPLETION = _Shape("cmpl", Engine.prepare_completion, R.completion, R.completion_chunk, _completion_tail,
                     lambda ids: [])


@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completions(
        request: Request, req: ChatCompletionRequest = Depends(json_body(ChatCompletionRequest, "messages")),
        eng: Engine = Depends(engine)) -> Any:
    """OpenAI chat completions, streaming (SSE) or not, with tools and structured output."""
    async with admitted(request) as lease:
        return await _serve(eng, lease, request, req, _CHAT)


@router.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
async def completions(
        request: Request, req: CompletionRequest = Depends(json_body(CompletionRequest, "prompt")),
        eng: Engine = Depends(engine)) -> Any:
    """OpenAI (legacy) completions: a raw prompt continued in the agent's context."""
    async with admitted(request) as lease:
        return await _serve(eng, lease, request, req, _COMPLETION)


async def _serve(eng: Engine, lease: Lease, request: Request, body: ChatCompletionRequest | CompletionRequest,
                 shape: _Shape) -> Any:
    """Convert the validated `body` to the engine's call request once, find its agent, answer in `shape`."""
    call = await off_loop(body.to_call)
    target = await find_agent(eng, lease, request, call)
    ids = R.Ids(shape.prefix, target.model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def render(event: Event) -> list[bytes]:
        kind, value = event
        if kind == "text":
            return [R.sse(shape.text(ids, value))]
        assert isinstance(value, Outcome)
        return [R.sse(c) for c in shape.tail(ids, value, include_usage)]

    return await respond(
        eng, lease, target, request, lambda: shape.prepare(eng, target, call), call.stream,
        reply=lambda out: shape.reply(ids, out), render=render, head=[R.sse(c) for c in shape.head(ids)],
    )


_TENANT_FIELDS = ("device",)
"""What a scoped key sees of each model, with several: no state, bytes (known once loaded), loads or calls in
flight, which show other tenants' activity (#33 F6); `agents` counts its own."""


@router.get("/v1/models")
async def models(who: Principal = Depends(principal), eng: Engine = Depends(engine)) -> dict[str, Any]:
    """The one model this server runs; with several, each with its state in an `agentmem` object.

    An admin key sees every model's state, agents, calls in flight and load counts; a scoped key
    sees only what says nothing of other tenants, and its own agents per model.
    """
    if eng.team is None:
        return {"object": "list",
                "data": [{"id": eng.model_name, "object": "model", "created": 0, "owned_by": "agentmem"}]}
    team = eng.team
    default, listed = team.bindings.default, team.models()
    if who.admin:
        rows = [{"default": m["name"] == default, **{k: m[k] for k in _MODEL_FIELDS}} for m in listed]
    else:
        rows = [{"default": m["name"] == default, **{k: m[k] for k in _TENANT_FIELDS},
                 "agents": sum(1 for a in team.bindings.agents(m["name"]) if who.allows(a))} for m in listed]
    return {"object": "list", "data": [
        {"id": m["name"], "object": "model", "created": 0, "owned_by": "agentmem", "agentmem": row}
        for m, row in zip(listed, rows)]}


@router.get("/health")
async def health(eng: Engine = Depends(engine)) -> JSONResponse:
    """`{"status": "ok"}` when calls can be served; 503 while loading or shutting down (no key needed).

    `{"status": "degraded", "archive": "full"}` (still 200: the process serves calls from RAM, and
    restarting it would lose the agents the archive could not take) while the archive's storage
    refuses writes; it is `ok` again once a write commits.
    """
    if eng.ready:
        if eng.storage_fault:
            return JSONResponse({"status": "degraded", "archive": "full",
                                 "error": {"code": "insufficient_storage",
                                           "message": "the archive's storage is full; agents are kept in RAM"}})
        return JSONResponse({"status": "ok"})
    status = "shutting down" if eng.queue.closing else "loading model"
    return JSONResponse({"status": status, "error": {"code": 503, "message": status}}, status_code=503)
