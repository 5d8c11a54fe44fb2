"""Microsoft Agent Framework messages, tools and usage ↔ agentmem's chat messages, tool schemas and counts.

* `to_agentmem_messages`: MAF `Message`s (text, `function_call` and `function_result`
  contents) → agentmem message dicts; a `tool` message becomes one agentmem `tool`
  message per result, named after the call it answers.
* `tool_schemas`: the function tools of a call's options (`FunctionTool`, or an
  OpenAI-shaped function dict) → the plain `{"name", "description", "parameters"}`
  dicts `agentmem.tools` takes.
* `tool_choice`: MAF's `tool_choice` (`"auto"`, `"required"`, `"none"` or a `ToolMode`)
  → `(mode, forced_tool_name)`.
* `response_schema`: `response_format` (a pydantic model, a JSON schema, or an
  OpenAI `json_schema`/`json_object` format) → the JSON schema a reply must follow.
* `call_contents`, `usage_details`: what the pool produced, in MAF's types.

Every error names the field it is about (`messages[2].contents[0]`, `options.tools[1]`).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping, Sequence

from agent_framework import Content, Message, UsageDetails
from pydantic import BaseModel

from agentmem import ChatResult
from agentmem.errors import MessageError
from agentmem.tools import new_call_id

__all__ = [
    "call_contents",
    "response_schema",
    "to_agentmem_messages",
    "tool_choice",
    "tool_schemas",
    "usage_details",
]

logger = logging.getLogger(__name__)

_ROLES = frozenset({"system", "user", "assistant", "tool"})
_SKIPPED = frozenset({"usage", "text_reasoning"})  # carry nothing the next prompt shows


def _call_dict(c: Content, where: str) -> dict[str, Any]:
    if not c.name:
        raise MessageError(f"{where}.name: a function_call needs a name")
    args: Any = c.arguments if c.arguments is not None else {}
    return {"id": c.call_id or "", "name": c.name, "arguments": args}


def _result_text(c: Content) -> str:
    if isinstance(c.result, str):
        return c.result
    return "" if c.result is None else json.dumps(c.result, ensure_ascii=False, default=str)


def _foreign(m: Message, where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """Another agent's assistant or tool message, as what that agent said (a named user message)."""
    lines: list[str] = []
    for j, c in enumerate(m.contents):
        if c.type == "text" and c.text:
            lines.append(c.text)
        elif c.type == "function_call":
            if c.call_id:
                names[c.call_id] = c.name or ""
            args = c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments or {}, ensure_ascii=False)
            lines.append(f"(called {c.name}({args}))")
        elif c.type == "function_result":
            lines.append(f"({names.get(c.call_id or '', 'the tool')} returned: {_result_text(c)})")
        elif c.type not in _SKIPPED:
            raise MessageError(f"{where}.contents[{j}]: content type {c.type!r} is not supported by this text-only client")
    text = "\n".join(lines)
    return [{"role": "user", "content": text, "name": m.author_name}] if text else []


def _one_message(m: Message, where: str, names: dict[str, str], speaker: str | None) -> list[dict[str, Any]]:
    """One MAF message as agentmem dicts (`names`: call id → function name, filled from calls)."""
    role = str(m.role)
    if role not in _ROLES:
        raise MessageError(f"{where}.role: {role!r} is not one of {', '.join(sorted(_ROLES))}")
    if speaker is not None and role in ("assistant", "tool") and m.author_name not in (None, "", speaker):
        return _foreign(m, where, names)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, c in enumerate(m.contents):
        at = f"{where}.contents[{j}]"
        if c.type == "text":
            texts.append(c.text or "")
        elif c.type == "function_call" and role == "assistant":
            calls.append(_call_dict(c, at))
            if c.call_id:
                names[c.call_id] = c.name or ""
        elif c.type == "function_result":
            call_id = c.call_id or ""
            results.append({"role": "tool", "content": _result_text(c), "tool_call_id": call_id,
                            "name": names.get(call_id, "")})
        elif c.type in _SKIPPED:
            continue
        else:
            raise MessageError(f"{at}: content type {c.type!r} is not supported by this text-only client ({role} message)")
    text = "\n".join(t for t in texts if t)
    if results:
        if texts and text.strip():
            raise MessageError(f"{where}: a message of function results cannot also carry text")
        return results
    if calls:
        return [{"role": "assistant", "content": text, "tool_calls": calls}]
    if not text and not m.contents:
        return []  # an empty message adds nothing to the prompt
    d: dict[str, Any] = {"role": role, "content": text}
    if role == "user" and m.author_name:
        d["name"] = m.author_name
    return [d]


