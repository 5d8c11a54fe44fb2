"""Ollama API request bodies (`/api/chat`, `/api/generate`, `/api/show`) and their translation.

`to_chat_request` turns a validated `/api/chat` body into the engine's `call_request.ChatCallRequest`
(no second validation; the pool, tool formats and identity rules chat completions uses):

* `tool_calls` of an assistant message (`{"function": {"name", "arguments": {...}}}`, no
  id) get ids `call_{turn}_{k}`, and a `tool` message answers the earliest call before it
  not answered yet (or, by `tool_name`, the call of that name) — the tool-call ids never
  reach the prompt, so they only pair results with calls;
* `format` `"json"` is a JSON-object reply, a schema object a reply of that schema;
* `options` `temperature`, `top_p`, `top_k`, `min_p`, `repeat_penalty`, `seed`, `stop`,
  `num_predict` (a negative one: the server's default) apply; the others (`num_ctx`,
  `num_gpu`, …) belong to the server's own start-up and are ignored, like `keep_alive`;
* `images` are refused (400 naming the message): the model reads text.

`stream` defaults to true, as in Ollama.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from agentmem.server.call_request import ChatCallRequest, CompletionCallRequest, FunctionTool, OutputFormat, Sampling
from agentmem.server.http_errors import ApiError
from agentmem.server.schemas import Json, Text, Tool, _Body

__all__ = ["ChatRequest", "GenerateRequest", "OllamaMessage", "Options", "ShowRequest", "to_chat_request",
           "to_generate_request"]


class Options(_Body):
    """`options`: the sampling ones agentmem applies (others are ignored)."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    seed: int | None = None
    stop: Annotated[list[str] | None, Json] = None
    num_predict: int | None = None
    """Tokens to generate; negative (Ollama's "until done"): the server's default."""


class OllamaMessage(_Body):
    """One message of `/api/chat`'s `messages`."""

    role: Literal["system", "user", "assistant", "tool"]
    content: Text | None = None
    images: Annotated[list[Any] | None, Json] = None
    tool_calls: Annotated[list[dict[str, Any]] | None, Json] = None
    tool_name: Text | None = None
    thinking: Text | None = None
    """Accepted and dropped (the model does not think)."""


class _Common(_Body):
    model: Text | None = None
    """The model: ignored with one (any name gets it); with several, a model's name (unknown: 404)."""
    stream: bool = True
    format: Annotated[str | dict[str, Any] | None, Json] = None
    options: Options | None = None
    keep_alive: Annotated[str | int | float | None, Json] = None
    """Ignored: agents stay kept by the pool's own policy."""
    agent_id: Text | None = None
    """Extension: the agent id, when the `X-Agent-Id` header names none."""


class ChatRequest(_Common):
    """`POST /api/chat`."""

    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[Tool] | None = None
    """Ollama's tools have OpenAI's shape (`{"type": "function", "function": {...}}`): validated as those."""


class GenerateRequest(_Common):
    """`POST /api/generate`: `prompt` in the chat template (with `system`), or `raw` as it is."""

    prompt: Text = ""
    system: Text | None = None
    raw: bool = False
    images: Annotated[list[Any] | None, Json] = None
    suffix: Text | None = None
    template: Text | None = None
    context: Annotated[list[int] | None, Json] = None


class ShowRequest(_Body):
    """`POST /api/show` (`model`, or the older `name`)."""

    model: Text | None = None
    name: Text | None = None


def _bad(field: str, message: str) -> ApiError:
    return ApiError(400, f"{field}: {message}", code="invalid_request", param=field)


