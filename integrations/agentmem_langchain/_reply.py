"""A reply of the protocol (`agentmem.calls.Reply`) in LangChain's terms (`_Reply`): content, `ToolCall`s, `InvalidToolCall`s."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from langchain_core.messages import InvalidToolCall, ToolCall

from agentmem.calls import CallOutcome, CallPlan, StreamGate
from agentmem.calls import Reply as CoreReply
from agentmem.calls import read_reply

from ._tools import as_invalid_tool_call, as_tool_call

_Holder = StreamGate
"""Which streamed text may be shown now (`agentmem.calls.StreamGate`)."""


@dataclass
class _Reply:
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)
    retry: bool = False

    @property
    def has_calls(self) -> bool:
        """Whether the reply goes out as (valid or invalid) tool calls."""
        return bool(self.tool_calls or self.invalid_tool_calls)


def as_langchain(plan: CallPlan, reply: CoreReply) -> _Reply:
    """`reply` in LangChain's terms: a forced call that did not parse is an `InvalidToolCall`, not text."""
    if reply.retry:
        return _Reply(retry=True)
    if reply.is_call:
        return _Reply(content=reply.content or "", tool_calls=[as_tool_call(c) for c in reply.calls])
    if reply.calls or reply.invalid:
        return _Reply(tool_calls=[as_tool_call(c) for c in reply.calls], invalid_tool_calls=[as_invalid_tool_call(c) for c in reply.invalid])
    if plan.mode == "tools":  # cannot happen under the grammar, unless cut by a stop string
        return _Reply(invalid_tool_calls=[InvalidToolCall(type="invalid_tool_call", name=None, args=reply.text, id=None,
                                                          error="no tool-call JSON in the reply")])
    return _Reply(content=reply.content or "")


def _read(plan: CallPlan, text: str) -> _Reply:
    """Interpret the generated `text` of `plan`."""
    return as_langchain(plan, read_reply(plan, text))


def tool_call_chunks(reply: _Reply) -> list[dict[str, object]]:
    """The reply's calls as the `tool_call_chunks` of a last streamed chunk."""
    chunks: list[dict[str, object]] = [
        {"name": tc["name"], "args": json.dumps(tc["args"], ensure_ascii=False), "id": tc["id"], "index": i,
         "type": "tool_call_chunk"}
        for i, tc in enumerate(reply.tool_calls)
    ]
    return chunks + [
        {"name": tc.get("name"), "args": tc.get("args"), "id": tc.get("id"), "index": len(chunks) + i,
         "type": "tool_call_chunk"}
        for i, tc in enumerate(reply.invalid_tool_calls)
    ]


def rest_of(outcome: CallOutcome, reply: _Reply) -> str:
    """Held text still to show once the reply is known (none for calls)."""
    return "" if reply.has_calls or reply.retry else outcome.rest
