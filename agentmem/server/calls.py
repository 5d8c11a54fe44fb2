"""OpenAI request bodies → prepared pool calls, and generated text → OpenAI replies.

Tools speak the model's own tool-call syntax, `MemoryPool.tool_format`
(`agentmem.tools.formats`), the way the LangChain and AutoGen integrations do:

* `tools` are shown whatever `tool_choice` is, so the agent's prompt prefix, and the KV
  kept for it, does not change between forced and free calls: through the chat template
  (its `tools` variable) for a native format such as Qwen2.5's `hermes`, else as
  agentmem's tools block at the end of the system message (`tools_prompt`,
  `with_system_block`) for the `envelope` format (Gemma 3, the built-in formats);
* `tool_choice="required"` or a named function decodes under the format's grammar
  (`ToolFormat.forced`), its forced opening moved into the prompt (a native format's as
  the pool's `opening`, tokenized as the template renders the call sent back), so the
  call always parses and is written exactly as the template writes it back;
* `tool_choice="auto"` (the default) generates freely; a reply that opens like a call
  (`ToolFormat.opens_call`) but does not parse as calls of known tools is retried once
  forced. A reply that opens as a bare call object gets the format's opening in the pool
  (`MemoryPool.chat`'s `canonical_calls`, `agentmem.pool.canon`); a native call written in
  another shape (after some text, other spacing) is parsed leniently (`ToolFormat.find`);
* a native call is put into the agent's KV exactly as the template writes it back
  (`Reply.written_back`) when the KV holds it otherwise, so the next request, which
  carries the call and its result, reuses the KV of the whole call;
* `response_format` `json_object` / `json_schema` decodes under `JSON_OBJECT_GRAMMAR` /
  `schema_grammar`, the schema also shown in the prompt (`json_prompt`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from agentmem.errors import ConfigError
from agentmem.server.schemas import ChatCompletionRequest, CompletionRequest, ResponseFormat
from agentmem.server.settings import ServerSettings
from agentmem.tools import (
    ParsedCall,
    ToolFormat,
    clean_schema,
    get_tool_format,
    json_prompt,
    new_call_id,
    tools_prompt,
    with_system_block,
)
from agentmem.tools.forced import forced_call_grammar, forced_json_grammar
from agentmem.tools.limits import check_schema
from agentmem.tools.parse import CallGate

__all__ = ["PoolCall", "Reply", "StreamHolder", "chat_call", "completion_call", "normalize_tool_choice", "read_reply"]

Mode = Literal["text", "json", "tools", "auto"]


@dataclass
class PoolCall:
    """One call, ready for the pool, and how to read its reply.

    Attributes:
        agent_id: the agent.
        messages: the chat history (with the tools/JSON block) or `None` for a raw completion.
        prompt: the raw completion prompt, or `None`.
        sampling: keyword arguments of `MemoryPool.chat_stream` / `complete_stream`.
        mode: `text`, `json` (grammar-constrained JSON), `tools` (a forced call) or
            `auto` (the model may call a tool).
        prefix: text a grammar forces at the start of the reply, put in the prompt as
            the start of the assistant turn and prepended to the reply.
        tool_names: the functions the request offers.
        forced: in `auto` mode, builds the same call with a call forced (the retry).
        fmt: the model's tool-call syntax (`MemoryPool.tool_format`).
        line: how a request without an agent id found `agent_id` (`Line.kind`; "" when named).
    """

    agent_id: str
    messages: list[dict[str, Any]] | None
    prompt: str | None
    sampling: dict[str, Any]
    mode: Mode = "text"
    prefix: str = ""
    tool_names: tuple[str, ...] = ()
    forced: Callable[[], PoolCall] | None = None
    fmt: ToolFormat = field(default_factory=lambda: get_tool_format("envelope"))
    line: str = ""

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The tools the chat template shows (native formats only), as `MemoryPool.chat` takes them."""
        return self.sampling.get("tools")

    def rewrite_call(self, text: str) -> PoolCall:
        """A call that prefills `text` as the agent's reply and generates nothing (`Reply.written_back`)."""
        assert self.messages is not None, "a completion call has no messages"
        keep = {"tools": self.tools} if self.tools else {}
        return PoolCall(self.agent_id, [*self.messages, {"role": "assistant", "content": text}], None,
                        {**keep, "max_tokens": 0}, fmt=self.fmt)

    def pool_messages(self) -> list[dict[str, Any]]:
        """The messages to send (a forced prefix as a started assistant turn, unless sent as `opening`)."""
        assert self.messages is not None, "a completion call has no messages"
        if not self.prefix or "opening" in self.sampling:
            return self.messages
        return [*self.messages, {"role": "assistant", "content": self.prefix}]


