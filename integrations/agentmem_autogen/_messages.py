"""AutoGen `LLMMessage` objects ↔ agentmem chat messages; tools and tool calls in AutoGen's types.

* `to_agentmem_messages`: every `LLMMessage` type, including an `AssistantMessage`
  carrying `FunctionCall`s and a `FunctionExecutionResultMessage` (one `tool` message
  per result).
* `tool_schemas`: `Tool`/`ToolSchema` → the plain schema dicts `agentmem.tools` takes.
* `parse_tool_calls`: a tool call found in text (in the model's syntax,
  `agentmem.tools.ToolFormat.find`) as `FunctionCall`s.
* `candidate_names`: the speaker names a `SelectorGroupChat` selection prompt offers.

The tools prompt, the grammars and the call format are agentmem's one tool-call
protocol, `agentmem.tools`.
"""

from __future__ import annotations

import ast
import json
import logging
import re
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
from agentmem.tools import ParsedCall, ToolFormat, get_tool_format, new_call_id

__all__ = ["candidate_names", "function_calls", "parse_tool_calls", "to_agentmem_messages", "tool_schemas"]

logger = logging.getLogger(__name__)


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

    `UserMessage.source` becomes the user message's `name` (rendered
    `"source: content"`) so the model sees who said what in a team chat.

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
    """`Tool` objects or `ToolSchema` dicts → plain schema dicts (names checked unique).

    Raises:
        ValueError: a tool without a name, or two tools of one name.
    """
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


def parse_tool_calls(
    text: str, names: Sequence[str], fmt: ToolFormat | None = None
) -> tuple[list[FunctionCall], str] | None:
    """Find a tool call in `text`: `(calls, text_before_it)`, or `None`.

    Accepts `fmt`'s syntax (the model's native one, e.g. `<tool_call>` JSON; default:
    agentmem's envelope `{"tool_calls": [...]}`) and a bare
    `{"name": ..., "arguments": {...}}`, possibly inside a code fence. Only
    tools in `names` count.
    """
    found = (fmt or get_tool_format("envelope")).find(text, names)
    if found is None:
        return None
    return function_calls(found[0]), found[1]


def function_calls(calls: Sequence[ParsedCall]) -> list[FunctionCall]:
    """Parsed calls as AutoGen's `FunctionCall`s (fresh ids, arguments as JSON text)."""
    return [FunctionCall(id=new_call_id(), name=c.name or "", arguments=json.dumps(c.arguments, ensure_ascii=False))
            for c in calls]


# A Python list of quoted names as `str(list_of_names)` writes it: ['pm', 'engineer']
_NAME_LIST_RE = re.compile(r"\['[^'\n]+'(?:, '[^'\n]+')*\]")


def candidate_names(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The speaker names a `SelectorGroupChat` selection prompt offers (`[]` if none).

    AgentChat formats its candidates with `str(list)` into the prompt; the last such
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
