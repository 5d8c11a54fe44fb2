"""Tools in LangChain's terms: bound tools and `tool_choice` normalized, replies read as `ToolCall`s.

The prompt text, the grammars and the call syntaxes (`agentmem.tools.formats`: the
model's native one, or agentmem's envelope) are agentmem's one tool-call protocol
(`agentmem.tools`); this module only converts LangChain's tool objects and choices
into it and its parsed calls into LangChain's `ToolCall` / `InvalidToolCall`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from langchain_core.messages import InvalidToolCall, ToolCall
from langchain_core.utils.function_calling import convert_to_openai_tool

from agentmem.tools import ParsedCall, ToolFormat, clean_schema, get_tool_format, new_call_id

__all__ = ["ToolSpec", "as_invalid_tool_call", "as_tool_call", "normalize_tool_choice", "normalize_tools", "parse_tool_calls"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One callable tool as the model sees it (`as_dict` is what `agentmem.tools` takes)."""

    name: str
    description: str
    parameters: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """`{"name", "description", "parameters"}`."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


def normalize_tools(tools: Sequence[Any]) -> list[ToolSpec]:
    """Anything `bind_tools` accepts (BaseTool, function, pydantic class, dict) → specs (titles dropped)."""
    specs: list[ToolSpec] = []
    for t in tools:
        fn = convert_to_openai_tool(t)["function"]
        params = clean_schema(fn.get("parameters") or {"type": "object", "properties": {}})
        specs.append(ToolSpec(fn["name"], fn.get("description") or "", params))
    return specs


def normalize_tool_choice(choice: Any, names: Sequence[str]) -> str:
    """`"auto"`, `"none"`, `"required"` or the name of the one tool to call.

    Accepted: `None`/`"auto"`, `"none"`/`False`, `"any"`/`"required"`/`True`,
    a tool name, `{"type": "function", "function": {"name": ...}}`,
    `{"type": "tool", "name": ...}` or `{"name": ...}`.

    Raises:
        ValueError: `choice` is none of these (the message lists the bound tools).
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


def as_tool_call(c: ParsedCall) -> ToolCall:
    """A valid parsed call as LangChain's `ToolCall` (a fresh id)."""
    return ToolCall(type="tool_call", name=c.name or "", args=c.arguments or {}, id=new_call_id())


def as_invalid_tool_call(c: ParsedCall) -> InvalidToolCall:
    """A call that did not parse as LangChain's `InvalidToolCall` (its raw text and error)."""
    return InvalidToolCall(type="invalid_tool_call", name=c.name, args=c.raw, id=new_call_id(), error=c.error)


def parse_tool_calls(text: str, fmt: ToolFormat | None = None) -> tuple[list[ToolCall], list[InvalidToolCall]] | None:
    """Parse a reply that is a tool call in `fmt`'s syntax (default: the envelope); `None` if it is not one.

    A reply that starts like a call but does not parse (cut off by `max_tokens`,
    say) gives one `InvalidToolCall` with the error.
    """
    parsed = (fmt or get_tool_format("envelope")).parse(text)
    if parsed is None:
        return None
    return [as_tool_call(c) for c in parsed if c.ok], [as_invalid_tool_call(c) for c in parsed if not c.ok]
