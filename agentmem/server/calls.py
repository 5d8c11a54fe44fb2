"""OpenAI request bodies → prepared pool calls, and generated text → OpenAI replies.

Tools and structured output speak agentmem's one tool-call protocol (`agentmem.tools`),
the same prompt block, grammars and parsing the LangChain and AutoGen integrations use:

* `tools` are described at the end of the system message (`tools_prompt`,
  `with_system_block`) whatever `tool_choice` is, so the agent's prompt prefix, and the
  KV kept for it, does not change between forced and free calls;
* `tool_choice="required"` or a named function decodes under `tool_call_grammar`, its
  forced opening moved into the prompt (`split_forced_prefix`), so the call always parses;
* `tool_choice="auto"` (the default) generates freely; a reply that opens like a call
  (`opens_tool_call`) but does not parse as calls of known tools is retried once forced;
* `response_format` `json_object` / `json_schema` decodes under `JSON_OBJECT_GRAMMAR` /
  `schema_grammar`, the schema also shown in the prompt (`json_prompt`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from agentmem.errors import ConfigError
from agentmem.server.schemas import ChatCompletionRequest, CompletionRequest, ResponseFormat
from agentmem.server.settings import ServerSettings
from agentmem.tools import (
    JSON_OBJECT_GRAMMAR,
    clean_schema,
    json_prompt,
    new_call_id,
    opens_tool_call,
    parse_envelope,
    schema_grammar,
    split_forced_prefix,
    tool_call_grammar,
    tools_prompt,
    with_system_block,
)

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
    """

    agent_id: str
    messages: list[dict[str, Any]] | None
    prompt: str | None
    sampling: dict[str, Any]
    mode: Mode = "text"
    prefix: str = ""
    tool_names: tuple[str, ...] = ()
    forced: Callable[[], PoolCall] | None = None

    def pool_messages(self) -> list[dict[str, Any]]:
        """The messages to send (the forced prefix as a started assistant turn)."""
        assert self.messages is not None, "a completion call has no messages"
        if not self.prefix:
            return self.messages
        return [*self.messages, {"role": "assistant", "content": self.prefix}]


@dataclass
class Reply:
    """What a reply means: text content and/or tool calls (OpenAI shape), or a retry."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    retry: bool = False


@functools.lru_cache(maxsize=256)
def _tool_grammar(tools_json: str, only: str | None, parallel: bool) -> tuple[str, str]:
    tools = json.loads(tools_json)
    if only is not None:
        tools = [t for t in tools if t["name"] == only]
    return split_forced_prefix(tool_call_grammar(tools, parallel=parallel))


@functools.lru_cache(maxsize=256)
def _json_grammar(schema_json: str | None) -> tuple[str, str]:
    grammar = JSON_OBJECT_GRAMMAR if schema_json is None else schema_grammar(json.loads(schema_json))
    return split_forced_prefix(grammar)


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


def chat_call(agent_id: str, req: ChatCompletionRequest, settings: ServerSettings) -> PoolCall:
    """The pool call of a chat request (tools, `tool_choice`, `response_format` applied).

    Raises:
        ConfigError: an unsupported combination or value (names the field).
    """
    sampling = _sampling(req, settings)
    msgs = [m.to_pool() for m in req.messages]
    tools = req.tools or []
    choice = req.tool_choice
    fmt = req.response_format if req.response_format is not None and req.response_format.type != "text" else None
    if tools:
        specs = [
            {"name": t.function.name, "description": t.function.description or "",
             "parameters": clean_schema(t.function.parameters or {"type": "object", "properties": {}})}
            for t in tools
        ]
        names = tuple(s["name"] for s in specs)
        if len(set(names)) != len(names):
            raise ConfigError(f"tools: function names must be unique, got {list(names)}")
        picked = normalize_tool_choice(choice, names)
        if fmt is not None and picked != "none":
            raise ConfigError("tools and response_format cannot be used together (unless tool_choice is 'none')")
        msgs = with_system_block(msgs, tools_prompt(specs))
        parallel = bool(req.parallel_tool_calls)
        tools_json = json.dumps(specs)

        def forced(only: str | None = None) -> PoolCall:
            prefix, g = _tool_grammar(tools_json, only, parallel)
            return PoolCall(agent_id, msgs, None, {**sampling, "grammar": g}, "tools", prefix, names)

        if picked == "required":
            return forced()
        if picked in names:
            return forced(picked)
        if picked == "auto":
            return PoolCall(agent_id, msgs, None, sampling, "auto", "", names, forced=forced)
        return PoolCall(agent_id, msgs, None, sampling)  # "none": described, not called
    if choice not in (None, "auto", "none"):
        raise ConfigError(f"tool_choice {choice!r} needs tools")
    if fmt is not None:
        schema = _response_schema(fmt)
        msgs = with_system_block(msgs, json_prompt(schema))
        prefix, g = _json_grammar(None if schema is None else json.dumps(schema, sort_keys=True))
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


def read_reply(call: PoolCall, text: str) -> Reply:
    """What the generated `text` of `call` means.

    A forced call that does not parse (cut off by `max_tokens` or a stop string) comes
    back as its raw text in `content`, with no tool calls.
    """
    full = call.prefix + text
    if call.mode in ("text", "json"):
        return Reply(content=full)
    parsed = parse_envelope(full)
    if call.mode == "auto":
        if parsed is None:
            return Reply(content=full)
        bad = not parsed or any(not c.ok or c.name not in call.tool_names for c in parsed)
        if bad and call.forced is not None:
            return Reply(retry=True)
    if parsed is None or not parsed or any(not c.ok for c in parsed):
        return Reply(content=full)
    return Reply(tool_calls=_openai_calls(parsed))


class StreamHolder:
    """Which streamed text may be sent now.

    Text replies stream as they come (a JSON reply starts with its forced prefix). A
    forced call is held to the end, where it goes out as `tool_calls`. In `auto` mode the
    start of a reply is held while it could still be a call (`opens_tool_call`).
    """

    def __init__(self, call: PoolCall) -> None:
        self.held = ""
        self.decided: str | None = {"text": "text", "json": "text", "tools": "tool"}.get(call.mode)
        self.opening = call.prefix if call.mode == "json" else ""

    def push(self, piece: str) -> str:
        """Text to send for the generated `piece` (possibly `""`)."""
        if self.opening:
            piece, self.opening = self.opening + piece, ""
        if self.decided == "text":
            return piece
        self.held += piece
        if self.decided is None:
            opens = opens_tool_call(self.held)
            if opens:
                self.decided = "tool"
            elif opens is False:
                self.decided = "text"
                out, self.held = self.held, ""
                return out
        return ""

    def rest(self, reply: Reply) -> str:
        """Held text still to send once the reply is known."""
        out = self.opening
        self.opening = ""
        if reply.tool_calls or reply.retry:
            return out
        if self.decided == "tool" and reply.content is not None:
            return out + reply.content  # a call that did not parse: its text is the content
        return out + self.held

