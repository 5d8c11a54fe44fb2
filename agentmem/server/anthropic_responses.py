"""Anthropic Messages response bodies, stream events and error bodies, built from an `Outcome`.

A reply is a `message` object whose `content` holds a `text` block and/or `tool_use`
blocks (`id` `toolu_…`, `input` the parsed arguments). Its `usage` splits the prompt the
way Anthropic's does, so the three add up to the prompt's size:

* `cache_read_input_tokens`: the prompt tokens read from the agent's kept KV (live, parked
  or archived) — OpenAI's `cached_tokens`;
* `input_tokens`: the rest, the tokens prefilled by this call;
* `cache_creation_input_tokens`: 0 — agentmem keeps every prefilled token for the next
  call without a separate write, so nothing is billed as a cache write.

A stream is Anthropic's event sequence: `message_start`, then per block
`content_block_start` / `content_block_delta` (`text_delta`, `input_json_delta`) /
`content_block_stop` (a `ping` after the first block opens), `message_delta` with the
`stop_reason` and the whole usage, `message_stop`; an error after the first event is an
`error` event. Like the OpenAI responses, bodies carry an `agentmem` object.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable

from agentmem.server.engine import Event, Outcome
from agentmem.server.http_errors import ApiError

__all__ = ["MessageStream", "error_body", "event", "message", "stop_reason", "usage"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
_STOPS = {"length": "max_tokens", "stop": "end_turn"}


def new_id(prefix: str) -> str:
    """An Anthropic-style id: `msg_…`, `toolu_…`."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def event(name: str, data: dict[str, Any]) -> bytes:
    """One SSE event with its name: `event: NAME` then `data: {json}`."""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    return f"event: {name}\ndata: ".encode() + body + b"\n\n"


def error_body(err: ApiError) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}`, Anthropic's error shape."""
    kind = _ERROR_TYPES.get(err.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def stop_reason(out: Outcome, stop: str | None) -> str:
    """`tool_use`, `max_tokens`, `stop_sequence` (when `stop` matched) or `end_turn`."""
    if out.reply.tool_calls:
        return "tool_use"
    if stop is not None and out.finish_reason == "stop":
        return "stop_sequence"
    return _STOPS.get(out.finish_reason, "end_turn")


def usage(out: Outcome) -> dict[str, int]:
    """Anthropic `usage`: `input_tokens` prefilled, `cache_read_input_tokens` read from kept KV."""
    u = out.usage()
    cached = u["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": u["prompt_tokens"] - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": u["completion_tokens"]}


def tool_blocks(out: Outcome) -> list[dict[str, Any]]:
    """The reply's calls as `tool_use` blocks (`toolu_` ids, arguments parsed)."""
    return [{"type": "tool_use", "id": new_id("toolu"), "name": c["function"]["name"],
             "input": json.loads(c["function"]["arguments"])} for c in out.reply.tool_calls]


def message(msg_id: str, model: str, out: Outcome, stop: str | None) -> dict[str, Any]:
    """The `message` body of a finished call (`stop`: the stop sequence that ended it, if any)."""
    content: list[dict[str, Any]] = []
    if out.reply.content or not out.reply.tool_calls:
        content.append({"type": "text", "text": out.reply.content or ""})
    content += tool_blocks(out)
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason(out, stop), "stop_sequence": stop if stop_reason(out, stop) == "stop_sequence"
            else None, "usage": usage(out), "agentmem": out.extension()}


class MessageStream:
    """Renders a call's events as Anthropic's stream (one object per stream: it tracks open blocks).

    Args:
        msg_id: the message id.
        model: the model name.
        stop_of: the stop sequence that ended a finished call, if any (`anthropic_routes`).
    """

    def __init__(self, msg_id: str, model: str, stop_of: Callable[[Outcome], str | None]) -> None:
        self.msg_id, self.model, self.stop_of = msg_id, model, stop_of
        self.index = 0
        self.text_open = False

    def head(self) -> list[bytes]:
        """`message_start` (usage comes whole in `message_delta`: the prompt is counted as it runs)."""
        start = {"id": self.msg_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                 "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                           "output_tokens": 0}}
        return [event("message_start", {"type": "message_start", "message": start})]

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        out = [event("content_block_start", start)]
        if self.index == 0:
            out.append(event("ping", {"type": "ping"}))
        return out

    def _close(self) -> bytes:
        closed = event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.index += 1
        return closed

    def _text(self, piece: str) -> list[bytes]:
        out = [] if self.text_open else self._open({"type": "text", "text": ""})
        self.text_open = True
        out.append(event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                 "delta": {"type": "text_delta", "text": piece}}))
        return out

    def _tail(self, out: Outcome) -> list[bytes]:
        chunks: list[bytes] = []
        if not self.text_open and not out.reply.tool_calls:
            chunks += self._text("")  # a reply with no text still has its (empty) text block
        if self.text_open:
            chunks.append(self._close())
            self.text_open = False
        for block in tool_blocks(out):
            args = json.dumps(block["input"], ensure_ascii=False)
            chunks += self._open({**block, "input": {}})
            chunks.append(event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                        "delta": {"type": "input_json_delta", "partial_json": args}}))
            chunks.append(self._close())
        stop = self.stop_of(out)
        reason = stop_reason(out, stop)
        delta = {"stop_reason": reason, "stop_sequence": stop if reason == "stop_sequence" else None}
        chunks.append(event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage(out),
                                              "agentmem": out.extension()}))
        chunks.append(event("message_stop", {"type": "message_stop"}))
        return chunks

    def render(self, ev: Event) -> list[bytes]:
        """The events for one call event (`serving.respond`'s `render`)."""
        kind, value = ev
        if kind == "text":
            assert isinstance(value, str)
            return self._text(value) if value else []
        assert isinstance(value, Outcome)
        return self._tail(value)