@dataclass
class Reply:
    """What a reply means: text content and/or tool calls (OpenAI shape), or a retry.

    Attributes:
        content: the text (`None` for a call without text).
        tool_calls: `{"id", "type": "function", "function": {"name", "arguments"}}` each.
        retry: an `auto` reply that looked like a call but did not parse; redo it forced.
        written_back: for calls in a native format, the reply as the template writes it
            back into the next prompt; when the agent's KV holds other tokens (the model
            wrote the call in another shape, or split it into other tokens) the server
            prefills this text as the reply (`PoolCall.rewrite_call`), so the next request
            reuses the KV of the whole call.
    """

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    retry: bool = False
    written_back: str | None = None


def normalize_tool_choice(choice: str | Mapping[str, Any] | None, names: Sequence[str]) -> str:
    """`auto`, `none`, `required` or the one function's name, from OpenAI's `tool_choice`.

    Raises:
        ConfigError: an unknown choice or a function that is not in `tools` (the message
            lists the offered functions).
    """
    if choice is None or choice == "auto":
        return "auto"
    if choice in ("none", "required"):
        return str(choice)
    name: Any = None
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else choice.get("name")
    if isinstance(name, str) and name in names:
        return name
    raise ConfigError(
        f"tool_choice {choice!r} is not 'auto', 'none', 'required' or "
        f"{{'type': 'function', 'function': {{'name': ...}}}} naming one of the tools {list(names)}"
    )


def _response_schema(fmt: ResponseFormat) -> dict[str, Any] | None:
    if fmt.type == "json_object":
        return None
    schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
    if not isinstance(schema, dict):
        raise ConfigError("response_format.json_schema.schema must be a JSON schema object")
    check_schema(schema, field="response_format.json_schema.schema")  # before anything walks it
    return schema


def _sampling(req: ChatCompletionRequest | CompletionRequest, settings: ServerSettings) -> dict[str, Any]:
    if req.n != 1:
        raise ConfigError(f"n must be 1 (one choice per call), got {req.n}")
    if req.logprobs:
        raise ConfigError("logprobs are not supported")
    max_tokens = getattr(req, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = req.max_tokens
    if max_tokens is None:
        max_tokens = settings.default_max_tokens
    if max_tokens > settings.max_tokens_limit:
        raise ConfigError(f"max_tokens must be <= {settings.max_tokens_limit} on this server, got {max_tokens}")
    out: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0 if req.temperature is None else req.temperature}
    if req.stop:
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        if any(not s for s in stops):
            raise ConfigError("stop strings must be non-empty")
        out["stop"] = stops
    for name in ("top_p", "top_k", "min_p", "repeat_penalty", "seed"):
        value = getattr(req, name)
        if value is not None:
            out[name] = value
    return out


def chat_call(
    agent_id: str, req: ChatCompletionRequest, settings: ServerSettings, fmt: ToolFormat | None = None
) -> PoolCall:
    """The pool call of a chat request (tools, `tool_choice`, `response_format` applied).

    Args:
        agent_id: the agent.
        req: the request body.
        settings: the server settings (token limits).
        fmt: the model's tool-call syntax (`MemoryPool.tool_format`; default: the envelope).

    Raises:
        ConfigError: an unsupported combination or value (names the field).
    """
    fmt = fmt if fmt is not None else get_tool_format("envelope")
    sampling = _sampling(req, settings)
    msgs = [m.to_pool() for m in req.messages]
    tools = req.tools or []
    choice = req.tool_choice
    rf = req.response_format if req.response_format is not None and req.response_format.type != "text" else None
    if tools:
        specs = [
            {"name": t.function.name, "description": t.function.description or "",
             "parameters": clean_schema(t.function.parameters or {"type": "object", "properties": {}},
                                        field=f"tools[{i}].function.parameters")}
            for i, t in enumerate(tools)
        ]
        names = tuple(s["name"] for s in specs)
        if len(set(names)) != len(names):
            raise ConfigError(f"tools: function names must be unique, got {list(names)}")
        picked = normalize_tool_choice(choice, names)
        if rf is not None and picked != "none":
            raise ConfigError("tools and response_format cannot be used together (unless tool_choice is 'none')")
        if fmt.native:  # the model's own template shows the tools
            sampling = {**sampling, "tools": specs}
        else:
            msgs = with_system_block(msgs, tools_prompt(specs))
        parallel = bool(req.parallel_tool_calls) and fmt.parallel
        tools_json = json.dumps(specs)

        def forced(only: str | None = None) -> PoolCall:
            prefix, g = forced_call_grammar(fmt, tools_json, only, parallel)
            opening = {"opening": prefix} if fmt.native else {}  # as the template renders a call sent back
            return PoolCall(agent_id, msgs, None, {**sampling, "grammar": g, **opening}, "tools", prefix, names, fmt=fmt)

        if picked == "required":
            return forced()
        if picked in names:
            return forced(picked)
        if picked == "auto":
            return PoolCall(agent_id, msgs, None, sampling, "auto", "", names, forced=forced, fmt=fmt)
        # "none": shown, not called (a reply that opens like a call stays as written)
        return PoolCall(agent_id, msgs, None, {**sampling, "canonical_calls": False}, fmt=fmt)
    if choice not in (None, "auto", "none"):
        raise ConfigError(f"tool_choice {choice!r} needs tools")
    if rf is not None:
        schema = _response_schema(rf)
        msgs = with_system_block(msgs, json_prompt(schema))
        prefix, g = forced_json_grammar(None if schema is None else json.dumps(schema, sort_keys=True))
        return PoolCall(agent_id, msgs, None, {**sampling, "grammar": g}, "json", prefix)
    return PoolCall(agent_id, msgs, None, sampling)


