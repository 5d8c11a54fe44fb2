"""The plan of one chat-model call: LangChain's call arguments (tools, `tool_choice`, `response_format`, `grammar`) read into the protocol's `agentmem.calls.CallPlan`."""

from __future__ import annotations

from typing import Any

from langchain_core.utils.function_calling import convert_to_json_schema

from agentmem.calls import CallPlan, plan_chat
from agentmem.tools import ToolFormat

from ._tools import ToolSpec, normalize_tool_choice

_CALL_KEYS = {
    "agent_id",
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "seed",
    "grammar",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
}


def _response_schema(response_format: Any) -> dict[str, Any] | None:
    """`response_format` → a JSON schema, or `None` for "any JSON object".

    Accepts `{"type": "json_object"}`, OpenAI's
    `{"type": "json_schema", "json_schema": {"schema": ...}}`, a JSON schema
    dict, a pydantic class or a TypedDict.
    """
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_object":
            return None
        if kind == "json_schema":
            inner = response_format.get("json_schema", response_format)
            schema = inner.get("schema") if isinstance(inner, dict) else None
            if not isinstance(schema, dict):
                raise ValueError("response_format of type 'json_schema' needs a 'schema' dict")
            return schema
    return convert_to_json_schema(response_format)


_Call = CallPlan
"""One model call, prepared: what goes to the pool and how to read the reply (`agentmem.calls.CallPlan`)."""


def _check_combination(grammar: Any, tools: list[Any], choice: Any, response_format: Any) -> None:
    """Raise `ValueError` for arguments that cannot go together."""
    if grammar is not None and (tools or response_format is not None):
        raise ValueError("a raw 'grammar' cannot be combined with tools or response_format")
    if tools and response_format is not None and choice != "none":
        raise ValueError("tools and response_format cannot be used together (unless tool_choice='none')")


def plan_call(
    agent: str, msgs: list[dict[str, Any]], sampling: dict[str, Any], fmt: ToolFormat, kwargs: dict[str, Any]
) -> _Call:
    """The `CallPlan` for the call arguments `kwargs` (tools, `tool_choice`, `response_format`, `grammar`).

    Args:
        agent: the agent id the call runs for.
        msgs: the conversation as agentmem messages.
        sampling: the pool's sampling keywords for the call.
        fmt: the model's tool-call format (`MemoryPool.tool_format`).
        kwargs: the call's arguments (already checked against `_CALL_KEYS`).

    Returns:
        A text, JSON, forced-tools or auto-tools plan (`agentmem.calls.plan_chat`).

    Raises:
        ValueError: a raw grammar with tools or `response_format`, tools with
            `response_format`, or a bad `tool_choice` / `response_format`.
    """
    grammar = kwargs.get("grammar")
    tools = kwargs.get("tools") or []
    choice = kwargs.get("tool_choice") or "auto"
    response_format = kwargs.get("response_format")
    _check_combination(grammar, tools, choice, response_format)
    specs = [ToolSpec(t["name"], t.get("description", ""), t.get("parameters") or {}).as_dict() for t in tools]
    if specs:
        choice = normalize_tool_choice(choice, [s["name"] for s in specs])
    json_reply = response_format is not None and grammar is None
    return plan_chat(agent, msgs, sampling, fmt, tools=specs, choice=choice,
                     parallel=bool(kwargs.get("parallel_tool_calls", False)), json_reply=json_reply,
                     schema=_response_schema(response_format) if json_reply else None, grammar=grammar)
