"""Reading a call's reply (`_Reply`): its generated text as content or tool calls, a redo or a write-back when needed, and, while it streams, which text may be shown yet (`_Holder`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import InvalidToolCall, ToolCall

from agentmem.tools.parse import CallGate

from ._plan import _Call
from ._tools import find_tool_calls, parse_tool_calls

@dataclass
class _Reply:
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)
    retry: bool = False
    rewrite: str | None = None  # the call as the template writes it back, when the model wrote it otherwise


def _written_back(call: _Call, full: str, reply: _Reply) -> _Reply:
    """`reply`, marked for a rewrite when its calls are not written the way the template writes them back.

    A model may write a call in another shape than its template's (a bare JSON object,
    other spacing); the next prompt renders the template's form, and the KV of the
    call would be re-prefilled then. `_rewrite_call` puts the template's form in the KV now.
    """
    if not call.fmt.native or not reply.tool_calls or reply.invalid_tool_calls:
        return reply
    back = call.fmt.written_back(reply.content, [(c["name"], c["args"]) for c in reply.tool_calls])
    if back != full.strip():
        reply.rewrite = back
    return reply


def _rewrite_call(call: _Call, reply: _Reply) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """Pool arguments that prefill `reply.rewrite` as the agent's reply (nothing is generated)."""
    assert reply.rewrite is not None
    keep = {k: v for k, v in call.sampling.items() if k == "tools"}
    return call.agent_id, [*call.messages, {"role": "assistant", "content": reply.rewrite}], {**keep, "max_tokens": 0}


def _read(call: _Call, text: str) -> _Reply:
    """Interpret the generated `text` of `call`."""
    full = call.prefix + text
    if call.mode in ("text", "json"):
        return _Reply(content=full)
    parsed = parse_tool_calls(full, call.fmt)
    if call.mode == "auto":
        if parsed is None and call.fmt.native:  # a native call after some text: the text is the content
            found = find_tool_calls(full, call.tool_names, call.fmt)
            if found is not None:
                return _written_back(call, full, _Reply(content=found[1], tool_calls=found[0]))
        if parsed is None:
            return _Reply(content=full)
        calls, invalid = parsed
        bad = invalid or not calls or any(c["name"] not in call.tool_names for c in calls)
        if bad and call.forced is not None:
            return _Reply(retry=True)
        return _written_back(call, full, _Reply(tool_calls=calls, invalid_tool_calls=invalid))
    if parsed is None:  # cannot happen under the grammar, unless cut by a stop string
        return _Reply(invalid_tool_calls=[InvalidToolCall(type="invalid_tool_call", name=None, args=full, id=None, error="no tool-call JSON in the reply")])
    calls, invalid = parsed
    return _Reply(tool_calls=calls, invalid_tool_calls=invalid)


class _Holder(CallGate):
    """Decides, while streaming, which text may be shown now (`agentmem.tools.parse.CallGate`).

    Text replies stream as they come. A forced tool call is held to the end (it
    arrives as tool-call chunks). In `auto` mode the start of a reply is held while it
    could still be a tool call (in the model's syntax, `call.fmt`).
    """

    def __init__(self, call: _Call) -> None:
        super().__init__(call.fmt, call.mode)
        self.call = call

    def rest(self, reply: _Reply) -> str:
        """Held text still to show once the reply is known."""
        if reply.tool_calls or reply.invalid_tool_calls or reply.retry:
            return ""
        return self.held