def completion_call(agent_id: str, req: CompletionRequest, settings: ServerSettings) -> PoolCall:
    """The pool call of a raw completion request.

    Raises:
        ConfigError: a list of several prompts, `echo`, or a bad sampling value.
    """
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ConfigError(f"prompt must be one string (one agent per call), got a list of {len(prompt)}")
        prompt = prompt[0]
    if req.echo:
        raise ConfigError("echo is not supported")
    if not prompt:
        raise ConfigError("prompt must be a non-empty string")
    return PoolCall(agent_id, None, prompt, _sampling(req, settings))


def _openai_calls(calls: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {"id": new_call_id(), "type": "function",
         "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        for c in calls
    ]


def _calls_reply(call: PoolCall, calls: Sequence[ParsedCall], content: str | None = None) -> Reply:
    """A reply of `calls`; for a native format with the text the template writes back for them."""
    reply = Reply(content=content, tool_calls=_openai_calls(calls))
    if call.fmt.native:
        reply.written_back = call.fmt.written_back(content or "", [(c.name, c.arguments) for c in calls])
    return reply


def read_reply(call: PoolCall, text: str) -> Reply:
    """What the generated `text` of `call` means (in the call's tool format).

    A forced call that does not parse (cut off by `max_tokens` or a stop string) comes
    back as its raw text in `content`, with no tool calls.
    """
    full = call.prefix + text
    if call.mode in ("text", "json"):
        return Reply(content=full)
    parsed = call.fmt.parse(full)
    if call.mode == "auto":
        if parsed is None and call.fmt.native:  # a call after some text, or in another shape
            found = call.fmt.find(full, call.tool_names)
            if found is not None:
                return _calls_reply(call, found[0], found[1] or None)
        if parsed is None:
            return Reply(content=full)
        bad = not parsed or any(not c.ok or c.name not in call.tool_names for c in parsed)
        if bad and call.forced is not None:
            return Reply(retry=True)
    if parsed is None or not parsed or any(not c.ok for c in parsed):
        return Reply(content=full)
    return _calls_reply(call, parsed)


class StreamHolder(CallGate):
    """Which streamed text may be sent now (`agentmem.tools.parse.CallGate`).

    Text replies stream as they come (a JSON reply starts with its forced prefix). A
    forced call is held to the end, where it goes out as `tool_calls`. In `auto` mode the
    start of a reply is held while it could still be a call (`ToolFormat.opens_call` of
    the call's format).
    """

    def __init__(self, call: PoolCall) -> None:
        super().__init__(call.fmt, call.mode)
        self.opening = call.prefix if call.mode == "json" else ""

    def push(self, piece: str) -> str:
        """Text to send for the generated `piece` (possibly `""`)."""
        if self.opening:
            piece, self.opening = self.opening + piece, ""
        return super().push(piece)

    def rest(self, reply: Reply) -> str:
        """Held text still to send once the reply is known."""
        out = self.opening
        self.opening = ""
        if reply.tool_calls or reply.retry:
            return out
        if self.decided == "tool" and reply.content is not None:
            return out + reply.content  # a call that did not parse: its text is the content
        return out + self.held

