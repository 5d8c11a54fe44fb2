"""Request and response bodies in the OpenAI shapes, plus the agents API's small bodies.

Unknown request fields are ignored (as llama-server does), so newer clients that send
`metadata`, `store` and the like keep working; fields agentmem cannot honour (`n > 1`,
`logprobs`) are refused with a 400 by the route, naming the field. Extensions beyond
OpenAI: `agent_id`, `top_k`, `min_p`, `repeat_penalty` (llama-server's names).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ChatMessage(_Body):
    """One message of `messages` (OpenAI's shape; `developer` is read as `system`)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    """Text, or a list of `{"type": "text", "text": ...}` parts."""
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """`{"id", "type": "function", "function": {"name", "arguments"}}` each."""
    tool_call_id: str | None = None

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

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    """Accepted; forced calls always follow the schema exactly (grammar)."""


class Tool(_Body):
    """One entry of `tools`."""

    type: Literal["function"] = "function"
    function: FunctionDef


class JsonSchemaFormat(_Body):
    """`response_format.json_schema`."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """`response_format`: plain text, any JSON object, or JSON of a schema (grammar-constrained)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Body):
    """`stream_options`."""

    include_usage: bool = False


class _Sampling(_Body):
    model: str | None = None
    """Ignored: the server has one model (echoed back as `model_name`)."""
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: str | None = None
    """The agent id (unless the `X-Agent-Id` header names one)."""
    agent_id: str | None = None
    """Extension: the agent id, when neither the header nor `user` names one."""
    frequency_penalty: float | None = None
    """Accepted and ignored (not a llama.cpp sampler agentmem exposes)."""
    presence_penalty: float | None = None
    """Accepted and ignored."""
    logprobs: bool | None = None


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    """Wins over `max_tokens` when both are set."""
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_Sampling):
    """`POST /v1/completions` (a raw prompt, no chat template)."""

    prompt: str | list[str]
    echo: bool = False


class Usage(BaseModel):
    """`usage` of a response; `prompt_tokens_details.cached_tokens` is the KV agentmem reused."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]


# ---------------------------------------------------------------------------- agents API
class ParkRequest(_Body):
    """`POST /agents/{id}?action=park`."""

    tier: Literal["warm", "cold"] = "warm"


class PinRequest(_Body):
    """`POST /agents/{id}?action=pin`."""

    message_index: int = Field(ge=0)
    pinned: bool = True


class BudgetRequest(_Body):
    """`POST /agents/{id}?action=budget`: live tokens the agent may keep (`0` = the pool default)."""

    tokens: int = Field(ge=0)
    eviction: str | None = None


class PriorityRequest(_Body):
    """`POST /agents/{id}?action=priority`: `foreground`, `normal`, `background` or an int weight."""

    priority: int | str


class HoldRequest(_Body):
    """`POST /agents/{id}?action=hold`: keep it in its live sequence for `ttl_s` seconds (null: from its reload cost)."""

    ttl_s: float | None = None


class ExpectRequest(_Body):
    """`POST /agents?action=expect`: these agents run next, in order; an item may be a list of alternatives."""

    order: list[str | list[str]]
    soon: bool = True


class HandoffRequest(_Body):
    """`POST /agents/{id}?action=handoff`: start agent `to` as this agent's first `upto` tokens."""

    to: str
    upto: int | None = Field(default=None, ge=1)


class RecallRequest(_Body):
    """`POST /agents/{id}?action=recall`: the agent's evicted spans that best match `query`."""

    query: str
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
