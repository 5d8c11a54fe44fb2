"""The instructions a model gets about tools and JSON replies, the same in every integration.

The tools block goes at the end of the leading system message (`with_system_block`),
and its text does not depend on `tool_choice`, so an agent's prompt prefix, and the
KV kept for it, stays the same whether a call is forced or not. A call is the JSON
that agentmem also renders past calls as:

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}

Each tool is shown as one line of JSON, `{"name", "description", "parameters"}` (the
OpenAI function shape small models have seen most), its schema without titles.

Example:
    >>> print(tools_prompt([{"name": "get_weather", "description": "Weather of a city.",
    ...     "parameters": {"type": "object", "properties": {"city": {"type": "string", "title": "City"}}}}]))
    You can call these tools:
    {"name": "get_weather", "description": "Weather of a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    To call a tool, reply with only this JSON: {"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from .grammar import clean_schema

__all__ = ["TOOL_CALL_FORMAT", "json_prompt", "prompt_schema", "tools_prompt", "with_system_block"]

TOOL_CALL_FORMAT = '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'
"""The call format the tools block shows the model."""


def prompt_schema(schema: Mapping[str, Any] | None) -> Any:
    """A schema as the model is shown it: no `title` strings, no `"additionalProperties": false`."""

    def strip(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {k: strip(v) for k, v in x.items() if not (k == "additionalProperties" and v is False)}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(clean_schema(schema or {"type": "object", "properties": {}}))


def tools_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-prompt block that lists `tools` and the call format.

    Args:
        tools: `{"name": str, "description": str, "parameters": <JSON schema>}` each;
            `description` and `parameters` may be missing.
    """
    lines = ["You can call these tools:"]
    for t in tools:
        spec = {
            "name": t["name"],
            "description": (t.get("description") or "").strip(),
            "parameters": prompt_schema(t.get("parameters")),
        }
        lines.append(json.dumps(spec, ensure_ascii=False))
    lines.append(f"To call a tool, reply with only this JSON: {TOOL_CALL_FORMAT}")
    return "\n".join(lines)


def json_prompt(schema: Mapping[str, Any] | None) -> str:
    """The system-prompt block asking for a JSON reply (of `schema`; `None`: any JSON object).

    >>> json_prompt(None)
    'Reply with only a JSON object.'
    """
    if schema is None:
        return "Reply with only a JSON object."
    return "Reply with only a JSON object that matches this JSON schema: " + json.dumps(
        prompt_schema(schema), ensure_ascii=False
    )


def with_system_block(messages: list[dict[str, Any]], block: str | None) -> list[dict[str, Any]]:
    """`messages` with `block` at the end of the leading system message (or in a new one).

    The messages are not changed; a new list is returned (`messages` itself when
    `block` is empty).
    """
    if not block:
        return messages
    if messages and messages[0].get("role") == "system":
        head = messages[0]
        text = f"{head['content']}\n\n{block}" if head.get("content") else block
        return [{**head, "content": text}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]
