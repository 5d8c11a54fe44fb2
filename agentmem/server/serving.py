"""What every HTTP front-end shares: agent resolution, admission, disconnect watching, SSE.

A front-end (OpenAI chat completions, the Responses API, Anthropic Messages, Ollama)
turns its request into a prepared `PoolCall`, then hands it to `respond` with two
renderers: `reply` (an `Outcome` to the JSON body) and `render` (one `Event` to SSE or
NDJSON chunks). A stream starts only once the call has produced its first event, so
every error before the first token (a bad message, a prompt over the context) is a
proper HTTP error; a later one ends the stream the way `error_chunk` says.

Disconnects cancel work: until a response starts (a whole non-streaming call, a stream's
prefill up to its first event) `respond` watches `request.is_disconnected()`; a client
gone cancels the call, which stops in the pool at its next prefill chunk or decode step.
Once a stream runs, `SSEResponse` notices the disconnect and closes it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agentmem.server import responses as R
from agentmem.server.auth import end_user_space
from agentmem.server.call_request import CallRequest
from agentmem.server.engine import Engine, Event, Outcome
from agentmem.server.http_errors import from_exception
from agentmem.server.identity import AGENT_HEADER, agent_header, end_user, resolve_agent_id
from agentmem.server.queue import Lease
from agentmem.server.registry import Target

__all__ = ["SSEResponse", "admitted", "find_agent", "off_loop", "respond", "with_agent"]

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


def _openai_error(exc: Exception) -> list[bytes]:
    """An error after the first token, the OpenAI way: an `error` event, then `[DONE]`."""
    return [R.sse(from_exception(exc).body()), R.DONE]


async def _sse(eng: Engine, first: Event, events: AsyncIterator[Event], lease: Lease, head: list[bytes],
               render: Any, done: list[bytes], error_chunk: Callable[[Exception], list[bytes]],
               ) -> AsyncIterator[bytes]:
    """The stream body: `head`, `render`'s chunks for each event, then `done` (or `error_chunk`'s)."""
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
        for chunk in done:
            yield chunk
    except Exception as exc:  # after the first token: tell the client in the stream
        finished = True
        for chunk in error_chunk(exc):
            yield chunk
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


@contextlib.asynccontextmanager
async def admitted(request: Request) -> AsyncIterator[Lease]:
    """The request's admission lease (`bodies.json_body` took it before decoding the body: #33 F1),
    released if the block raises.

    On success the lease belongs to `respond`, which releases it with the response (a
    stream: when it ends), or to the route.
    """
    lease: Lease = request.state.lease
    try:
        yield lease
    except BaseException:
        lease.release()
        raise


async def off_loop(fn: Callable[..., _T], *args: Any) -> _T:
    """`fn(*args)` in a worker thread: converting a large body (#33 F1: 120,000 Responses items took
    ~4.9 s on the event loop and stalled every other tenant's `/health`) never blocks the loop."""
    return await asyncio.to_thread(fn, *args)


async def find_agent(eng: Engine, lease: Lease, request: Request, req: CallRequest,
                     *, end_user_field: str | None = None, end_user_name: str = "user") -> Target:
    """The agent the request names, else (`--anonymous lines`) the line its prompt continues, claimed;
    with the lease on its model (the request's `model`, the agent's, or the default: the one place
    a request's model is chosen). Both end with the admission `lease` (`respond` releases it).

    With `--end-users` the request's end user (`X-End-User`, else `end_user_field`: the body's
    `user` unless given, Anthropic's `metadata.user_id`) scopes its lines and its per-key agent
    (`auth.end_user_space`), and `user` names no agent.
    """
    who = lease.principal
    model = eng.models.choose(req.model)
    space, user = None, req.user
    if eng.settings.end_users:
        field = req.user if end_user_field is None else end_user_field
        name = end_user(request.headers, field, name=end_user_name)
        space, user = (end_user_space(who, name) if name else None), None
    named = resolve_agent_id(who, header=agent_header(request.headers), user=user, extension=req.agent_id,
                             anonymous=eng.settings.anonymous, model=eng.models.per_key_model(model), space=space)
    target = await eng.seat(named, model) if named is not None else await eng.find_line(who, req, model, space=space)
    lease.then(target.release)
    return target


def with_agent(response: Response, agent_id: str) -> Response:
    """`response` with the `X-Agent-Id` header (UTF-8 bytes, as the request header is read)."""
    response.raw_headers.append((AGENT_HEADER.lower().encode("ascii"), agent_id.encode("utf-8")))
    return response


async def respond(
    eng: Engine, lease: Lease, target: Target, request: Request, prepare: Callable[[], Awaitable[Any]],
    stream: bool, *,
    reply: Callable[[Outcome], dict[str, Any]], render: Callable[[Event], list[bytes]], head: list[bytes],
    done: list[bytes] | None = None,
    error_chunk: Callable[[Exception], list[bytes]] = _openai_error, media_type: str = "text/event-stream",
) -> Any:
    """Run a prepared call under the request's admission `lease` (`admitted`): one JSON reply, or an SSE
    stream that releases the lease at its end.

    Until the response starts, a client that disconnects cancels the call (`_unless_gone`).
    The response names its agent in the `X-Agent-Id` header; the target's line claim and
    model lease end with the admission lease (the model stays loaded until the stream ends).
    A stream ends with `done` (OpenAI's `[DONE]` unless given); an error after its first
    chunk becomes `error_chunk(exc)`; `media_type` is `application/x-ndjson` for Ollama.
    """
    agent_id = target.agent_id
    await eng.admit_call(lease, target)
    streaming = False
    events: AsyncIterator[Event] | None = None

    async def until_first() -> Any:
        nonlocal events
        call = await prepare()
        if not stream:
            return await eng.collect(call, target)
        events = eng.run(call, target)
        return await _start(events)

    try:
        out = await _unless_gone(request, until_first())
        if not stream:
            body = reply(out)
            replay = getattr(request.state, "replay", None)
            if replay is not None:  # kept for the retries that send the same Idempotency-Key
                request.app.state.replays.save(replay, body, agent_id)
            return with_agent(JSONResponse(body), agent_id)
        assert events is not None
        streaming = True  # the stream releases the lease
    except _ClientGone:
        eng.metrics.observe_disconnect()
        return Response(status_code=499)  # nobody reads it: nginx's "client closed request"
    finally:
        if not streaming:
            lease.release()
    body = _sse(eng, out, events, lease, head, render, [R.DONE] if done is None else done, error_chunk)
    return with_agent(SSEResponse(body, media_type=media_type), agent_id)
