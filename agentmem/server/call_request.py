"""What one call asks of the engine, in agentmem's terms: no API's wire shape.

Every front-end validates its own body once (its pydantic model, strict, a 400 naming its
field; then its own translation checks, naming its field too) and converts it into one of
these frozen values, which `Engine.find_line`, `Engine.prepare_chat`, `Engine.count_tokens`
and `calls.chat_call` read:

* OpenAI chat completions: `schemas.ChatCompletionRequest.to_call()`;
* OpenAI legacy completions: `schemas.CompletionRequest.to_call()` (`CompletionCallRequest`);
* OpenAI Responses: `responses_schemas.to_chat`;
* Anthropic Messages: `anthropic_schemas.to_chat_request`;
* Ollama: `ollama_schemas.to_chat_request` / `to_generate_request`.

Nothing here is validated again: a value is built from a body its front-end has checked.
What depends on the server (the default and the largest `max_tokens`, a tool schema's
limits, a tool choice that names no tool) is checked by `calls.chat_call`, naming the field
the front-end recorded here (`FunctionTool.field`, `OutputFormat.field`).

>>> ask = ChatCallRequest(messages=({"role": "user", "content": "hi"},), sampling=Sampling(max_tokens=8))
>>> ask.stream, ask.tools, ask.sampling.stop
(False, (), ())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

__all__ = ["CallRequest", "ChatCallRequest", "CompletionCallRequest", "FunctionTool", "OutputFormat", "Sampling"]


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How to sample a reply (`None`: the server's default; llama.cpp's sampler names).

    Attributes:
        max_tokens: tokens to generate at most (`None`: `ServerSettings.default_max_tokens`).
        temperature: `None` is greedy (0).
        top_p: nucleus sampling.
        top_k: the k most likely tokens only.
        min_p: tokens at least this fraction as likely as the most likely one.
        repeat_penalty: llama.cpp's repetition penalty.
        seed: the sampler's seed.
        stop: strings that end the reply (each must be non-empty; checked by `calls`).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class FunctionTool:
    """One function the model may call.

    Attributes:
        name: the function's name (non-empty; unique among the call's tools, checked by `calls`).
        description: what it does, shown to the model.
        parameters: its JSON schema (`None`: no arguments).
        field: where `parameters` sits in the front-end's body, for errors
            (`tools[0].function.parameters`, Anthropic's `tools[0].input_schema`).
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None
    field: str = "tools"


@dataclass(frozen=True, kw_only=True)
class OutputFormat:
    """A reply that must be JSON, decoded under a grammar.

    Attributes:
        kind: `json_object` (any object) or `json_schema` (`schema`, required then).
        schema: the reply's JSON schema.
        field: where `schema` sits in the front-end's body, for errors.
    """

    kind: Literal["json_object", "json_schema"]
    schema: Mapping[str, Any] | None = None
    field: str = "response_format.json_schema.schema"


@dataclass(frozen=True, kw_only=True)
class CallRequest:
    """What every call carries: who runs it, on which model, how it samples.

    Attributes:
        sampling: the sampler's settings.
        stream: send the reply as it is generated.
        model: the model the request names (`None`: the agent's or the default).
        user: OpenAI's `user` (an agent id unless `--end-users` makes it the end user).
        agent_id: the `agent_id` extension field.
        n: choices asked for (only 1 is served; `calls` refuses others, naming `n`).
        logprobs: whether log-probabilities were asked for (refused by `calls`).
    """

    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    model: str | None = None
    user: str | None = None
    agent_id: str | None = None
    n: int = 1
    logprobs: bool = False


@dataclass(frozen=True, kw_only=True)
class ChatCallRequest(CallRequest):
    """One chat call: a conversation through the model's chat template, maybe with tools or a JSON reply.

    Attributes:
        messages: the conversation as the pool takes it (`{"role", "content", "tool_calls", "tool_call_id",
            "name"}`; roles `system`, `user`, `assistant`, `tool`).
        tools: the functions offered.
        tool_choice: `auto` (or `None`), `none`, `required`, or `{"type": "function", "function": {"name": ...}}`.
        parallel_tool_calls: allow several calls in one forced reply.
        output: a JSON reply (`None`: text).
    """

    messages: Sequence[Mapping[str, Any]]
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: str | Mapping[str, Any] | None = None
    parallel_tool_calls: bool = False
    output: OutputFormat | None = None


@dataclass(frozen=True, kw_only=True)
class CompletionCallRequest(CallRequest):
    """One raw completion: `prompt` continued in the agent's context, no chat template.

    Attributes:
        prompt: the text, or OpenAI's list form (one string only is served; checked by `calls`).
        echo: OpenAI's `echo` (refused by `calls`).
    """

    prompt: str | Sequence[str]
    echo: bool = False
