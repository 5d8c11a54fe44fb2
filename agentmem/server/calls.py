"""Call requests → `CallPlan`s, and the protocol's replies → OpenAI replies.

The tool-call protocol itself is `agentmem.calls`, the same for every front-end: tools
shown whatever `tool_choice` is (the agent's prompt prefix and its KV stay stable), a
forced choice decoded under the format's grammar, `auto` in one decode under the lazy call
grammar (free text until a call opens; `--decode-strategy free_then_forced`: free, then one
forced retry of a broken call), `none` shown and not called, a native call written back into the KV as the
template renders it, `response_format` under a JSON grammar (`agentmem.calls.planning`).
This module only reads a front-end's converted request (`call_request.ChatCallRequest`,
`CompletionCallRequest`) into it (`chat_call`, `completion_call`, with the server's checks
naming the field) and writes its reading in OpenAI's shape (`Reply`, `read_reply`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from agentmem.calls import CallPlan, StreamGate, plan_chat
from agentmem.calls import Reply as CoreReply
from agentmem.calls import read_reply as read_core_reply
from agentmem.errors import ConfigError
from agentmem.server.call_request import CallRequest, ChatCallRequest, CompletionCallRequest, OutputFormat
from agentmem.server.settings import ServerSettings
from agentmem.tools import ParsedCall, ToolFormat, clean_schema, get_tool_format, new_call_id
from agentmem.tools.limits import check_schema

__all__ = ["PoolCall", "Reply", "StreamHolder", "chat_call", "completion_call", "normalize_tool_choice", "read_reply"]

PoolCall = CallPlan
"""One call, ready for the pool, and how to read its reply (`agentmem.calls.CallPlan`)."""

StreamHolder = StreamGate
"""Which streamed text may be sent now (`agentmem.calls.StreamGate`)."""


@dataclass
class Reply:
    """A reply in OpenAI's shape: text content and/or tool calls, or a retry.

    Attributes:
        content: the text (`None` for a call without text).
        tool_calls: `{"id", "type": "function", "function": {"name", "arguments"}}` each.
        retry: an `auto` reply that looked like a call but did not parse; redo it forced.
        written_back: for calls in a native format, the reply as the template writes it
            back into the next prompt (`agentmem.calls.Reply.written_back`).
    """

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    retry: bool = False
    written_back: str | None = None

    @property
    def is_call(self) -> bool:
        """Whether the reply is tool calls."""
        return bool(self.tool_calls)

    @classmethod
    def of(cls, reply: CoreReply) -> Reply:
        """The OpenAI view of the protocol's `reply` (a call that did not parse is its text)."""
        if not reply.is_call:
            return cls(content=reply.content, retry=reply.retry)
        return cls(content=reply.content, tool_calls=_openai_calls(reply.calls), written_back=reply.written_back)


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


def _response_schema(fmt: OutputFormat) -> dict[str, Any] | None:
    if fmt.kind == "json_object":
        return None
    if not isinstance(fmt.schema, Mapping):
        raise ConfigError(f"{fmt.field} must be a JSON schema object")
    schema = dict(fmt.schema)
    check_schema(schema, field=fmt.field)  # before anything walks it
    return schema


def _sampling(req: CallRequest, settings: ServerSettings) -> dict[str, Any]:
    if req.n != 1:
        raise ConfigError(f"n must be 1 (one choice per call), got {req.n}")
    if req.logprobs:
        raise ConfigError("logprobs are not supported")
    s = req.sampling
    max_tokens = settings.default_max_tokens if s.max_tokens is None else s.max_tokens
    if max_tokens > settings.max_tokens_limit:
        raise ConfigError(f"max_tokens must be <= {settings.max_tokens_limit} on this server, got {max_tokens}")
    out: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0 if s.temperature is None else s.temperature}
    if s.stop:
        if any(not stop for stop in s.stop):
            raise ConfigError("stop strings must be non-empty")
        out["stop"] = list(s.stop)
    for name in ("top_p", "top_k", "min_p", "repeat_penalty", "seed"):
        value = getattr(s, name)
        if value is not None:
            out[name] = value
    return out


def _tool_specs(req: ChatCallRequest) -> list[dict[str, Any]]:
    """The request's tools as `{"name", "description", "parameters"}` (schemas checked and cleaned).

    Raises:
        ConfigError: a bad schema (naming the front-end's field), or two tools of one name.
    """
    specs = [
        {"name": t.name, "description": t.description,
         "parameters": clean_schema(dict(t.parameters) if t.parameters else {"type": "object", "properties": {}},
                                    field=t.field)}
        for t in req.tools
    ]
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"tools: function names must be unique, got {names}")
    return specs


def chat_call(agent_id: str, req: ChatCallRequest, settings: ServerSettings, fmt: ToolFormat | None = None) -> PoolCall:
    """The pool call of a chat request (tools, `tool_choice`, the JSON reply applied; `agentmem.calls.plan_chat`).

    Args:
        agent_id: the agent.
        req: the request, as its front-end converted it.
        settings: the server settings (token limits).
        fmt: the model's tool-call syntax (`MemoryPool.tool_format`; default: the envelope).

    Raises:
        ConfigError: an unsupported combination or value (names the field).
    """
    sampling = _sampling(req, settings)
    specs = _tool_specs(req)
    rf = req.output
    choice = normalize_tool_choice(req.tool_choice, [s["name"] for s in specs]) if specs else "auto"
    if not specs and req.tool_choice not in (None, "auto", "none"):
        raise ConfigError(f"tool_choice {req.tool_choice!r} needs tools")
    if specs and rf is not None and choice != "none":
        raise ConfigError("tools and response_format cannot be used together (unless tool_choice is 'none')")
    schema = _response_schema(rf) if rf is not None else None
    return plan_chat(agent_id, [dict(m) for m in req.messages], sampling,
                     fmt if fmt is not None else get_tool_format("envelope"), tools=specs, choice=choice,
                     parallel=req.parallel_tool_calls, json_reply=rf is not None, schema=schema, sort_keys=True)


def completion_call(agent_id: str, req: CompletionCallRequest, settings: ServerSettings) -> PoolCall:
    """The pool call of a raw completion request.

    Raises:
        ConfigError: a list of several prompts, `echo`, or a bad sampling value.
    """
    prompt = req.prompt
    if not isinstance(prompt, str):
        if len(prompt) != 1:
            raise ConfigError(f"prompt must be one string (one agent per call), got a list of {len(prompt)}")
        prompt = prompt[0]
    if req.echo:
        raise ConfigError("echo is not supported")
    if not prompt:
        raise ConfigError("prompt must be a non-empty string")
    return PoolCall(agent_id, None, prompt, _sampling(req, settings))


def _openai_calls(calls: Sequence[ParsedCall]) -> list[dict[str, Any]]:
    return [
        {"id": new_call_id(), "type": "function",
         "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        for c in calls
    ]


def read_reply(call: PoolCall, text: str) -> Reply:
    """What the generated `text` of `call` means, in OpenAI's shape (`agentmem.calls.read_reply`).

    A forced call that does not parse (cut off by `max_tokens` or a stop string) comes
    back as its raw text in `content`, with no tool calls.
    """
    return Reply.of(read_core_reply(call, text))
