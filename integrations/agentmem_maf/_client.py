"""AgentMemChatClient: a Microsoft Agent Framework chat client whose agents keep their KV.

One `agentmem.MemoryPool` holds the model and one llama.cpp context; each agent of a MAF
app (an `Agent`, or an agent in a workflow) has its own pool agent, so when a workflow
hands over from the researcher to the writer and back, each one's history is restored
from its kept KV instead of being prefilled again.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, ClassVar, Mapping, Sequence

from agent_framework import (
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionInvocationLayer,
    Message,
    ResponseStream,
)
from agent_framework.observability import ChatTelemetryLayer

import agentmem.validation as check
from agentmem import AgentMemError, ChatResult, MemoryPool, PoolConfig
from agentmem.calls import CallOutcome, CallPlan, CallRunner

from agentmem.models.seats import aseat, hold_pools, model_name
from agentmem.tools import release

from ._identity import resolve_agent_id, session_of
from ._memory import pin_facts
from ._messages import call_contents, response_schema, to_agentmem_messages, tool_choice, tool_schemas, usage_details
from ._plan import SAMPLING, plan_options

__all__ = ["AgentMemChatClient"]

logger = logging.getLogger(__name__)

_AGENT_KEY = "_agentmem_agent_id"  # the resolved agent id, carried from get_response to _inner_get_response
_PLANNED = {"tools", "tool_choice", "response_format", "instructions", "allow_multiple_tool_calls"}
_IGNORED = {"model", "store", "conversation_id", "metadata", "user", "logit_bias", "frequency_penalty",
            "presence_penalty"}
"""MAF options with no meaning for a local pool (no service, no OpenAI penalties)."""


class AgentMemChatClient(FunctionInvocationLayer, ChatMiddlewareLayer, ChatTelemetryLayer, BaseChatClient):
    """Microsoft Agent Framework chat client over an agentmem `agentmem.MemoryPool`.

    Every MAF agent gets its own pool agent over one shared pool: the pool keeps each
    agent's KV state — live in a llama.cpp sequence or parked in RAM — so a workflow's
    hand-over restores the next agent's context instead of prefilling its history again.

    Setup:
    ```bash
    pip install 'agentmem-kv[maf,instruct]'
    ```

    Instantiate (one pool, one client per agent, or one client and the agent id rule):
    ```python
    from agent_framework import Agent
    from agentmem import MemoryPool
    from agentmem_maf import AgentMemChatClient

    pool = MemoryPool(model="qwen2.5-coder-0.5b-instruct", n_ctx=8192)
    researcher = Agent(client=AgentMemChatClient(pool, agent_id="researcher"), name="researcher",
                       instructions="...", tools=[lookup])
    ```

    Invoke and stream (MAF's own API; `usage_details` counts the KV reused):
    ```python
    response = await researcher.run("What does order 17 weigh?")
    response.text, response.usage_details["cache_read_input_token_count"]
    pieces = [update.text async for update in researcher.run("And order 18?", stream=True)]
    ```

    Tools: the agent's function tools are shown to the model through its chat template
    (Qwen2.5, Llama 3.1+, Mistral) or agentmem's tools block; a reply that calls one is a
    `function_call` content, which MAF's function-invocation loop runs, sending the result
    back for the next call. `tool_choice="required"` (or a named function) constrains the
    reply to a valid call by a grammar; with `"auto"` the reply decodes once under a lazy
    grammar: free text until the model opens a call, a valid call from there. The call is kept in the KV in the form the template writes it back,
    so the call after the tool result reuses the whole turn. A small model may call a tool
    again and again: `function_invocation_configuration={"max_function_calls": 1}` makes
    MAF send the call after the result with `tool_choice="none"` (the tools stay shown, so
    the prompt prefix and its KV do not change), and the model answers. All of this is
    agentmem's one call protocol (`agentmem.calls`), the same for the server, LangChain
    and AutoGen; this client only translates MAF's types.

    Structured output: `options={"response_format": SomeModel}` constrains the reply to
    the model's JSON schema (`response.value` is the parsed model); a JSON schema mapping
    or `{"type": "json_object"}` work too.

    Agent id (whose KV a call uses): `agent_id`; else the name of the `Agent` built on
    this client (the first one); else the id of the session the caller passed; else
    `"maf"` (see `agentmem_maf._identity`). Give each agent its own client.

    Several models: `pool=` a `MemoryPool` of several models runs each call on its agent's model
    (`model=` binds a new agent to one, else the pool's default), held loaded until the
    response is done or its stream is closed; responses carry the model's name:
    ```python
    team = MemoryPool(models={"planner": "gemma-3-270m", "coder": "qwen2.5-coder-0.5b-instruct"})
    coder = Agent(client=AgentMemChatClient(team, model="coder"), name="coder", instructions="...")
    ```

    Args:
        pool: the shared pool, or a `MemoryPool` of several models. `None`: the open pool of `pool_config` in
            this process, loaded once if none is open (the clients that loaded it close it).
        agent_id: the pool agent of every call of this client; `None` = the rule above.
        model: with a `MemoryPool` of several models, the model a new agent is bound to (`None`: the pool's
            default); a bound agent keeps its own, and naming another raises `ModelMismatchError`.
        pool_config: configuration of the pool when `pool` is `None`
            (a `agentmem.PoolConfig` or a dict of its fields).
        max_tokens: default generation limit per call.
        temperature: default temperature (`0` = greedy).
        parallel_tool_calls: allow several tool calls in one reply (default: one, which
            keeps a small model from looping); `allow_multiple_tool_calls` overrides it.
        **kwargs: MAF's client options (`middleware`, `function_invocation_configuration`,
            `additional_properties`, ...).

    Attributes:
        last_result: the `agentmem.ChatResult` of the latest pool generation
            (timings, `kv` = reused/restored/prefilled, cached tokens).
        on_result: optional callable `(agent_id, ChatResult) -> None` run after every pool
            generation (metrics, logging).

    Raises:
        agentmem.ConfigError: a malformed `agent_id`.
    """

    OTEL_PROVIDER_NAME: ClassVar[str] = "agentmem"

    def __init__(
        self,
        pool: MemoryPool | None = None,
        *,
        agent_id: str | None = None,
        model: str | None = None,
        pool_config: PoolConfig | Mapping[str, Any] | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> None:
        if agent_id is not None:
            check.agent_id(agent_id)
        super().__init__(**kwargs)
        self._pool, self._owns_pool = hold_pools(pool, pool_config, lambda c: MemoryPool(config=c), model=model)
        self._model = model
        self._agent_id = agent_id
        self._agent_name: str | None = None  # the name of the first Agent built on this client
        self._defaults: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
        self._parallel = bool(parallel_tool_calls)
        self._agent_tools: dict[str, list[dict[str, Any]]] = {}  # agent id -> tools last shown to it
        self._closed = False
        self.last_result: ChatResult | None = None
        self.on_result: Callable[[str, ChatResult], None] | None = None

    @property
    def pool(self) -> MemoryPool:
        """The `agentmem.MemoryPool` this object works on (the shared one, or the one given)."""
        return self._pool

    @property
    def agent_id(self) -> str | None:
        """The pool agent of this client: its `agent_id`, else its agent's name; `None`: per session."""
        return self._agent_id or self._agent_name

    def _update_agent_name_and_description(self, name: str | None, description: str | None = None) -> None:
        """MAF's hook, called by `Agent(client=self, name=...)`: the first agent's name names the KV."""
        if self._agent_name is None and isinstance(name, str) and name:
            try:
                self._agent_name = check.agent_id(name, field="Agent.name")
            except AgentMemError as exc:
                logger.warning("agent name %r cannot name a pool agent (%s); the session decides", name, exc)

    @property
    def model_name(self) -> str:
        """The model file's name (the `model` of every response); on a `MemoryPool` of several models, the name of
        this client's agent's model (each response carries the model it ran on)."""
        return model_name(self._pool, self.agent_id, self._model)

    def service_url(self) -> str:
        """Where the model runs: in this process."""
        return "agentmem://local"

    async def close(self) -> None:
        """Stop using the pool (closes it when this was the last client of a pool it loaded)."""
        if not self._closed:
            self._closed = True
            if self._owns_pool:
                release(self._pool)

    async def __aenter__(self) -> AgentMemChatClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # ------------------------------------------------------------------ MAF's entry points
    def get_response(self, messages: Sequence[Message], **kwargs: Any) -> Any:  # type: ignore[override]
        """MAF's `get_response` (all layers: middleware, function invocation, telemetry).

        The agent id is resolved here, where the run's session is still in `client_kwargs`.
        """
        client_kwargs = dict(kwargs.pop("client_kwargs", None) or {})
        client_kwargs[_AGENT_KEY] = resolve_agent_id(self.agent_id, session_of(client_kwargs))
        return super().get_response(messages, client_kwargs=client_kwargs, **kwargs)

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        """One model call: a `ChatResponse`, or a stream of `ChatResponseUpdate`s."""
        agent = str(kwargs.get(_AGENT_KEY) or resolve_agent_id(self.agent_id, session_of(kwargs)))
        if stream:
            return self._build_response_stream(
                self._stream(agent, messages, options), response_format=options.get("response_format")
            )
        return self._respond(agent, messages, options)

    # ------------------------------------------------------------------ the call
    async def _plan(self, pool: MemoryPool, agent: str, messages: Sequence[Message],
                    opts: Mapping[str, Any]) -> CallPlan:
        """The `CallPlan` of one call on `pool`: this client's defaults, the call's options, the agent's tools."""
        sampling = {**self._defaults, **{k: v for k, v in opts.items() if k in SAMPLING and v is not None}}
        unknown = sorted(set(opts) - SAMPLING - _PLANNED - _IGNORED)
        if unknown:
            logger.debug("agent %r: options %s have no meaning for agentmem; ignored", agent, unknown)
        conv = to_agentmem_messages(messages, opts.get("instructions"), speaker=self._agent_name or self._agent_id)
        schemas = tool_schemas(opts.get("tools"))
        if schemas:
            self._agent_tools[agent] = schemas
        mode, forced = tool_choice(opts.get("tool_choice"), [s["name"] for s in schemas])
        parallel = opts.get("allow_multiple_tool_calls")
        return plan_options(
            agent, conv, sampling, pool.tool_format,
            schemas=schemas, shown=schemas or self._agent_tools.get(agent, []),
            mode=mode, forced_name=forced, schema=response_schema(opts.get("response_format")),
            parallel=self._parallel if parallel is None else bool(parallel),
        )

    async def _run(self, agent: str, messages: Sequence[Message],
                   options: Mapping[str, Any]) -> AsyncIterator[str | tuple[CallOutcome, str]]:
        """Text pieces a caller may show, then `(CallOutcome, model name)` (the core protocol, `agentmem.calls`).

        The call runs on its agent's seat (`agentmem.models.aseat`): this pool as it is, or a lease
        on the agent's model in a `MemoryPool` of several models, released once the outcome is out or the caller left.
        """
        if self._closed:
            raise RuntimeError("this AgentMemChatClient is closed")
        opts = await self._validate_options(options)
        with await aseat(self._pool, agent, model=self._model) as lease:
            plan = await self._plan(lease.pool, agent, messages, opts)
            runner = CallRunner(lease.pool, on_result=self._record)  # the engine's turns are shared (`turns_for`)
            async with contextlib.aclosing(runner.arun(plan)) as events:  # closed early: generation stops
                async for kind, value in events:
                    if kind == "text":
                        yield value  # type: ignore[misc]
                        continue
                    assert isinstance(value, CallOutcome)
                    await pin_facts(lease.pool, agent, value.plan.messages or [])
                    yield value, lease.name or self.model_name

    def _record(self, plan: CallPlan, result: ChatResult) -> None:
        self.last_result = result
        if self.on_result is not None:
            self.on_result(plan.agent_id, result)

    async def _respond(self, agent: str, messages: Sequence[Message], options: Mapping[str, Any]) -> ChatResponse:
        done: tuple[CallOutcome, str] | None = None
        async for item in self._run(agent, messages, options):
            if isinstance(item, tuple):
                done = item
        assert done is not None
        outcome, model = done
        return ChatResponse(
            messages=[Message("assistant", _contents(outcome))],
            model=model,
            finish_reason=outcome.finish_reason,  # type: ignore[arg-type]
            usage_details=usage_details(outcome.all_results),
            response_format=options.get("response_format"),
        )

    async def _stream(self, agent: str, messages: Sequence[Message],
                      options: Mapping[str, Any]) -> AsyncIterator[ChatResponseUpdate]:
        async with contextlib.aclosing(self._run(agent, messages, options)) as items:  # closed with this stream
            async for item in items:
                if isinstance(item, str):
                    yield ChatResponseUpdate(role="assistant", contents=[Content.from_text(item)])
                    continue
                outcome, model = item
                contents = _contents(outcome) if outcome.reply.is_call else (
                    [Content.from_text(outcome.rest)] if outcome.rest else [])
                yield ChatResponseUpdate(
                    role="assistant",
                    contents=[*contents, Content.from_usage(usage_details(outcome.all_results))],
                    model=model,
                    finish_reason=outcome.finish_reason,  # type: ignore[arg-type]
                )

def _contents(outcome: CallOutcome) -> list[Content]:
    """The reply as MAF contents: its calls (and the text before them), or its text."""
    reply = outcome.reply
    if reply.is_call:
        return call_contents([(c.name or "", c.arguments) for c in reply.calls], reply.content or "")
    return [Content.from_text(reply.content if reply.content is not None else reply.text)]
