"""LangChain messages → agentmem message dicts.

=================  =========================================================
LangChain          agentmem
=================  =========================================================
``SystemMessage``  ``{"role": "system"}``
``HumanMessage``   ``{"role": "user"}`` (its ``name`` is kept: "name: text")
``AIMessage``      ``{"role": "assistant", "tool_calls": [...]}``
``ToolMessage``    ``{"role": "tool", "tool_call_id", "name"}`` (a tool_result region)
``ChatMessage``    by its ``role`` (``human``/``ai``/``developer`` understood)
=================  =========================================================

Only text is supported: text content blocks are joined; tool-call, reasoning and
thinking blocks of AI messages are dropped (the calls travel in ``tool_calls``);
any other block (an image, a file) is an error naming the message.
"""

from __future__ import annotations

from typing import Any, Sequence

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

__all__ = ["to_pool_messages"]

_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "tool": "tool",
}
# Blocks an AI message may carry besides text: they are represented elsewhere
# (tool_calls) or are not part of the conversation the model should see again.
_AI_SKIP = {
    "tool_call",
    "tool_call_chunk",
    "tool_use",
    "invalid_tool_call",
    "server_tool_call",
    "server_tool_call_chunk",
    "server_tool_result",
    "function_call",
    "thinking",
    "redacted_thinking",
    "reasoning",
}


def _text(content: Any, where: str, *, ai: bool = False) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for j, block in enumerate(content or []):
        if isinstance(block, str):
            parts.append(block)
            continue
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif ai and kind in _AI_SKIP:
            continue
        else:
            raise ValueError(
                f"{where}.content[{j}]: agentmem models take text only, got a {kind or type(block).__name__!r} block"
            )
    return "".join(parts)


def to_pool_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """Convert LangChain messages to the dicts `agentmem.MemoryPool.chat` takes.

    >>> from langchain_core.messages import HumanMessage, AIMessage, ToolMessage
    >>> to_pool_messages([
    ...     HumanMessage("2+2?", name="ann"),
    ...     AIMessage("", tool_calls=[{"name": "add", "args": {"a": 2, "b": 2}, "id": "c1"}]),
    ...     ToolMessage("4", tool_call_id="c1", name="add"),
    ... ])  # doctest: +NORMALIZE_WHITESPACE
    [{'role': 'user', 'content': '2+2?', 'name': 'ann'},
     {'role': 'assistant', 'content': '', 'tool_calls': [{'id': 'c1', 'name': 'add', 'arguments': {'a': 2, 'b': 2}}]},
     {'role': 'tool', 'content': '4', 'tool_call_id': 'c1', 'name': 'add'}]
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": _text(m.content, where)})
        elif isinstance(m, HumanMessage):
            d: dict[str, Any] = {"role": "user", "content": _text(m.content, where)}
            if m.name:
                d["name"] = m.name
            out.append(d)
        elif isinstance(m, AIMessage):
            d = {"role": "assistant", "content": _text(m.content, where, ai=True)}
            if m.tool_calls:
                d["tool_calls"] = [
                    {"id": tc.get("id") or "", "name": tc["name"], "arguments": tc.get("args") or {}} for tc in m.tool_calls
                ]
            out.append(d)
        elif isinstance(m, ToolMessage):
            d = {"role": "tool", "content": _text(m.content, where), "tool_call_id": m.tool_call_id}
            if m.name:
                d["name"] = m.name
            out.append(d)
        elif isinstance(m, FunctionMessage):
            out.append({"role": "tool", "content": _text(m.content, where), "tool_call_id": m.name, "name": m.name})
        elif isinstance(m, ChatMessage):
            role = _ROLES.get(m.role)
            if role is None or role == "tool":
                raise ValueError(f"{where}: ChatMessage role {m.role!r} is not one of {sorted(set(_ROLES) - {'tool'})}")
            out.append({"role": role, "content": _text(m.content, where, ai=role == "assistant")})
        else:
            raise ValueError(f"{where}: unsupported message type {type(m).__name__}")
    return out