def _calls(i: int, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ollama `tool_calls` as OpenAI's (`call_{i}_{k}` ids, arguments as JSON text)."""
    out = []
    for k, c in enumerate(calls):
        where = f"messages[{i}].tool_calls[{k}].function"
        fn = c.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"{where}.name", "must be a non-empty string")
        args = fn.get("arguments", {})
        if isinstance(args, str):  # some clients send the OpenAI way
            try:
                args = json.loads(args)
            except ValueError:
                raise _bad(f"{where}.arguments", "must be a JSON object") from None
        if not isinstance(args, dict):
            raise _bad(f"{where}.arguments", "must be a JSON object")
        out.append({"id": f"call_{i}_{k}", "type": "function",
                    "function": {"name": fn["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
    return out


def _answered(pending: list[dict[str, Any]], name: str | None) -> str:
    """The id of the call a tool result answers (by `tool_name`, else the earliest open one)."""
    for k, call in enumerate(pending):
        if name is None or call["function"]["name"] == name:
            return str(pending.pop(k)["id"])
    return str(pending.pop(0)["id"]) if pending else "call_unpaired"


def _messages(msgs: list[OllamaMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        if m.images:
            raise _bad(f"messages[{i}].images", "images are not supported (this model reads text)")
        if m.role == "assistant" and m.tool_calls:
            calls = _calls(i, m.tool_calls)
            pending = list(calls)
            out.append({"role": "assistant", "content": m.content or None, "tool_calls": calls})
        elif m.role == "tool":
            out.append({"role": "tool", "content": m.content or "", "tool_call_id": _answered(pending, m.tool_name),
                        **({"name": m.tool_name} if m.tool_name else {})})
        else:
            out.append({"role": m.role, "content": m.content or ""})
    return out


def _format(fmt: str | dict[str, Any] | None) -> OutputFormat | None:
    """`format`: `"json"` is any JSON object, a schema object JSON of that schema."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return OutputFormat(kind="json_object", field="format")
    if isinstance(fmt, dict):
        return OutputFormat(kind="json_schema", schema=fmt, field="format")
    raise _bad("format", f"must be 'json' or a JSON schema object, got {fmt!r}")


def _call_fields(req: _Common) -> dict[str, Any]:
    """What every call request of an Ollama body takes: sampling (`options`), stream, model, agent."""
    opts = req.options or Options()
    for i, stop in enumerate(opts.stop or ()):
        if not stop:
            raise _bad(f"options.stop[{i}]", "must be a non-empty string")
    max_tokens = opts.num_predict if opts.num_predict is not None and opts.num_predict >= 0 else None
    sampling = Sampling(max_tokens=max_tokens, temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k,
                        min_p=opts.min_p, repeat_penalty=opts.repeat_penalty, seed=opts.seed,
                        stop=tuple(opts.stop or ()))
    return {"sampling": sampling, "stream": req.stream, "model": req.model, "agent_id": req.agent_id}


def to_chat_request(req: ChatRequest) -> ChatCallRequest:
    """The engine's chat request of a validated `/api/chat` body.

    Raises:
        ApiError: 400 naming the field that cannot be translated.
    """
    if not req.messages:
        raise _bad("messages", "must hold at least one message")
    tools = tuple(FunctionTool(name=t.function.name, description=t.function.description or "",
                               parameters=t.function.parameters, field=f"tools[{i}].function.parameters")
                  for i, t in enumerate(req.tools or ()))
    return ChatCallRequest(messages=tuple(_messages(req.messages)), tools=tools, output=_format(req.format),
                           **_call_fields(req))


def to_generate_request(req: GenerateRequest) -> ChatCallRequest | CompletionCallRequest:
    """`/api/generate` as a chat request (the template applied) or, `raw`, a completion request.

    Raises:
        ApiError: 400 for images, `suffix`, `template`, `context`, or `format` with `raw`.
    """
    for name in ("images", "suffix", "template", "context"):
        if getattr(req, name):
            raise _bad(name, "is not supported by this server")
    if req.raw:
        if req.format:
            raise _bad("format", "cannot be used with raw (send the prompt through the chat template)")
        return CompletionCallRequest(prompt=req.prompt, **_call_fields(req))
    msgs = [{"role": "system", "content": req.system}] if req.system else []
    msgs.append({"role": "user", "content": req.prompt})
    return ChatCallRequest(messages=tuple(msgs), output=_format(req.format), **_call_fields(req))
