"""Anthropic Messages request bodies, and their translation to the engine's chat request.

`POST /v1/messages` takes Anthropic's shape: a top-level `system` (text or text
blocks), `messages` of `user`/`assistant` turns whose content is text or blocks (`text`,
`tool_use`, `tool_result`), `tools` with `input_schema`, `tool_choice` as
`{"type": "auto" | "any" | "tool" | "none"}`, a required `max_tokens`, `stop_sequences`.
`to_chat_request` turns the validated body into the `call_request.ChatCallRequest` every
front-end runs (no second validation), so the pool, the tool formats and the identity rules
are the ones chat completions uses:

* a `tool_result` block becomes a `tool` message (its `tool_use_id` the call id), a
  `tool_use` block an assistant `tool_calls` entry (its `input` the JSON arguments);
* `image` and `document` blocks are refused (400 naming the block): the model reads text;
* `thinking` / `redacted_thinking` blocks sent back are dropped (the model does not think);
* `output_config.format` (`json_schema`) is decoded under the schema's grammar;
* a forced `tool_choice` (`any`, `tool`) writes one call (see `_tool_choice`);
* `metadata.user_id` is not an agent id: Anthropic documents it as the end user's id, and one
  user has many conversations; conversations are found by their history (`--anonymous lines`),
  or named with the `X-Agent-Id` header or the `agent_id` extension field.

Every error is a 400 whose message names the field (`messages[1].content[0].type`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from agentmem.server.call_request import ChatCallRequest, FunctionTool, OutputFormat, Sampling
from agentmem.server.http_errors import ApiError
from agentmem.server.schemas import Json, Text, _Body

__all__ = ["AnthropicTool", "CountTokensRequest", "MessageParam", "MessagesRequest", "to_chat_request"]

_REFUSED = {"image": "images", "document": "documents", "search_result": "search results",
            "container_upload": "container uploads"}
_DROPPED = ("thinking", "redacted_thinking")


class MessageParam(_Body):
    """One turn of `messages`: `user` or `assistant`, text or content blocks."""

    role: Literal["user", "assistant"]
    content: Annotated[str | list[dict[str, Any]], Json]


class AnthropicTool(_Body):
    """One entry of `tools`: a client tool (server tools such as `web_search` are refused)."""

    name: Text = Field(min_length=1, max_length=128)
    description: Text | None = None
    input_schema: Annotated[dict[str, Any], Json]
    type: Text | None = None
    """`custom` or absent; anything else is a server tool agentmem does not run."""


class Metadata(_Body):
    """`metadata`: `user_id` is accepted and not used as an agent id (see the module docstring)."""

    user_id: Text | None = None


class CountTokensRequest(_Body):
    """`POST /v1/messages/count_tokens`: the prompt part of a Messages request."""

    model: Text | None = None
    messages: list[MessageParam] = Field(min_length=1)
    system: Annotated[str | list[dict[str, Any]] | None, Json] = None
    tools: list[AnthropicTool] | None = None
    tool_choice: Annotated[dict[str, Any] | None, Json] = None
    agent_id: Text | None = None
    """Extension: the agent id, when the `X-Agent-Id` header names none."""


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: Annotated[list[str] | None, Json] = None
    stream: bool = False
    metadata: Metadata | None = None
    output_config: Annotated[dict[str, Any] | None, Json] = None
    """`{"format": {"type": "json_schema", "schema": {...}}}`: JSON of the schema (grammar-constrained);
    `effort` is ignored."""


def _bad(field: str, message: str) -> ApiError:
    return ApiError(400, f"{field}: {message}", code="invalid_request", param=field)


def _text_of(blocks: list[Any], field: str) -> str:
    """The text of a list of `text` blocks (a `system` or a `tool_result`'s content)."""
    parts = []
    for j, block in enumerate(blocks):
        where = f"{field}[{j}]"
        if not isinstance(block, dict):
            raise _bad(where, "must be a content block object")
        kind = block.get("type")
        if isinstance(kind, str) and kind in _REFUSED:
            raise _bad(f"{where}.type", f"{_REFUSED[kind]} are not supported (this model reads text)")
        if kind != "text":
            raise _bad(f"{where}.type", f"must be 'text', got {kind!r}")
        text = block.get("text")
        if not isinstance(text, str):
            raise _bad(f"{where}.text", "must be a string")
        parts.append(text)
    return "\n\n".join(parts) if field == "system" else "".join(parts)


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A `tool_result` block as a `tool` message."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_use_id", "must be the id of the tool_use block it answers")
    content = block.get("content", "")
    if isinstance(content, list):
        content = _text_of(content, f"{where}.content")
    elif not isinstance(content, str):
        raise _bad(f"{where}.content", "must be a string or a list of text blocks")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise _bad(f"{where}.is_error", "must be a boolean")
    return {"role": "tool", "tool_call_id": call_id, "content": f"Error: {content}" if is_error else content}


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A `tool_use` block as a `tool_calls` entry of the pool's messages."""
    call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.id", "must be a non-empty string")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.name", "must be a non-empty string")
    if not isinstance(args, dict):
        raise _bad(f"{where}.input", "must be a JSON object")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def _turn(i: int, msg: MessageParam) -> list[dict[str, Any]]:
    """One Anthropic turn as the pool's messages: tool results become `tool` messages, in order."""
    if isinstance(msg.content, str):
        return [{"role": msg.role, "content": msg.content}]
    out: list[dict[str, Any]] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(msg.content):
        where = f"messages[{i}].content[{j}]"
        kind = block.get("type")
        if not isinstance(kind, str):
            raise _bad(f"{where}.type", f"must be a block type string, got {kind!r}")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _bad(f"{where}.text", "must be a string")
            text.append(block["text"])
        elif kind == "tool_result" and msg.role == "user":
            if text:  # text before a result stays before it
                out.append({"role": "user", "content": "".join(text)})
                text = []
            out.append(_tool_result(block, where))
        elif kind == "tool_use" and msg.role == "assistant":
            calls.append(_tool_use(block, where))
        elif kind in _DROPPED and msg.role == "assistant":
            continue
        elif kind in _REFUSED:
            raise _bad(f"{where}.type", f"{_REFUSED[kind]} are not supported (this model reads text)")
        else:
            raise _bad(f"{where}.type", f"a {msg.role} turn cannot hold a block of type {kind!r}")
    if msg.role == "assistant":
        return [{"role": "assistant", "content": "".join(text) or None, **({"tool_calls": calls} if calls else {})}]
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool]:
    """The call request's `tool_choice` and `parallel_tool_calls` for Anthropic's `tool_choice`.

    Several calls in one reply are allowed only when the model chooses freely (`auto`, the
    default) and `disable_parallel_tool_use` is not set: a forced choice (`any`, `tool`)
    writes exactly one call, as with `disable_parallel_tool_use` — under a grammar that
    allows more, a small model repeats the call until `max_tokens`.
    """
    if choice is None:
        return None, True
    kind = choice.get("type")
    disabled = choice.get("disable_parallel_tool_use", False)
    if not isinstance(disabled, bool):
        raise _bad("tool_choice.disable_parallel_tool_use", "must be a boolean")
    if kind in ("auto", "none"):
        return kind, not disabled
    if kind == "any":
        return "required", False
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("tool_choice.name", "must name one of the tools")
        return {"type": "function", "function": {"name": name}}, False
    raise _bad("tool_choice.type", f"must be 'auto', 'any', 'tool' or 'none', got {kind!r}")


