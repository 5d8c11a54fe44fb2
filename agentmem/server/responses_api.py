"""The OpenAI Responses API: `POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`, `.../input_items`.

A validated request becomes the engine's chat request (`responses_schemas.to_chat`) and runs
through the engine exactly as `/v1/chat/completions` does (`serving.respond`); the
`Outcome` becomes a `response` object — a `message` item with `output_text` and/or
`function_call` items — or, streaming, OpenAI's typed events (`event:` lines, each with
its `sequence_number`): `response.created`, `response.in_progress`, then per output
item `response.output_item.added`, `response.content_part.added`,
`response.output_text.delta`… `.done`, or `response.function_call_arguments.delta`/`.done`,
`response.output_item.done`, and last `response.completed` (`response.incomplete` when
`max_output_tokens` cut the reply). There is no `[DONE]` line, as with OpenAI.

**`previous_response_id`** continues a stored response (`responses_store`): its
conversation (input and output items) comes first, the new input after it, and the
call runs as the same agent — whose KV already holds that conversation, so
`usage.input_tokens_details.cached_tokens` covers it. An id from another scope (another
tenant's key) is a 404 with the same body as an unknown one. An agent named by the
request (`X-Agent-Id`, `user`, `agent_id`) wins; without either, the request is served
by the conversation line its prompt continues (`serving.find_agent`), as chat
completions is. `store: false` answers without keeping the response.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal

from fastapi import APIRouter, Depends, Query, Request

from agentmem.errors import ConfigError
from agentmem.server.auth import Principal
from agentmem.server.bodies import body_schema, json_body
from agentmem.server.call_request import ChatCallRequest
from agentmem.server.deps import engine, principal
from agentmem.server.engine import Engine, Event, Outcome
from agentmem.server.http_errors import ApiError, from_exception
from agentmem.server.identity import agent_header, authorize, resolve_agent_id
from agentmem.server.responses_schemas import (
    ResponseCreateRequest,
    ResponsesInputError,
    new_item_id,
    normalize_input,
    public_tools,
    rename_field,
    to_chat,
)
from agentmem.server.queue import Lease
from agentmem.server.registry import Target
from agentmem.server.responses_store import ResponseStore, StoredResponse, scope_of
from agentmem.server.serving import admitted, find_agent, off_loop, respond

__all__ = ["router", "store_of"]

router = APIRouter()


def store_of(request: Request) -> ResponseStore:
    """The app's response store (made on first use when the app has none)."""
    state = request.app.state
    store = getattr(state, "responses", None)
    if store is None:
        store = state.responses = ResponseStore()
    return store


def _not_found(rid: str, param: str | None = None) -> ApiError:
    """The one 404 for an id that is unknown, deleted, not stored or another scope's."""
    return ApiError(404, f"no response with id {rid!r}", code="response_not_found", param=param)


@contextlib.contextmanager
def _responses_fields() -> Iterator[None]:
    """Errors of the chat call named by the Responses field (`response_format` → `text.format`)."""
    try:
        yield
    except ResponsesInputError:
        raise
    except ApiError as exc:
        exc.param = rename_field(exc.param)
        raise
    except ConfigError as exc:
        field = rename_field(getattr(exc, "field", None)) or _guess_field(str(exc))
        raise ResponsesInputError(str(exc).removeprefix(f"{field}: "), field=field) from exc


_MESSAGE_FIELDS = (("tool_choice", "tool_choice"), ("tools", "tools"), ("max_tokens", "max_output_tokens"),
                   ("stop", "stop"), ("response_format", "text.format"))


def _guess_field(message: str) -> str:
    """The Responses field a chat call's error message starts with (`input` when none)."""
    return next((name for prefix, name in _MESSAGE_FIELDS if message.startswith(prefix)), "input")


