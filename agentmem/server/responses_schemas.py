"""The OpenAI Responses API request, and its translation into the engine's chat request.

`POST /v1/responses` is served by the same pool call as `POST /v1/chat/completions`:
`to_chat` turns a validated `ResponseCreateRequest` (and the conversation a
`previous_response_id` stored) into a `call_request.ChatCallRequest`, which
`Engine.prepare_chat` runs unchanged; nothing is validated twice.

| Responses | the chat request |
|---|---|
| `instructions` | a `system` message first |
| `input` as a string | one `user` message |
| `message` items (`input_text` / `output_text` parts) | messages of their role (`developer` is `system`) |
| `function_call` items (`call_id`, `name`, `arguments`) | `tool_calls` of an `assistant` message (consecutive calls, and the text just before them, are one message) |
| `function_call_output` items | `tool` messages |
| `reasoning` items | dropped (the model has no reasoning channel) |
| `tools` `{type: function, name, parameters, strict}` | `tools` (`FunctionTool`) |
| `tool_choice` `{type: function, name}` | `{type: function, function: {name}}` |
| `text.format` (`json_object`, `json_schema`) | `output` (`OutputFormat`) |
| `max_output_tokens` | `sampling.max_tokens` |

Everything else a client may send that agentmem cannot honour (hosted tools such as
`web_search` or `file_search`, images, files, `background`, `conversation`, reusable
`prompt`s, `top_logprobs`) is a 400 naming the field (`ResponsesInputError.field`).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from agentmem.errors import ConfigError
from agentmem.server.call_request import ChatCallRequest, FunctionTool, OutputFormat, Sampling
from agentmem.server.schemas import Json, Text

__all__ = ["ResponseCreateRequest", "ResponsesInputError", "items_to_messages", "new_item_id", "normalize_input",
           "public_tools", "rename_field", "to_chat"]

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")
_ROLES = ("user", "assistant", "system", "developer")


class ResponsesInputError(ConfigError):
    """A Responses request field agentmem cannot read or honour; `field` is its path (`input[2].content[0].type`)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ResponseCreateRequest(BaseModel):
    """`POST /v1/responses` (OpenAI's fields; unknown ones are ignored, as chat completions does).

    Strict like the chat request: a field takes its own JSON type only, so a mistyped
    request is a 400 naming the field. `input` items are read by `normalize_input`.
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    model: Text | None = None
    input: Annotated[str | list[Any] | None, Json] = None
    instructions: Text | None = None
    tools: Annotated[list[Any] | None, Json] = None
    tool_choice: Annotated[str | dict[str, Any] | None, Json] = None
    parallel_tool_calls: bool | None = None
    text: Annotated[dict[str, Any] | None, Json] = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[Text, Field(max_length=512)]] | None = Field(
        default=None, max_length=16)
    previous_response_id: Text | None = Field(default=None, max_length=256)
    user: Text | None = None
    """The agent id (unless the `X-Agent-Id` header names one), as in chat completions."""
    agent_id: Text | None = None
    """Extension: the agent id, when neither the header nor `user` names one."""
    seed: int | None = None
    stop: Annotated[str | list[str] | None, Json] = None
    """Extension (chat completions' `stop`)."""
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None

    def refuse_unsupported(self) -> None:
        """400 for the features agentmem does not serve, naming the field."""
        if self.background:
            raise ResponsesInputError("background responses are not supported; send background: false",
                                      field="background")
        if self.conversation is not None:
            raise ResponsesInputError("conversations are not supported; chain responses with previous_response_id",
                                      field="conversation")
        if self.prompt is not None:
            raise ResponsesInputError("reusable prompts are not supported; send instructions and input",
                                      field="prompt")
        if self.top_logprobs:
            raise ResponsesInputError("logprobs are not supported", field="top_logprobs")


def new_item_id(prefix: str) -> str:
    """A fresh item id (`msg_…`, `fc_…`, `fco_…`)."""
    return f"{prefix}_{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------- input items
def _text_of(content: Any, field: str) -> str:
    """The text of a message's `content`: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ResponsesInputError("must be a string or a list of content parts", field=field)
    texts = []
    for j, part in enumerate(content):
        where = f"{field}[{j}]"
        if not isinstance(part, Mapping):
            raise ResponsesInputError("must be an object", field=where)
        kind = part.get("type")
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
            continue
        if kind not in _TEXT_PARTS:
            raise ResponsesInputError(f"content part type {kind!r} is not supported (text parts only: "
                                      f"{', '.join(_TEXT_PARTS[:2])})", field=f"{where}.type")
        if not isinstance(part.get("text"), str):
            raise ResponsesInputError("must be a string", field=f"{where}.text")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: Mapping[str, Any], key: str, field: str, *, required: bool = True) -> str | None:
    value = item.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value and key != "arguments"):
        raise ResponsesInputError("must be a non-empty string", field=f"{field}.{key}")
    return value


def _item_id(item: Mapping[str, Any], prefix: str) -> str:
    given = item.get("id")
    return given if isinstance(given, str) and 0 < len(given) <= 256 else new_item_id(prefix)


def _message(item: Mapping[str, Any], field: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise ResponsesInputError(f"role {role!r} is not one of {', '.join(_ROLES)}", field=f"{field}.role")
    text = _text_of(item.get("content"), f"{field}.content")
    kind = "output_text" if role == "assistant" else "input_text"
    part: dict[str, Any] = {"type": kind, "text": text}
    if kind == "output_text":
        part["annotations"] = []
    return {"type": "message", "id": _item_id(item, "msg"), "role": role, "content": [part], "status": "completed"}


def _function_call(item: Mapping[str, Any], field: str) -> dict[str, Any]:
    return {"type": "function_call", "id": _item_id(item, "fc"), "call_id": _string(item, "call_id", field),
            "name": _string(item, "name", field), "arguments": _string(item, "arguments", field) or "",
            "status": "completed"}


def _function_output(item: Mapping[str, Any], field: str) -> dict[str, Any]:
    output = item.get("output")
    text = _text_of(output, f"{field}.output")
    return {"type": "function_call_output", "id": _item_id(item, "fco"), "call_id": _string(item, "call_id", field),
            "output": text, "status": "completed"}


def normalize_input(value: str | list[Any] | None) -> list[dict[str, Any]]:
    """`input` as stored items: every message, call and call output in one shape, with ids.

    Raises:
        ResponsesInputError: an item or part agentmem cannot read (the field names it).
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "id": new_item_id("msg"), "role": "user",
                 "content": [{"type": "input_text", "text": value}], "status": "completed"}]
    items = []
    for i, item in enumerate(value):
        field = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise ResponsesInputError("must be an object", field=field)
        kind = item.get("type", "message")
        if kind == "message":
            items.append(_message(item, field))
        elif kind == "function_call":
            items.append(_function_call(item, field))
        elif kind == "function_call_output":
            items.append(_function_output(item, field))
        elif kind == "reasoning":
            continue  # nothing to replay: the model has no reasoning channel
        else:
            raise ResponsesInputError(
                f"item type {kind!r} is not supported (message, function_call, function_call_output)",
                field=f"{field}.type")
    return items


