"""Response bodies and Server-Sent Events in the OpenAI shapes, built from an `Outcome`.

Besides OpenAI's fields every response (and the last chunk of a stream) carries an
`agentmem` object: the agent id, how its KV was found (`reused`, `restored`, `shared`,
`prefilled`) and the call's timings — the OpenAI clients keep it (`model_extra`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from agentmem.server.engine import Outcome

__all__ = ["DONE", "Ids", "chat_chunk", "chat_completion", "chat_tail", "completion", "completion_chunk", "sse"]

DONE = b"data: [DONE]\n\n"


class Ids:
    """The id, creation time and model of one response (shared by its chunks)."""

    def __init__(self, prefix: str, model: str) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": None}


def sse(data: dict[str, Any]) -> bytes:
    """One event: `data: {json}` and a blank line."""
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def chat_completion(ids: Ids, out: Outcome) -> dict[str, Any]:
    """`chat.completion` of a finished call."""
    message: dict[str, Any] = {"role": "assistant", "content": out.reply.content, "refusal": None}
    if out.reply.tool_calls:
        message["tool_calls"] = out.reply.tool_calls
    return {
        **ids.head("chat.completion"),
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": out.finish_reason}],
        "usage": out.usage(),
        "agentmem": out.extension(),
    }


def chat_chunk(ids: Ids, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    """One `chat.completion.chunk` with one choice."""
    return {**ids.head("chat.completion.chunk"),
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}], **extra}


def chat_tail(ids: Ids, out: Outcome, include_usage: bool) -> list[dict[str, Any]]:
    """The chunks that end a chat stream: tool calls, the finish reason, the usage chunk."""
    chunks = []
    if out.reply.tool_calls:
        delta = {"tool_calls": [{"index": i, **c} for i, c in enumerate(out.reply.tool_calls)]}
        chunks.append(chat_chunk(ids, delta))
    chunks.append(chat_chunk(ids, {}, out.finish_reason, agentmem=out.extension()))
    if include_usage:
        chunks.append({**ids.head("chat.completion.chunk"), "choices": [], "usage": out.usage()})
    return chunks


def completion(ids: Ids, out: Outcome) -> dict[str, Any]:
    """`text_completion` of a finished call."""
    return {
        **ids.head("text_completion"),
        "choices": [{"index": 0, "text": out.reply.content or "", "logprobs": None, "finish_reason": out.finish_reason}],
        "usage": out.usage(),
        "agentmem": out.extension(),
    }


def completion_chunk(ids: Ids, text: str, finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    """One streamed `text_completion` chunk."""
    return {**ids.head("text_completion"),
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}], **extra}