def _output_format(config: dict[str, Any] | None) -> OutputFormat | None:
    """`output_config.format`: a reply of the JSON schema."""
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _bad("output_config.format.type", "must be 'json_schema'")
    if not isinstance(fmt.get("schema"), dict):
        raise _bad("output_config.format.schema", "must be a JSON schema object")
    return OutputFormat(kind="json_schema", schema=fmt["schema"], field="output_config.format.schema")


def _tools(tools: list[AnthropicTool] | None) -> tuple[FunctionTool, ...]:
    for i, t in enumerate(tools or ()):
        if t.type not in (None, "custom"):
            raise _bad(f"tools[{i}].type", f"server tool {t.type!r} is not supported; send client tools")
    return tuple(FunctionTool(name=t.name, description=t.description or "", parameters=t.input_schema,
                              field=f"tools[{i}].input_schema") for i, t in enumerate(tools or ()))


def _stops(stops: list[str] | None) -> tuple[str, ...]:
    for i, stop in enumerate(stops or ()):
        if not stop:
            raise _bad(f"stop_sequences[{i}]", "must be a non-empty string")
    return tuple(stops or ())


def _messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if isinstance(req.system, list):
        msgs.append({"role": "system", "content": _text_of(req.system, "system")})
    elif req.system:
        msgs.append({"role": "system", "content": req.system})
    for i, m in enumerate(req.messages):
        msgs.extend(_turn(i, m))
    return msgs


def to_chat_request(req: CountTokensRequest) -> ChatCallRequest:
    """The engine's chat request of a validated Anthropic body (a count_tokens body gets `max_tokens` 0).

    The body was validated once, as a `MessagesRequest` or `CountTokensRequest`; what its
    blocks hold is checked here, each error naming the Anthropic field.

    Raises:
        ApiError: 400 naming the field that cannot be translated.
    """
    choice, parallel = _tool_choice(req.tool_choice)
    names = [t.name for t in req.tools or []]
    if isinstance(choice, dict) and choice["function"]["name"] not in names:
        raise _bad("tool_choice.name", f"{choice['function']['name']!r} is not one of the tools {names}")
    common: dict[str, Any] = {"messages": tuple(_messages(req)), "tools": _tools(req.tools), "tool_choice": choice,
                              "parallel_tool_calls": parallel, "agent_id": req.agent_id, "model": req.model}
    if not isinstance(req, MessagesRequest):
        return ChatCallRequest(sampling=Sampling(max_tokens=0), **common)
    sampling = Sampling(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                        stop=_stops(req.stop_sequences))
    return ChatCallRequest(sampling=sampling, stream=req.stream, output=_output_format(req.output_config), **common)