def items_to_messages(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Stored items as chat messages: a call joins the assistant message just before it."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": "".join(p["text"] for p in item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


# ---------------------------------------------------------------------------- tools, format
def _tool(tool: Any, i: int) -> dict[str, Any]:
    field = f"tools[{i}]"
    if not isinstance(tool, Mapping):
        raise ResponsesInputError("must be an object", field=field)
    kind = tool.get("type")
    if kind != "function":
        raise ResponsesInputError(f"tool type {kind!r} is not supported: this server runs function tools only "
                                  "(hosted tools such as web_search or file_search are OpenAI's)", field=f"{field}.type")
    if isinstance(tool.get("function"), Mapping):  # the chat-completions shape, sent here by mistake: read it too
        tool = tool["function"]
    fn = {"name": tool.get("name"), "description": tool.get("description"), "parameters": tool.get("parameters"),
          "strict": tool.get("strict")}
    if not isinstance(fn["name"], str) or not fn["name"]:
        raise ResponsesInputError("must be a non-empty string", field=f"{field}.name")
    if len(fn["name"]) > 128:
        raise ResponsesInputError("must be at most 128 characters", field=f"{field}.name")
    _typed(fn, "description", str, "a string", field)
    _typed(fn, "parameters", dict, "a JSON schema object", field)
    _typed(fn, "strict", bool, "a boolean", field)
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


def _typed(obj: Mapping[str, Any], key: str, kind: type, what: str, field: str) -> None:
    """400 naming `field.key` unless `obj[key]` is absent (`None`) or a `kind`."""
    if obj.get(key) is not None and not isinstance(obj[key], kind):
        raise ResponsesInputError(f"must be {what}", field=f"{field}.{key}")


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    kind = choice.get("type")
    if kind == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ResponsesInputError(f"tool_choice type {kind!r} is not supported: 'auto', 'none', 'required' or "
                              "{'type': 'function', 'name': ...}", field="tool_choice")


def _output_format(text: dict[str, Any] | None) -> OutputFormat | None:
    """`text.format` as the reply's format (`None`: text)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise ResponsesInputError("must be an object", field="text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat(kind="json_object", field="text.format")
    if kind == "json_schema":
        for key in ("name", "description"):
            _typed(fmt, key, str, "a string", "text.format")
        _typed(fmt, "strict", bool, "a boolean", "text.format")
        if not isinstance(fmt.get("schema"), dict):
            raise ResponsesInputError("must be a JSON schema object", field="text.format.schema")
        return OutputFormat(kind="json_schema", schema=fmt["schema"], field="text.format.schema")
    raise ResponsesInputError(f"format type {kind!r} is not one of text, json_object, json_schema",
                              field="text.format.type")


def public_tools(req: ResponseCreateRequest) -> list[dict[str, Any]]:
    """The request's tools as a response echoes them (the flat Responses shape)."""
    out = []
    for i, tool in enumerate(req.tools or []):
        fn = _tool(tool, i)["function"]
        out.append({"type": "function", "name": fn["name"], "description": fn.get("description"),
                    "parameters": fn.get("parameters"), "strict": fn.get("strict", True)})
    return out


# ---------------------------------------------------------------------------- the chat request
_FIELD_NAMES = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format"}


def rename_field(field: str | None) -> str | None:
    """A chat call's error field (`tools[0].function.parameters`) as the Responses field (`tools[0].parameters`)."""
    if field is None:
        return None
    if field.startswith("response_format.json_schema"):
        return "text.format" + field.removeprefix("response_format.json_schema")
    if field.startswith("tools[") and ".function." in field:
        return field.replace(".function.", ".", 1)
    head, dot, rest = field.partition(".")
    return _FIELD_NAMES.get(head, head) + dot + rest


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not s for s in stops):
        raise ResponsesInputError("stop strings must be non-empty", field="stop")
    return stops


def to_chat(req: ResponseCreateRequest, items: Sequence[Mapping[str, Any]]) -> ChatCallRequest:
    """The engine's chat request of a validated Responses request whose whole conversation is `items`.

    `items` is the stored conversation of `previous_response_id` (if any) followed by the
    request's own input (`normalize_input`); `instructions` come first as the system message
    (a previous response's instructions are not carried over, as OpenAI does). Tools and
    `text.format` are checked here, naming the Responses field: nothing validates again.

    Raises:
        ResponsesInputError: an unsupported tool, tool choice or format, or an empty conversation.
    """
    req.refuse_unsupported()
    messages = items_to_messages(items)
    if req.instructions:
        messages.insert(0, {"role": "system", "content": req.instructions})
    if not messages:
        raise ResponsesInputError("the conversation is empty: send input (or instructions)", field="input")
    tools = tuple(FunctionTool(name=fn["name"], description=fn.get("description") or "",
                               parameters=fn.get("parameters"), field=f"tools[{i}].parameters")
                  for i, fn in ((i, _tool(t, i)["function"]) for i, t in enumerate(req.tools or ())))
    sampling = Sampling(max_tokens=req.max_output_tokens, temperature=req.temperature, top_p=req.top_p,
                        seed=req.seed, stop=_stops(req.stop))
    return ChatCallRequest(
        messages=tuple(messages), tools=tools,
        tool_choice=_tool_choice(req.tool_choice) if req.tools or req.tool_choice not in (None, "auto") else None,
        parallel_tool_calls=bool(req.parallel_tool_calls), output=_output_format(req.text), sampling=sampling,
        stream=req.stream, model=req.model, user=req.user, agent_id=req.agent_id)
