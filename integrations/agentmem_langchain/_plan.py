"""The plan of one chat-model call (`_Call`): what goes to the pool — messages, sampling, the grammar of a forced tool call or a JSON reply — and how its reply is to be read."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from langchain_core.utils.function_calling import convert_to_json_schema

from agentmem.tools import (
    ToolFormat,
    get_tool_format,
    json_prompt,
    tools_prompt,
    with_system_block,
)
from agentmem.tools.forced import forced_call_grammar, forced_json_grammar

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


@dataclass
class _Call:
    """One model call, prepared: what goes to the pool and how to read the reply."""

    agent_id: str
    messages: list[dict[str, Any]]
    sampling: dict[str, Any]
    mode: Literal["text", "json", "tools", "auto"] = "text"
    prefix: str = ""
    tool_names: tuple[str, ...] = ()
    forced: Callable[[], _Call] | None = None  # auto mode: the same call with a call forced
    fmt: ToolFormat = field(default_factory=lambda: get_tool_format("envelope"))  # the model's call syntax

    def pool_messages(self) -> list[dict[str, Any]]:
        """The messages to send: a forced prefix as a started assistant turn, unless the pool gets it as `opening`."""
        if not self.prefix or "opening" in self.sampling:
            return self.messages
        return [*self.messages, {"role": "assistant", "content": self.prefix}]


def plan_call(
    agent: str, msgs: list[dict[str, Any]], sampling: dict[str, Any], fmt: ToolFormat, kwargs: dict[str, Any]
) -> _Call:
    """The `_Call` for the call arguments `kwargs` (tools, `tool_choice`, `response_format`, `grammar`).

    Args:
        agent: the agent id the call runs for.
        msgs: the conversation as agentmem messages.
        sampling: the pool's sampling keywords for the call.
        fmt: the model's tool-call format (`MemoryPool.tool_format`).
        kwargs: the call's arguments (already checked against `_CALL_KEYS`).

    Returns:
        A text, JSON, forced-tools or auto-tools `_Call`.

    Raises:
        ValueError: a raw grammar with tools or `response_format`, tools with
            `response_format`, or a bad `tool_choice` / `response_format`.
    """
    grammar = kwargs.get("grammar")
    tools = kwargs.get("tools") or []
    choice = kwargs.get("tool_choice") or "auto"
    response_format = kwargs.get("response_format")
    if grammar is not None and (tools or response_format is not None):
        raise ValueError("a raw 'grammar' cannot be combined with tools or response_format")
    if tools and response_format is not None and choice != "none":
        raise ValueError("tools and response_format cannot be used together (unless tool_choice='none')")
    if grammar is not None:
        return _Call(agent, msgs, {**sampling, "grammar": grammar})

    if tools:
        specs = [ToolSpec(t["name"], t.get("description", ""), t.get("parameters") or {}) for t in tools]
        names = tuple(s.name for s in specs)
        choice = normalize_tool_choice(choice, names)
        if fmt.native:  # the model's own template shows the tools
            sampling = {**sampling, "tools": [s.as_dict() for s in specs]}
        else:
            msgs = with_system_block(msgs, tools_prompt([s.as_dict() for s in specs]))
        parallel = bool(kwargs.get("parallel_tool_calls", False)) and fmt.parallel
        tools_json = json.dumps([s.as_dict() for s in specs])

        def forced(only: str | None = None) -> _Call:
            prefix, g = forced_call_grammar(fmt, tools_json, only, parallel)
            # a native call is sent back as `tool_calls`: the pool starts the reply with the
            # prefix as the template renders it (`opening`), not as message text
            opening = {"opening": prefix} if fmt.native else {}
            return _Call(agent, msgs, {**sampling, "grammar": g, **opening}, "tools", prefix, names, fmt=fmt)

        if choice == "required":
            return forced()
        if choice in names:
            return forced(choice)
        if choice == "auto":
            return _Call(agent, msgs, sampling, "auto", "", names, forced=forced, fmt=fmt)
        # "none": tools stay described (same prompt prefix, same kept KV) but are not called,
        # and a reply that opens like a call stays as written (no `<tool_call>` opening added)
        sampling = {**sampling, "canonical_calls": False}
    if response_format is not None and not (tools and choice != "none"):
        schema = _response_schema(response_format)
        msgs = with_system_block(msgs, json_prompt(schema))
        prefix, g = forced_json_grammar(None if schema is None else json.dumps(schema))
        return _Call(agent, msgs, {**sampling, "grammar": g}, "json", prefix)
    return _Call(agent, msgs, sampling)