# ---------------------------------------------------------------------------- response bodies
@dataclass
class _Turn:
    """One `POST /v1/responses`: what its response echoes, and what it stores."""

    req: ResponseCreateRequest
    model: str
    history: list[dict[str, Any]]
    own: list[dict[str, Any]]
    store: ResponseStore
    scope: str
    agent_id: str = ""
    rid: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))
    msg_id: str = field(default_factory=lambda: new_item_id("msg"))

    def body(self, status: str, output: list[dict[str, Any]], out: Outcome | None) -> dict[str, Any]:
        """The `response` object in `status` with `output` (usage and `agentmem` once `out` is known)."""
        req = self.req
        fmt = (req.text or {}).get("format") or {"type": "text"}
        body: dict[str, Any] = {
            "id": self.rid, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "max_tool_calls": None, "model": self.model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "store": req.store, "temperature": 0.0 if req.temperature is None else req.temperature,
            "text": {"format": fmt}, "tool_choice": req.tool_choice or "auto", "tools": public_tools(req),
            "top_p": 1.0 if req.top_p is None else req.top_p, "truncation": "disabled", "usage": None,
            "user": req.user, "metadata": req.metadata or {},
        }
        if out is not None:
            if out.finish_reason == "length":
                body["status"] = "incomplete"
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            body["usage"] = _usage(out)
            body["agentmem"] = out.extension()
        return body

    def output(self, out: Outcome, streamed: str | None) -> list[dict[str, Any]]:
        """The output items of `out`: its text (what was streamed, when it was) and its calls."""
        items: list[dict[str, Any]] = []
        text = streamed if streamed is not None else out.reply.content
        if text or not out.reply.tool_calls:
            items.append(_message(self.msg_id, text or "", "completed"))
        for call in out.reply.tool_calls:
            items.append({"type": "function_call", "id": new_item_id("fc"), "call_id": call["id"],
                          "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                          "status": "completed"})
        return items

    def finish(self, out: Outcome, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The finished response; stored (unless `store: false`) for GET and `previous_response_id`."""
        body = self.body("completed", output, out)
        if self.req.store:
            n = len(self.history)
            self.store.put(self.scope, StoredResponse(body, [*self.history, *self.own, *output], n, n + len(self.own),
                                                      self.agent_id))
        return body


def _usage(out: Outcome) -> dict[str, Any]:
    u = out.usage()
    return {"input_tokens": u["prompt_tokens"], "input_tokens_details": u["prompt_tokens_details"],
            "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"]}


def _message(msg_id: str, text: str, status: str) -> dict[str, Any]:
    content = [_text_part(text)] if status == "completed" else []
    return {"type": "message", "id": msg_id, "status": status, "role": "assistant", "content": content}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


# ---------------------------------------------------------------------------- streaming events
class _Events:
    """The SSE events of one streamed response, numbered in order (`sequence_number`)."""

    def __init__(self, turn: _Turn) -> None:
        self.turn = turn
        self.seq = 0
        self.text: list[str] | None = None  # the message's text once its item is open

    def event(self, kind: str, **data: Any) -> bytes:
        """`event: kind` and its `data:` line (`type` and `sequence_number` first)."""
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return (b"event: " + kind.encode() + b"\ndata: "
                + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")

    def head(self) -> list[bytes]:
        """`response.created` and `response.in_progress`."""
        skeleton = self.turn.body("in_progress", [], None)
        return [self.event("response.created", response=skeleton), self.event("response.in_progress", response=skeleton)]

    def render(self, ev: Event) -> list[bytes]:
        """The events of one engine event: a text delta, or every closing event."""
        kind, value = ev
        if kind == "text":
            assert isinstance(value, str)
            return self._delta(value)
        assert isinstance(value, Outcome)
        return self._finish(value)

    def _open_message(self) -> list[bytes]:
        self.text = []
        msg_id = self.turn.msg_id
        return [self.event("response.output_item.added", output_index=0, item=_message(msg_id, "", "in_progress")),
                self.event("response.content_part.added", item_id=msg_id, output_index=0, content_index=0,
                           part=_text_part(""))]

    def _delta(self, piece: str) -> list[bytes]:
        chunks = self._open_message() if self.text is None else []
        assert self.text is not None
        self.text.append(piece)
        chunks.append(self.event("response.output_text.delta", item_id=self.turn.msg_id, output_index=0,
                                 content_index=0, delta=piece, logprobs=[]))
        return chunks

    def _finish(self, out: Outcome) -> list[bytes]:
        """Close the message, send the calls, then `response.completed` (or `response.incomplete`)."""
        items = self.turn.output(out, None if self.text is None else "".join(self.text))
        chunks: list[bytes] = []
        for index, item in enumerate(items):
            if item["type"] == "message":
                chunks += self._close_message(item)
            else:
                chunks += self._call(index, item)
        body = self.turn.finish(out, items)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        chunks.append(self.event(kind, response=body))
        return chunks

    def _close_message(self, item: dict[str, Any]) -> list[bytes]:
        text = item["content"][0]["text"]
        chunks = []
        if self.text is None:  # nothing streamed (an empty reply): open it now
            chunks += self._open_message()
            if text:
                chunks += self._delta(text)
        msg_id = item["id"]
        return chunks + [
            self.event("response.output_text.done", item_id=msg_id, output_index=0, content_index=0, text=text,
                       logprobs=[]),
            self.event("response.content_part.done", item_id=msg_id, output_index=0, content_index=0,
                       part=_text_part(text)),
            self.event("response.output_item.done", output_index=0, item=item),
        ]

    def _call(self, index: int, item: dict[str, Any]) -> list[bytes]:
        args = item["arguments"]
        return [
            self.event("response.output_item.added", output_index=index,
                       item={**item, "arguments": "", "status": "in_progress"}),
            self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=args),
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                       name=item["name"], arguments=args),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def error(self, exc: Exception) -> list[bytes]:
        """An error after the stream started: OpenAI's `error` event (the stream ends there)."""
        err = from_exception(exc)
        return [self.event("error", code=err.code, message=err.message, param=err.param)]


# ---------------------------------------------------------------------------- routes
async def _agent_of(eng: Engine, lease: Lease, request: Request, chat: ChatCallRequest,
                    prev: StoredResponse | None) -> Target:
    """The agent: one the request names, else the previous response's, else the line its prompt continues."""
    if prev is None:
        return await find_agent(eng, lease, request, chat)
    who = lease.principal
    model = eng.models.choose(chat.model)
    user = None if eng.settings.end_users else chat.user  # --end-users: `user` is the end user, not the agent
    named = resolve_agent_id(who, header=agent_header(request.headers), user=user, extension=chat.agent_id,
                             anonymous="lines")  # "lines": None when none is named (the previous one is)
    agent_id = named if named is not None else authorize(who, prev.agent_id, field="previous_response_id")
    target = await eng.seat(agent_id, model)
    lease.then(target.release)
    return target


def _convert(req: ResponseCreateRequest, history: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                                 ChatCallRequest]:
    """`input` as items, and the chat request of the history and them (blocking: run off the event loop)."""
    own = normalize_input(req.input)
    with _responses_fields():
        return own, to_chat(req, [*history, *own])


@router.post("/v1/responses", openapi_extra=body_schema(ResponseCreateRequest))
async def create_response(
        request: Request, req: ResponseCreateRequest = Depends(json_body(ResponseCreateRequest, "input")),
        eng: Engine = Depends(engine)) -> Any:
    """OpenAI Responses: one model turn over `input` (after `previous_response_id`'s conversation).

    Admitted first (#33 F1); `input` is converted in a worker thread, never on the event loop.
    """
    async with admitted(request) as lease:
        return await _create(eng, lease, request, req)


async def _create(eng: Engine, lease: Lease, request: Request, req: ResponseCreateRequest) -> Any:
    store, scope = store_of(request), scope_of(lease.principal)
    prev = None
    if req.previous_response_id is not None:
        prev = store.get(scope, req.previous_response_id)
        if prev is None:
            raise _not_found(req.previous_response_id, "previous_response_id")
    history = list(prev.items) if prev is not None else []
    own, chat = await off_loop(_convert, req, history)
    turn = _Turn(req, eng.model_name, history, own, store, scope)
    with _responses_fields():
        target = await _agent_of(eng, lease, request, chat, prev)
    turn.agent_id, turn.model = target.agent_id, target.model

    async def prepare() -> Any:
        with _responses_fields():
            return await eng.prepare_chat(target, chat)

    events = _Events(turn)
    return await respond(
        eng, lease, target, request, prepare, req.stream,
        reply=lambda out: turn.finish(out, turn.output(out, None)),
        render=events.render, head=events.head() if req.stream else [], done=[], error_chunk=events.error,
    )


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
    """A stored response (404: unknown, deleted, `store: false`, or another scope's)."""
    entry = store_of(request).get(scope_of(who), response_id)
    if entry is None:
        raise _not_found(response_id)
    return entry.response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request, who: Principal = Depends(principal)) -> dict[str, Any]:
    """Forget a stored response (its agent's KV stays: `/agents` manages that)."""
    if not store_of(request).delete(scope_of(who), response_id):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(response_id: str, request: Request, who: Principal = Depends(principal),
                      limit: int = Query(default=20, ge=1, le=100), order: Literal["asc", "desc"] = "desc",
                      after: str | None = Query(default=None, max_length=256)) -> dict[str, Any]:
    """The input items a stored response was sent (not its previous responses'), a page at a time."""
    entry = store_of(request).get(scope_of(who), response_id)
    if entry is None:
        raise _not_found(response_id)
    items = entry.own_input if order == "asc" else entry.own_input[::-1]
    if after is not None:
        ids = [it["id"] for it in items]
        if after not in ids:
            raise ApiError(400, f"after: no input item {after!r} in this response", code="invalid_request",
                           param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