def to_agentmem_messages(
    messages: Sequence[Message], instructions: Any = None, *, speaker: str | None = None
) -> list[dict[str, Any]]:
    """MAF messages (after the call's `instructions`, a system message) → agentmem message dicts.

    A user message's `author_name` becomes its `name` (rendered `"name: text"`), so a
    model in a workflow sees who said what; an assistant message keeps its text and
    `function_call`s; each `function_result` becomes a `tool` message named after the
    call it answers. Reasoning and usage contents are dropped; images and other media
    are refused (the model reads text).

    `speaker`: the calling agent's name. An assistant or tool message another agent
    wrote (its `author_name` is set and is not `speaker`: a workflow's earlier agent)
    becomes a user message named after that agent, its calls and results written out
    as text — the model reads what a colleague said, not words put in its own mouth.

    Raises:
        MessageError: a message that is not a `Message`, an unknown role, an unsupported
            content, or a result mixed with text (named by index).
    """
    out: list[dict[str, Any]] = []
    if instructions:
        parts = [instructions] if isinstance(instructions, str) else list(instructions)
        if not all(isinstance(p, str) for p in parts):
            raise MessageError("options.instructions must be a string or a list of strings")
        body = "\n".join(p for p in parts if p.strip())
        if body:
            out.append({"role": "system", "content": body})
    names: dict[str, str] = {}
    for i, m in enumerate(messages):
        if not isinstance(m, Message):
            raise MessageError(f"messages[{i}] must be an agent_framework.Message, got {type(m).__name__}")
        out.extend(_one_message(m, f"messages[{i}]", names, speaker))
    if not out:
        raise MessageError("messages is empty (no text, calls or results)")
    return out


def _schema_of(tool: Any, where: str) -> dict[str, Any]:
    spec = tool.to_json_schema_spec() if hasattr(tool, "to_json_schema_spec") else tool
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: a {type(tool).__name__} is not a function tool this client can call")
    fn = spec.get("function") if isinstance(spec.get("function"), Mapping) else spec
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: a function tool needs a non-empty 'name', got {name!r}")
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, Mapping):
        raise ValueError(f"{where}.parameters must be a JSON schema object, got {type(params).__name__}")
    return {"name": name, "description": str(fn.get("description") or ""), "parameters": dict(params)}


def tool_schemas(tools: Any) -> list[dict[str, Any]]:
    """The function tools of a call (`options["tools"]`) as plain schema dicts, names checked unique.

    Raises:
        ValueError: a tool that is not a function tool (hosted tools run elsewhere), or
            two tools of one name (named `options.tools[i]`).
    """
    if tools is None:
        return []
    items = tools if isinstance(tools, (list, tuple)) else [tools]
    out = [_schema_of(t, f"options.tools[{i}]") for i, t in enumerate(items)]
    names = [s["name"] for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"options.tools: duplicate tool name(s) {dup}")
    return out


def tool_choice(choice: Any, names: Sequence[str]) -> tuple[str, str | None]:
    """`(mode, forced_name)` of MAF's `tool_choice`: mode `"auto"`, `"required"` or `"none"`.

    Raises:
        ValueError: an unknown mode, a required function that is not among the tools,
            or `"required"` without tools.
    """
    if choice is None:
        return ("auto" if names else "none"), None
    if isinstance(choice, str):
        mode, forced = choice, None
    elif isinstance(choice, Mapping):
        mode, forced = choice.get("mode", "auto"), choice.get("required_function_name")
    else:
        raise ValueError(f"options.tool_choice must be 'auto', 'required', 'none' or a ToolMode, got {choice!r}")
    if mode not in ("auto", "required", "none"):
        raise ValueError(f"options.tool_choice.mode must be 'auto', 'required' or 'none', got {mode!r}")
    if forced is not None and forced not in names:
        raise ValueError(f"options.tool_choice names function {forced!r}, which is not among the tools {list(names)}")
    if mode == "required" and not names:
        raise ValueError("options.tool_choice is 'required' but the call has no function tools")
    return mode, forced


def response_schema(fmt: Any) -> dict[str, Any] | None:
    """The JSON schema a reply must follow (`{}`: any JSON object; `None`: free text).

    Accepts a pydantic model class, a JSON schema, or OpenAI's response formats
    (`{"type": "json_schema", "json_schema": {"schema": ...}}`, `{"type": "json_object"}`).

    Raises:
        ValueError: anything else (named `options.response_format`).
    """
    if fmt is None:
        return None
    if isinstance(fmt, type) and issubclass(fmt, BaseModel):
        return fmt.model_json_schema()
    if isinstance(fmt, Mapping):
        kind = fmt.get("type")
        if kind == "json_object":
            return {}
        if kind == "json_schema":
            inner = fmt.get("json_schema")
            schema = inner.get("schema") if isinstance(inner, Mapping) else None
            if not isinstance(schema, Mapping):
                raise ValueError("options.response_format.json_schema.schema must be a JSON schema object")
            return dict(schema)
        if kind == "text":
            return None
        return dict(fmt)
    raise ValueError(
        f"options.response_format must be a pydantic model class or a JSON schema mapping, got {type(fmt).__name__}"
    )


def call_contents(calls: Sequence[tuple[str, Any]], before: str = "") -> list[Content]:
    """Parsed tool calls `(name, arguments)` (and the text the model wrote before them) as MAF contents.

    Arguments a call did not decode (`None`) become `{}`: MAF's function loop then reports
    the missing ones to the model as the tool's error.
    """
    out: list[Content] = [Content.from_text(before)] if before.strip() else []
    for name, args in calls:
        text = args if isinstance(args, str) else json.dumps({} if args is None else args, ensure_ascii=False)
        out.append(Content.from_function_call(new_call_id(), name, arguments=text))
    return out


def usage_details(results: Sequence[ChatResult]) -> UsageDetails:
    """MAF usage of every pool generation a call ran; `cache_read_input_token_count` is the KV reused."""
    prompt = sum(r.usage.prompt_tokens for r in results)
    completion = sum(r.usage.completion_tokens for r in results)
    return UsageDetails(
        input_token_count=prompt,
        output_token_count=completion,
        total_token_count=prompt + completion,
        cache_read_input_token_count=sum(r.usage.cached_tokens for r in results),
    )
