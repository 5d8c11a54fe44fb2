"""The OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`.

Each route resolves the agent, takes a concurrency slot, prepares the call and runs it
through the `Engine`. A stream starts only once the call has produced its first event,
so every error before the first token (a bad message, a prompt over the context) is a
proper HTTP error; a later one ends the stream with an `error` event.

Disconnects cancel work: until a response starts (a whole non-streaming call, a stream's
prefill up to its first event) the route watches `request.is_disconnected()`; a client
gone cancels the call, which stops in the pool at its next prefill chunk or decode step.
Once a stream runs, `SSEResponse` notices the disconnect and closes it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agentmem.server import responses as R
from agentmem.server.auth import Principal
from agentmem.server.deps import engine, principal
from agentmem.server.engine import Engine, Event, Outcome
from agentmem.server.http_errors import from_exception
from agentmem.pool.lines import Line
from agentmem.server.identity import AGENT_HEADER, agent_header, resolve_agent_id
from agentmem.server.queue import Lease
from agentmem.server.schemas import ChatCompletionRequest, CompletionRequest

__all__ = ["SSEResponse", "router"]

logger = logging.getLogger(__name__)

router = APIRouter()

_T = TypeVar("_T")
_POLL_S = 0.05  # how often a call waiting for its first event checks that its client is still there


class _ClientGone(Exception):
    """The client disconnected before the response started (the call was cancelled)."""


class SSEResponse(StreamingResponse):
    """A `text/event-stream` response that notices a client going away at once.

    It listens for `http.disconnect` while it streams (whatever the ASGI version), and
    always closes its body iterator, which stops the agent's generation.
    """

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    with contextlib.suppress(OSError):
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


async def _start(events: AsyncIterator[Event]) -> Event:
    """The first event of a call (errors before it become HTTP errors)."""
    try:
        return await anext(events)
    except BaseException:
        await events.aclose()
        raise


async def _sse(eng: Engine, first: Event, events: AsyncIterator[Event], lease: Lease, head: list[bytes],
               render: Any) -> AsyncIterator[bytes]:
    """The SSE body: `head`, one event per text piece, the tail events, `[DONE]`."""
    finished = False
    try:
        for chunk in head:
            yield chunk
        event: Event | None = first
        while event is not None:
            for chunk in render(event):
                yield chunk
            event = await anext(events, None)
        finished = True
        yield R.DONE
    except Exception as exc:  # after the first token: tell the client in the stream
        finished = True
        yield R.sse(from_exception(exc).body())
        yield R.DONE
    finally:
        if not finished:
            eng.metrics.observe_disconnect()
        await events.aclose()
        lease.release()


async def _unless_gone(request: Request, work: Awaitable[_T]) -> _T:
    """`await work`, cancelling it when the client disconnects first (raises `_ClientGone` then)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise _ClientGone
    finally:
        if not task.done():
            task.cancel()  # the pool call stops at its next prefill chunk or decode step
            with contextlib.suppress(BaseException):
                await task


async def _agent(eng: Engine, who: Principal, request: Request,
                 req: ChatCompletionRequest | CompletionRequest) -> tuple[str, Line | None]:
    """The agent the request names, else (`--anonymous lines`) the line its prompt continues, claimed."""
    named = resolve_agent_id(who, header=agent_header(request.headers), user=req.user, extension=req.agent_id,
                             anonymous=eng.settings.anonymous)
    if named is not None:
        return named, None
    line = await eng.find_line(who, req)
    return line.agent_id, line


def _with_agent(response: Response, agent_id: str) -> Response:
    """`response` with the `X-Agent-Id` header (UTF-8 bytes, as the request header is read)."""
    response.raw_headers.append((AGENT_HEADER.lower().encode("ascii"), agent_id.encode("utf-8")))
    return response


