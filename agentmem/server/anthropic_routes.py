"""The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

A validated Messages request is converted once to the engine's chat request (`anthropic_schemas`),
then served like a chat completion (`serving.respond`: the same agent resolution, pool,
tool formats and streaming), and answered in Anthropic's shapes (`anthropic_responses`):
a `message` object or its event stream, errors as `{"type": "error", "error": {...}}`.

The official client works with only `base_url` changed:

>>> import anthropic  # doctest: +SKIP
>>> client = anthropic.Anthropic(base_url="http://127.0.0.1:8000", api_key="sk-team-a")  # doctest: +SKIP

It sends its key as `x-api-key`, which the server reads as it reads `Authorization: Bearer`.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Depends, Request

from agentmem.server import anthropic_responses as A
from agentmem.server.anthropic_schemas import CountTokensRequest, MessagesRequest, to_chat_request
from agentmem.server.bodies import body_schema, json_body
from agentmem.server.call_request import ChatCallRequest
from agentmem.server.deps import engine
from agentmem.server.engine import Engine, Outcome
from agentmem.server.http_errors import ApiError, from_exception
from agentmem.server.queue import Lease
from agentmem.server.registry import Target
from agentmem.server.serving import admitted, find_agent, off_loop, respond
from agentmem.server.wire_errors import shaped_route

__all__ = ["router"]

router = APIRouter(route_class=shaped_route(A.error_body))


def _stream_error(exc: Exception) -> list[bytes]:
    """An error after the stream started: Anthropic's `error` event."""
    return [A.event("error", A.error_body(from_exception(exc)))]


def _matched_stop(target: Target, stops: list[str] | None, out: Outcome) -> str | None:
    """The stop sequence that ended `out`, if one did (the pool drops it from the text).

    The generated tokens still hold the one that completed the stop string; an end of turn
    leaves none of the stop strings in them.
    """
    if not stops or out.finish_reason != "stop" or target.pool.closed:
        return None
    model = target.pool.model
    text = b"".join(model.token_bytes(t) for t in out.results[-1].tokens).decode("utf-8", "replace")
    found = [(text.find(s), s) for s in stops if s in text]
    return min(found)[1] if found else None


@router.post("/v1/messages", openapi_extra=body_schema(MessagesRequest))
async def messages(
        request: Request, req: MessagesRequest = Depends(json_body(MessagesRequest, "messages")),
        eng: Engine = Depends(engine)) -> Any:
    """Anthropic Messages, streaming (SSE events) or not, with client tools."""
    async with admitted(request) as lease:
        chat = await off_loop(to_chat_request, req)
        return await _messages(eng, lease, request, req, chat)


async def _messages(eng: Engine, lease: Lease, request: Request, req: MessagesRequest,
                    chat: ChatCallRequest) -> Any:
    target = await find_agent(eng, lease, request, chat, end_user_name="metadata.user_id",
                              end_user_field=req.metadata.user_id if req.metadata is not None else None)
    msg_id = A.new_id("msg")
    stop_of = functools.partial(_matched_stop, target, req.stop_sequences)
    stream = A.MessageStream(msg_id, target.model, stop_of)
    return await respond(
        eng, lease, target, request, lambda: eng.prepare_chat(target, chat), req.stream,
        reply=lambda out: A.message(msg_id, target.model, out, stop_of(out)),
        render=stream.render, head=stream.head(), done=[], error_chunk=_stream_error,
    )


@router.post("/v1/messages/count_tokens", openapi_extra=body_schema(CountTokensRequest))
async def count_tokens(
        request: Request, req: CountTokensRequest = Depends(json_body(CountTokensRequest, "messages")),
        eng: Engine = Depends(engine)) -> dict[str, int]:
    """`{"input_tokens": N}`: the prompt's size as a Messages call renders it on its model (tools included).

    Admitted like a call (the key's `max_concurrent`, #33 F1): rendering a large prompt is work.
    """
    async with admitted(request) as lease:
        try:
            if not eng.ready:
                raise ApiError(503, "the model is not loaded", code="unavailable")
            return {"input_tokens": await eng.count_tokens(req.model, await off_loop(to_chat_request, req))}
        finally:
            lease.release()
