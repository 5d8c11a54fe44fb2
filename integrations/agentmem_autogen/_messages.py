"""AutoGen ``LLMMessage`` objects ↔ agentmem chat messages, tool prompts and tool-call parsing.

* :func:`to_agentmem_messages` — every ``LLMMessage`` type, including an
  ``AssistantMessage`` carrying ``FunctionCall``\\ s and a
  ``FunctionExecutionResultMessage`` (one ``tool`` message per result).
* :func:`tool_schemas` / :func:`tools_prompt` — ``Tool``/``ToolSchema`` → schemas and
  the system-prompt block that tells the model how to call them (the same JSON the
  prompt renders past calls in).
* :func:`parse_tool_calls` / :func:`looks_like_tool_call` — find a tool call in text.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import uuid
from typing import Any, Mapping, Sequence

from autogen_core import FunctionCall, Image
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResultMessage,
    LLMMessage,
    SystemMessage,
    UserMessage,
)
from autogen_core.tools import Tool, ToolSchema

from agentmem.errors import MessageError

__all__ = [
    "candidate_names",
    "looks_like_tool_call",
    "parse_tool_calls",
    "to_agentmem_messages",
    "tool_schemas",
    "tools_prompt",
    "with_tools",
]

logger = logging.getLogger(__name__)

TOOL_CALL_FORMAT = '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'


def _text_parts(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Image):
            raise MessageError(
                f"{where}.content[{j}] is an Image; this client's model has no vision (model_info vision=False)"
            )
        else:
            raise MessageError(f"{where}.content[{j}]: unsupported part {type(part).__name__}")
    return "\n".join(parts)


def to_agentmem_messages(messages: Sequence[LLMMessage]) -> list[dict[str, Any]]:
    """Convert AutoGen messages to agentmem message dicts.

    ``UserMessage.source`` becomes the user message's ``name`` (rendered
    ``"source: content"``) so the model sees who said what in a team chat.

    Raises:
        MessageError: an unsupported message or content part (named by index).
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": m.content})
        elif isinstance(m, UserMessage):
            d: dict[str, Any] = {"role": "user", "content": _text_parts(m.content, where)}
            if m.source:
                d["name"] = m.source
            out.append(d)
        elif isinstance(m, AssistantMessage):
            if isinstance(m.content, str):
                out.append({"role": "assistant", "content": m.content})
            else:
                calls = []
                for j, fc in enumerate(m.content):
                    if not isinstance(fc, FunctionCall):
                        raise MessageError(f"{where}.content[{j}] must be a FunctionCall, got {type(fc).__name__}")
                    calls.append({"id": fc.id or "", "name": fc.name, "arguments": fc.arguments})
                out.append({"role": "assistant", "content": m.thought or "", "tool_calls": calls})
        elif isinstance(m, FunctionExecutionResultMessage):
            for r in m.content:
                out.append({"role": "tool", "content": r.content, "tool_call_id": r.call_id or "", "name": r.name})
        else:
            raise MessageError(f"{where}: unsupported message type {type(m).__name__}")
    return out


def tool_schemas(tools: Sequence[Tool | ToolSchema]) -> list[dict[str, Any]]:
    """``Tool`` objects or ``ToolSchema`` dicts → plain schema dicts (names checked unique)."""
    out: list[dict[str, Any]] = []
    for t in tools:
        schema = t.schema if isinstance(t, Tool) else t
        if not isinstance(schema, Mapping) or not isinstance(schema.get("name"), str) or not schema["name"]:
            raise ValueError(f"a tool must be a Tool or a ToolSchema dict with a 'name', got {t!r:.80}")
        out.append(dict(schema))
    names = [s["name"] for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate tool name(s) {dup}")
    return out


def _compact_params(params: Mapping[str, Any] | None) -> Any:
    def strip(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {k: strip(v) for k, v in x.items() if k not in ("title", "additionalProperties")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(params or {"type": "object", "properties": {}})


def tools_prompt(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The block appended to the system prompt that lists the tools and the call format."""
    lines = ["You can call these tools:"]
    for s in schemas:
        desc = (s.get("description") or "").strip()
        params = json.dumps(_compact_params(s.get("parameters")), ensure_ascii=False)
        about = f"{desc} Arguments" if desc else "arguments"
        lines.append(f"- {s['name']}: {about} (JSON schema): {params}")
    lines.append(f"To call a tool, reply with only this JSON: {TOOL_CALL_FORMAT}")
    return "\n".join(lines)


def with_tools(messages: list[dict[str, Any]], block: str | None) -> list[dict[str, Any]]:
    """Put the tools block at the end of the first system message (or in a new one)."""
    if not block:
        return messages
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{block}" if first["content"] else block
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:12]


def _as_calls(obj: Any, names: set[str]) -> list[FunctionCall] | None:
    """``{"tool_calls": [...]}`` or one bare ``{"name", "arguments"}`` → FunctionCalls (None if not one)."""
    if isinstance(obj, Mapping) and isinstance(obj.get("tool_calls"), list):
        items = obj["tool_calls"]
    elif isinstance(obj, Mapping) and set(obj) == {"name", "arguments"}:
        items = [obj]
    else:
        return None
    calls: list[FunctionCall] = []
    for it in items:
        if not isinstance(it, Mapping) or it.get("name") not in names:
            return None
        args = it.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, Mapping):
            return None
        calls.append(FunctionCall(id=_new_id(), name=it["name"], arguments=json.dumps(args, ensure_ascii=False)))
    return calls or None


def parse_tool_calls(text: str, names: Sequence[str]) -> tuple[list[FunctionCall], str] | None:
    """Find a tool call in ``text``: ``(calls, text_before_it)``, or ``None``.

    Accepts the prompt's format ``{"tool_calls": [...]}`` and a bare
    ``{"name": ..., "arguments": {...}}``, possibly inside a code fence. Only
    tools in ``names`` count.
    """
    known = set(names)
    dec = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _end = dec.raw_decode(text, start)
        except json.JSONDecodeError:
            obj = None
        calls = _as_calls(obj, known) if obj is not None else None
        if calls:
            before = text[:start].strip()
            if before.endswith("```json") or before.endswith("```"):
                before = before.rsplit("```", 1)[0].strip()
            return calls, before
        start = text.find("{", start + 1)
    return None


def looks_like_tool_call(text: str, names: Sequence[str]) -> bool:
    """Did the model try to call a tool (maybe with broken JSON)?"""
    t = text.lstrip()
    if '"tool_calls"' in t or "'tool_calls'" in t:
        return True
    return (t.startswith("{") or t.startswith("```")) and any(f'"{n}"' in t for n in names)


# A Python list of quoted names as ``str(list_of_names)`` writes it: ['pm', 'engineer']
_NAME_LIST_RE = re.compile(r"\['[^'\n]+'(?:, '[^'\n]+')*\]")


def candidate_names(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The speaker names a ``SelectorGroupChat`` selection prompt offers (``[]`` if none).

    AgentChat formats its candidates with ``str(list)`` into the prompt; the last such
    list in the last user message is the one the model must choose from.
    """
    for m in reversed(messages):
        if m.get("role") != "user":
            continue
        found = _NAME_LIST_RE.findall(m.get("content") or "")
        if not found:
            return []
        try:
            names = ast.literal_eval(found[-1])
        except (ValueError, SyntaxError):
            return []
        return [n for n in names if isinstance(n, str) and n]
    return []