async def _respond(
    eng: Engine, who: Principal, agent_id: str, request: Request, prepare: Callable[[], Awaitable[Any]],
    stream: bool, *,
    reply: Callable[[Outcome], dict[str, Any]], render: Callable[[Event], list[bytes]], head: list[bytes],
    line: Line | None = None,
) -> Any:
    """Run a prepared call: one JSON reply, or an SSE stream that releases the admission lease at its end.

    Until the response starts, a client that disconnects cancels the call (`_unless_gone`).
    The response names its agent in the `X-Agent-Id` header; `line`'s claim ends with the lease.
    """
    lease = await eng.admit_call(who, agent_id, line=line)
    streaming = False
    events: AsyncIterator[Event] | None = None

    async def until_first() -> Any:
        nonlocal events
        call = await prepare()
        if not stream:
            return await eng.collect(call)
        events = eng.run(call)
        return await _start(events)

    try:
        out = await _unless_gone(request, until_first())
        if not stream:
            return _with_agent(JSONResponse(reply(out)), agent_id)
        assert events is not None
        streaming = True  # the stream releases the lease
    except _ClientGone:
        eng.metrics.observe_disconnect()
        return Response(status_code=499)  # nobody reads it: nginx's "client closed request"
    finally:
        if not streaming:
            lease.release()
    return _with_agent(SSEResponse(_sse(eng, out, events, lease, head, render)), agent_id)


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request, who: Principal = Depends(principal),
                           eng: Engine = Depends(engine)) -> Any:
    """OpenAI chat completions, streaming (SSE) or not, with tools and structured output."""
    agent_id, line = await _agent(eng, who, request, req)
    kind = line.kind if line is not None else ""
    ids = R.Ids("chatcmpl", eng.model_name)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def render(event: Event) -> list[bytes]:
        kind, value = event
        if kind == "text":
            return [R.sse(R.chat_chunk(ids, {"content": value}))]
        assert isinstance(value, Outcome)
        return [R.sse(c) for c in R.chat_tail(ids, value, include_usage)]

    return await _respond(
        eng, who, agent_id, request, lambda: eng.prepare_chat(agent_id, req, kind), bool(req.stream),
        reply=lambda out: R.chat_completion(ids, out),
        render=render, head=[R.sse(R.chat_chunk(ids, {"role": "assistant", "content": ""}))], line=line,
    )


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request, who: Principal = Depends(principal),
                      eng: Engine = Depends(engine)) -> Any:
    """OpenAI (legacy) completions: a raw prompt continued in the agent's context."""
    agent_id, line = await _agent(eng, who, request, req)
    kind = line.kind if line is not None else ""
    ids = R.Ids("cmpl", eng.model_name)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def render(event: Event) -> list[bytes]:
        kind, value = event
        if kind == "text":
            return [R.sse(R.completion_chunk(ids, value))]
        assert isinstance(value, Outcome)
        out = [R.sse(R.completion_chunk(ids, "", value.finish_reason, agentmem=value.extension()))]
        if include_usage:
            out.append(R.sse({**ids.head("text_completion"), "choices": [], "usage": value.usage()}))
        return out

    return await _respond(
        eng, who, agent_id, request, lambda: eng.prepare_completion(agent_id, req, kind), bool(req.stream),
        reply=lambda out: R.completion(ids, out),
        render=render, head=[], line=line,
    )


@router.get("/v1/models")
async def models(who: Principal = Depends(principal), eng: Engine = Depends(engine)) -> dict[str, Any]:
    """The one model this server runs."""
    del who
    return {"object": "list", "data": [{"id": eng.model_name, "object": "model", "created": 0, "owned_by": "agentmem"}]}


@router.get("/health")
async def health(eng: Engine = Depends(engine)) -> JSONResponse:
    """`{"status": "ok"}` when calls can be served; 503 while loading or shutting down (no key needed).

    `{"status": "degraded", "archive": "full"}` (still 200: the process serves calls from RAM, and
    restarting it would lose the agents the archive could not take) while the archive's storage
    refuses writes; it is `ok` again once a write commits.
    """
    if eng.ready:
        assert eng.pool is not None
        if eng.pool.storage_fault:
            return JSONResponse({"status": "degraded", "archive": "full",
                                 "error": {"code": "insufficient_storage",
                                           "message": "the archive's storage is full; agents are kept in RAM"}})
        return JSONResponse({"status": "ok"})
    status = "shutting down" if eng.queue.closing else "loading model"
    return JSONResponse({"status": status, "error": {"code": 503, "message": status}}, status_code=503)
