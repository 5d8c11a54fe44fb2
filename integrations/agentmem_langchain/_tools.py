"""Tools: normalizing bound tools and ``tool_choice``, prompting, parsing calls.

The model is told about the tools in a system block (:func:`tools_instruction`)
whose text does not depend on ``tool_choice``, so an agent's prompt prefix — and
the KV kept for it — stays the same whether a call is forced or not. A call is
the JSON that agentmem also renders past calls as::

    {"tool_calls": [{"name": "get_weather", "arguments": {"location": "Paris"}}]}
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from langchain_core.messages import InvalidToolCall, ToolCall
from langchain_core.utils.function_calling import convert_to_openai_tool

__all__ = [
    "TOOL_CALL_OPEN",
    "ToolSpec",
    "normalize_tool_choice",
    "normalize_tools",
    "parse_tool_calls",
    "tools_instruction",
]

TOOL_CALL_OPEN = '{"tool_calls"'


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One callable tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


def _clean_schema(schema: Any) -> Any:
    """Drop ``title`` keys (noise for the model); keep everything else."""
    if isinstance(schema, dict):
        return {
            k: _clean_schema(v)
            for k, v in schema.items()
            if not (k == "title" and isinstance(v, str))
        }
    if isinstance(schema, list):
        return [_clean_schema(v) for v in schema]
    return schema


def normalize_tools(tools: Sequence[Any]) -> list[ToolSpec]:
    """Anything ``bind_tools`` accepts (BaseTool, function, pydantic class, dict) → specs."""
    specs: list[ToolSpec] = []
    for t in tools:
        fn = convert_to_openai_tool(t)["function"]
        params = _clean_schema(fn.get("parameters") or {"type": "object", "properties": {}})
        specs.append(ToolSpec(fn["name"], fn.get("description") or "", params))
    return specs


def normalize_tool_choice(choice: Any, names: Sequence[str]) -> str:
    """``"auto"``, ``"none"``, ``"required"`` or the name of the one tool to call.

    Accepted: ``None``/``"auto"``, ``"none"``/``False``, ``"any"``/``"required"``/``True``,
    a tool name, ``{"type": "function", "function": {"name": ...}}``,
    ``{"type": "tool", "name": ...}`` or ``{"name": ...}``.
    """
    if choice is None or choice == "auto":
        return "auto"
    if choice is False or choice == "none":
        return "none"
    if choice is True or choice in ("any", "required"):
        return "required"
    name: Any = choice
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else choice.get("name")
        if name is None and choice.get("type") in ("any", "auto", "none", "required"):
            return normalize_tool_choice(choice["type"], names)
    if isinstance(name, str) and name in names:
        return name
    raise ValueError(
        f"tool_choice {choice!r} is not 'auto', 'none', 'any'/'required' or the name of a bound tool; "
        f"bound tools: {list(names)}"
    )


def tools_instruction(specs: Sequence[ToolSpec]) -> str:
    """The system-prompt block that describes the tools and the call format."""
    lines = ["You can call these tools:"]
    lines += [json.dumps(s.as_dict(), ensure_ascii=False) for s in specs]
    lines.append(
        'To call a tool, reply with only this JSON: {"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'
    )
    return "\n".join(lines)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


_NAME_RE = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*")')
_ARGS_MARK = '"arguments": '


def _salvage(text: str) -> tuple[str | None, str]:
    """Name and argument text of a broken (usually cut-off) first call, for an InvalidToolCall.

    Streaming consumers merge these into a call with partially parsed arguments —
    how LangChain treats any cut-off streamed call.
    """
    m = _NAME_RE.search(text)
    name = None
    if m:
        try:
            name = json.loads(m.group(1))
        except ValueError:
            name = None
    j = text.find(_ARGS_MARK)
    if j == -1:
        return name, ""
    args = text[j + len(_ARGS_MARK) :]
    for tail in ("}]}", "}]"):
        if args.endswith(tail):
            args = args[: -len(tail)]
            break
    return name, args


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[InvalidToolCall]] | None:
    """Parse a reply that is a tool-call envelope; ``None`` if it is not one.

    A reply that starts like an envelope but is not valid JSON (cut off by
    ``max_tokens``, say) gives one :class:`InvalidToolCall` with the error.
    """
    s = text.strip()
    if not s.startswith(TOOL_CALL_OPEN):
        return None
    try:
        data = json.loads(s)
        raw_calls = data["tool_calls"]
        if not isinstance(raw_calls, list):
            raise TypeError("'tool_calls' is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        name, args = _salvage(s)
        return [], [InvalidToolCall(type="invalid_tool_call", name=name, args=args, id=_call_id(), error=f"invalid tool-call JSON: {exc}")]
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for c in raw_calls:
        name = c.get("name") if isinstance(c, dict) else None
        args = c.get("arguments", {}) if isinstance(c, dict) else None
        if isinstance(name, str) and isinstance(args, dict):
            calls.append(ToolCall(type="tool_call", name=name, args=args, id=_call_id()))
        else:
            invalid.append(
                InvalidToolCall(
                    type="invalid_tool_call",
                    name=name if isinstance(name, str) else None,
                    args=json.dumps(c, ensure_ascii=False),
                    id=_call_id(),
                    error="a tool call needs a string 'name' and an object 'arguments'",
                )
            )
    return calls, invalid
