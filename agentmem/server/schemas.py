"""Request and response bodies in the OpenAI shapes, plus the agents API's small bodies.

Unknown request fields are ignored (as llama-server does), so newer clients that send
`metadata`, `store` and the like keep working; fields agentmem cannot honour (`n > 1`,
`logprobs`) are refused with a 400 by the route, naming the field. Extensions beyond
OpenAI: `agent_id`, `top_k`, `min_p`, `repeat_penalty` (llama-server's names). A validated
chat or completion body converts once into the engine's call request (`to_call`:
`call_request.ChatCallRequest`, `CompletionCallRequest`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from agentmem import validation as check
from agentmem.errors import MessageError
from agentmem.memory.tiers import WARM, TierName
from agentmem.server.call_request import (
    ChatCallRequest,
    CompletionCallRequest,
    FunctionTool,
    OutputFormat,
    Sampling,
)

__all__ = [
    "AgentInfo",
    "BudgetRequest",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "FunctionDef",
    "HandoffRequest",
    "JsonSchemaFormat",
    "ParkRequest",
    "PinRequest",
    "PriorityRequest",
    "RecallRequest",
    "ResponseFormat",
    "StreamOptions",
    "Tool",
    "Usage",
]


def _text(value: Any) -> Any:
    """Every string in a field's value (dict keys too) must be text UTF-8 can hold: JSON's
    `"\\ud800"` decodes to a lone surrogate, refused here (400 naming the field) instead of
    failing later where the text is tokenized or stored."""
    try:
        check.json_text(value, field="value")
    except MessageError as exc:
        raise PydanticCustomError("unicode_text", "{detail}", {"detail": str(exc).removeprefix("value").lstrip(". ")}) from None
    return value


Text = Annotated[str, AfterValidator(_text)]
"""A string field that must be valid Unicode text."""
Json = AfterValidator(_text)
"""The same check on a structured field (`Annotated[dict[str, Any], Json]`): every string in it."""


class _Body(BaseModel):
    """Strict: a field takes its own JSON type only (`true` is not an int, `"yes"` not a bool,
    `"1"` not a number; an int is a float), so a mistyped request is a 400 naming the field."""

    model_config = ConfigDict(extra="ignore", strict=True)


class ChatMessage(_Body):
    """One message of `messages` (OpenAI's shape; `developer` is read as `system`)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str | list[dict[str, Any]] | None, Json] = None
    """Text, or a list of `{"type": "text", "text": ...}` parts."""
    name: Text | None = None
    tool_calls: Annotated[list[dict[str, Any]] | None, Json] = None
    """`{"id", "type": "function", "function": {"name", "arguments"}}` each."""
    tool_call_id: Text | None = None

    def to_pool(self) -> dict[str, Any]:
        """The message as `MemoryPool.chat` takes it."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDef(_Body):
    """A callable function: name, description and JSON-schema parameters."""

    name: Text = Field(min_length=1, max_length=128)
    description: Text | None = None
    parameters: Annotated[dict[str, Any] | None, Json] = None
    strict: bool | None = None
    """Accepted; forced calls always follow the schema exactly (grammar)."""


class Tool(_Body):
    """One entry of `tools`."""

    type: Literal["function"] = "function"
    function: FunctionDef


class JsonSchemaFormat(_Body):
    """`response_format.json_schema`."""

    name: Text | None = None
    description: Text | None = None
    schema_: Annotated[dict[str, Any] | None, Json] = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """`response_format`: plain text, any JSON object, or JSON of a schema (grammar-constrained)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def to_output(self) -> OutputFormat | None:
        """The reply's format (`None`: text)."""
        if self.type == "text":
            return None
        schema = self.json_schema.schema_ if self.json_schema is not None else None
        return OutputFormat(kind=self.type, schema=schema if self.type == "json_schema" else None)


class StreamOptions(_Body):
    """`stream_options`."""

    include_usage: bool = False


class _Sampling(_Body):
    model: Text | None = None
    """The model to run: with one model ignored (any name gets it, echoed back as `model_name`); with
    several, a model's name (unknown: 404 `model_not_found`), default the agent's model or the first."""
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    seed: int | None = None
    stop: Annotated[str | list[str] | None, Json] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: Text | None = None
    """The agent id (unless the `X-Agent-Id` header names one)."""
    agent_id: Text | None = None
    """Extension: the agent id, when neither the header nor `user` names one."""
    frequency_penalty: float | None = None
    """Accepted and ignored (not a llama.cpp sampler agentmem exposes)."""
    presence_penalty: float | None = None
    """Accepted and ignored."""
    logprobs: bool | None = None

    def _call_fields(self, max_tokens: int | None) -> dict[str, Any]:
        """The fields every call request takes, read from this body."""
        stop = () if not self.stop else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        sampling = Sampling(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                            min_p=self.min_p, repeat_penalty=self.repeat_penalty, seed=self.seed, stop=stop)
        return {"sampling": sampling, "stream": self.stream, "model": self.model, "user": self.user,
                "agent_id": self.agent_id, "n": self.n, "logprobs": bool(self.logprobs)}


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    """Wins over `max_tokens` when both are set."""
    tools: list[Tool] | None = None
    tool_choice: Annotated[str | dict[str, Any] | None, Json] = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None

    def to_call(self) -> ChatCallRequest:
        """The engine's chat request of this body (`max_completion_tokens` wins over `max_tokens`)."""
        max_tokens = self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens
        return ChatCallRequest(
            messages=tuple(m.to_pool() for m in self.messages),
            tools=tuple(FunctionTool(name=t.function.name, description=t.function.description or "",
                                     parameters=t.function.parameters, field=f"tools[{i}].function.parameters")
                        for i, t in enumerate(self.tools or ())),
            tool_choice=self.tool_choice, parallel_tool_calls=bool(self.parallel_tool_calls),
            output=self.response_format.to_output() if self.response_format is not None else None,
            **self._call_fields(max_tokens))


class CompletionRequest(_Sampling):
    """`POST /v1/completions` (a raw prompt, no chat template)."""

    prompt: Annotated[str | list[str], Json]
    echo: bool = False

    def to_call(self) -> CompletionCallRequest:
        """The engine's completion request of this body."""
        prompt = self.prompt if isinstance(self.prompt, str) else tuple(self.prompt)
        return CompletionCallRequest(prompt=prompt, echo=self.echo, **self._call_fields(self.max_tokens))


class Usage(BaseModel):
    """`usage` of a response; `prompt_tokens_details.cached_tokens` is the KV agentmem reused."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]


# ---------------------------------------------------------------------------- agents API
class ParkRequest(_Body):
    """`POST /agents/{id}?action=park`."""

    tier: TierName = WARM


class PinRequest(_Body):
    """`POST /agents/{id}?action=pin`."""

    message_index: int = Field(ge=0)
    pinned: bool = True


class BudgetRequest(_Body):
    """`POST /agents/{id}?action=budget`: live tokens the agent may keep (`0` = the pool default)."""

    tokens: int = Field(ge=0)
    eviction: Text | None = None


class PriorityRequest(_Body):
    """`POST /agents/{id}?action=priority`: `foreground`, `normal`, `background` or an int weight."""

    priority: int | Text


class HoldRequest(_Body):
    """`POST /agents/{id}?action=hold`: keep it in its live sequence for `ttl_s` seconds (null: from its reload cost)."""

    ttl_s: float | None = None


class ExpectRequest(_Body):
    """`POST /agents?action=expect`: these agents run next, in order; an item may be a list of alternatives."""

    order: Annotated[list[str | list[str]], Json]
    soon: bool = True


class HandoffRequest(_Body):
    """`POST /agents/{id}?action=handoff`: start agent `to` as this agent's first `upto` tokens."""

    to: Text
    upto: int | None = Field(default=None, ge=1)


class RecallRequest(_Body):
    """`POST /agents/{id}?action=recall`: the agent's evicted spans that best match `query`."""

    query: Text
    k: int = Field(default=5, ge=0, le=100)


class AgentInfo(BaseModel):
    """One agent as `/agents` lists it (no KV bytes, only their count)."""

    id: str
    tier: str
    tokens: int
    live_tokens: int
    bytes: int
    codec: str | None
    priority: int
    budget: int
    calls: int
    restores: int
    parks: int
    cached_tokens: int
    prefill_tokens: int
    evictions: int
