"""AgentMemChatCompletionClient: an AutoGen model client whose agents keep their KV.

One `agentmem.MemoryPool` holds the model and one llama.cpp context; each
client speaks for one agent of it (`agent_id`), so when a team switches from
the product manager to the engineer, the engineer's history is restored from its
kept KV instead of being prefilled again.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, AsyncGenerator, Iterable, Literal, Mapping, Optional, Sequence, Union

from autogen_core import EVENT_LOGGER_NAME, CancellationToken, Component, MessageHandlerContext
from autogen_core.logging import LLMCallEvent, LLMStreamEndEvent, LLMStreamStartEvent
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    LLMMessage,
    ModelFamily,
    ModelInfo,
    RequestUsage,
    validate_model_info,
)
from autogen_core.tools import Tool, ToolSchema
from pydantic import BaseModel
from typing_extensions import Self

from agentmem import ChatResult, ConfigError, MemoryPool, PoolConfig
from agentmem.models import ModelLease
from agentmem.models.seats import aseat, hold_pools, model_for, seat
from agentmem.tools import release

from ._config import AgentMemChatCompletionClientConfig
from ._execute import execute
from ._memory import pin_facts
from ._hints import hold_after_call, learn_runtime_id, runtime_agent_id, selection_done, selection_started
from ._messages import candidate_names, to_agentmem_messages, tool_schemas
from ._plan import _Plan, check_args, plan_call, with_tools

__all__ = ["AgentMemChatCompletionClient", "AgentMemChatCompletionClientConfig", "clients_for"]

event_logger = logging.getLogger(EVENT_LOGGER_NAME)

FALLBACK_AGENT_ID = "autogen"
"""The KV slot of a client without `agent_id` used outside an AutoGen runtime."""


class AgentMemChatCompletionClient(ChatCompletionClient, Component[AgentMemChatCompletionClientConfig]):
    """AutoGen `ChatCompletionClient` over an agentmem `agentmem.MemoryPool`.

    Every AgentChat agent gets its own client (its own `agent_id`) over one shared
    pool: the pool keeps each agent's KV state — live in a llama.cpp sequence or
    parked in RAM — so a team's turn switch restores the next agent's context in
    milliseconds instead of prefilling its whole history again.

    Setup:
    ```bash
    pip install 'agentmem-kv[autogen,model]'
    ```

    Instantiate (one pool, one client per agent; the selector of a
    `SelectorGroupChat` gets its own id so it never disturbs a worker's KV):
    ```python
    from agentmem import MemoryPool
    from agentmem_autogen import clients_for

    pool = MemoryPool(n_ctx=8192, resident_agents=4)
    clients = clients_for(pool, ["pm", "engineer", "selector"], max_tokens=128)
    pm = AssistantAgent("pm", model_client=clients["pm"], system_message="...")
    ```

    Invoke:
    ```python
    result = await clients["pm"].create([UserMessage(content="Name a colour.", source="user")])
    result.content, result.usage, result.cached
    # ('Blue', RequestUsage(prompt_tokens=16, completion_tokens=2), False)
    ```

    Stream (text pieces, then the `autogen_core.models.CreateResult`):
    ```python
    pieces = [item async for item in client.create_stream(messages)]
    text, result = "".join(pieces[:-1]), pieces[-1]   # result.usage, result.cached
    ```

    Tools: a model whose chat template knows tools (Qwen2.5, Llama 3.1+, Mistral) gets
    them through its template and calls them in its own syntax
    (`agentmem.tools.formats`, e.g. `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`);
    otherwise they are described in the system prompt (`agentmem.tools.tools_prompt`)
    and a call is the JSON `{"tool_calls": [{"name": ..., "arguments": {...}}]}`. Either
    way a call is the same text the next prompt renders it back as, so the agent's KV
    stays a prefix. With
    `tool_choice="required"` or a specific `Tool` the reply is constrained to a
    valid call by a grammar; with `"auto"` the model answers freely and a
    malformed call attempt is redone under the grammar; `"none"` returns text.
    The tools block stays in the agent's prompt on calls that pass no tools (such
    as AssistantAgent's reflection after a tool call), so those calls reuse the KV too.

    JSON: `json_output=True` constrains the reply to a JSON object,
    `json_output=SomeModel` to the pydantic model's schema.

    Several models: `pool=` a `MemoryPool` of several models runs each call on its agent's model
    (`model=` binds a new agent to one, else the pool's default), held loaded — never
    unloaded by the budget — until the reply is done or the stream is closed:
    ```python
    team = MemoryPool(models={"planner": "gemma-3-270m", "coder": "qwen2.5-coder-0.5b-instruct"})
    planner = AgentMemChatCompletionClient(team, agent_id="planner", model="planner")
    coder = AgentMemChatCompletionClient(team, agent_id="coder", model="coder")
    ```

    Args:
        pool: the shared pool, or a `MemoryPool` of several models. `None`: the open pool of `pool_config` in this
            process, loaded once if none is open (the clients that loaded it close it).
        agent_id: the agent whose KV this client uses; `None` = the calling AutoGen agent.
        model: with a `MemoryPool` of several models, the model a new agent is bound to (`None`: the pool's
            default); a bound agent keeps its own, and naming another raises `ModelMismatchError`.
        pool_config: configuration of the pool to use when `pool` is `None`
            (a `agentmem.PoolConfig` or a dict of its fields).
        max_tokens: default generation limit per call.
        temperature: default temperature (`0` = greedy).
        create_args: default sampling options (see `SAMPLING_ARGS`).
        parallel_tool_calls: allow several tool calls in one reply.
        force_tools: make `tool_choice="auto"` behave as `"required"` (see the config).
        speaker_selection: answer a `SelectorGroupChat`'s selection prompt with one of its
            candidate names (grammar-constrained; see the config).
        model_info: overrides `DEFAULT_MODEL_INFO`.

    Attributes:
        last_result: the `agentmem.ChatResult` of the latest pool call
            (timings, `kv` = reused/restored/prefilled, cached tokens).
        on_result: optional callable `(agent_id, ChatResult) -> None` run after
            every pool call (metrics, logging); not part of the config.
    """

    component_type = "model"
    component_config_schema = AgentMemChatCompletionClientConfig
    component_provider_override = "agentmem_autogen.AgentMemChatCompletionClient"
    is_agentmem_client = True  # how `_hints` recognises this class without importing it

    DEFAULT_MODEL_INFO: ModelInfo = ModelInfo(
        vision=False,
        function_calling=True,
        json_output=True,
        structured_output=True,
        family=ModelFamily.UNKNOWN,
        multiple_system_messages=True,
    )

    def __init__(
        self,
        pool: MemoryPool | None = None,
        *,
        agent_id: str | None = None,
        model: str | None = None,
        pool_config: PoolConfig | Mapping[str, Any] | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        create_args: Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = False,
        force_tools: bool = False,
        speaker_selection: bool = False,
        model_info: ModelInfo | None = None,
    ) -> None:
        if agent_id is not None and (not isinstance(agent_id, str) or not agent_id):
            raise ValueError(f"agent_id must be a non-empty string or None, got {agent_id!r}")
        args = dict(create_args or {})
        check_args(args, "create_args")
        self._defaults: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, **args}
        self._create_args = args
        self._max_tokens = max_tokens
        self._temperature = temperature
        self._parallel = bool(parallel_tool_calls)
        self._force_tools = bool(force_tools)
        self._speaker_selection = bool(speaker_selection)
        if model_info is not None:
            validate_model_info(model_info)
        self._model_info: ModelInfo = model_info or dict(self.DEFAULT_MODEL_INFO)  # type: ignore[assignment]
        self._model_info_overridden = model_info is not None
        # last: a failed check leaks no pool
        self._pool, self._owns_pool = hold_pools(pool, pool_config, _open_pool, model=model)
        self._model = model
        self._agent_id = agent_id
        self._agent_tools: dict[str, list[dict[str, Any]]] = {}  # agent id -> tools last shown to it
        self._closed = False
        self._last_usage = RequestUsage(prompt_tokens=0, completion_tokens=0)
        self._total_usage = RequestUsage(prompt_tokens=0, completion_tokens=0)
        self.last_result: ChatResult | None = None
        self.on_result: Any = None

    # ------------------------------------------------------------------ properties
    @property
    def pool(self) -> MemoryPool:
        """The `agentmem.MemoryPool` this object works on (the shared one, or the one given)."""
        return self._pool

    @property
    def model(self) -> str | None:
        """The model a new agent of this client is bound to (`None`: the default)."""
        return self._model

    @property
    def agent_id(self) -> str | None:
        """The fixed agent id, or `None` (the calling AutoGen agent's id is used)."""
        return self._agent_id

    @property
    def model_info(self) -> ModelInfo:
        return self._model_info

    @property
    def capabilities(self) -> ModelInfo:  # type: ignore[override]  # deprecated in AutoGen
        return self._model_info

    # ------------------------------------------------------------------ component
    def _to_config(self) -> AgentMemChatCompletionClientConfig:
        if len(self._pool.names) > 1:
            raise ConfigError("pool: a client over a pool of several models cannot be dumped as a component "
                              "(the pool is the application's; build the client in code)")
        return AgentMemChatCompletionClientConfig(
            agent_id=self._agent_id,
            pool=self._pool.config.to_dict(),
            max_tokens=self._max_tokens,
            temperature=self._temperature,
            create_args=dict(self._create_args),
            parallel_tool_calls=self._parallel,
            force_tools=self._force_tools,
            speaker_selection=self._speaker_selection,
            model_info=self._model_info if self._model_info_overridden else None,
        )

    @classmethod
    def _from_config(cls, config: AgentMemChatCompletionClientConfig) -> Self:
        return cls(
            agent_id=config.agent_id,
            pool_config=PoolConfig.from_dict(config.pool) if config.pool else PoolConfig(),
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            create_args=config.create_args,
            parallel_tool_calls=config.parallel_tool_calls,
            force_tools=config.force_tools,
            speaker_selection=config.speaker_selection,
            model_info=config.model_info,
        )

    # ------------------------------------------------------------------ usage & tokens
    def actual_usage(self) -> RequestUsage:
        """Tokens of the latest `create`/`create_stream` call."""
        return RequestUsage(self._last_usage.prompt_tokens, self._last_usage.completion_tokens)

    def total_usage(self) -> RequestUsage:
        """Tokens of every call of this client so far."""
        return RequestUsage(self._total_usage.prompt_tokens, self._total_usage.completion_tokens)

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        """Prompt tokens `messages` render to through the model's chat template (tools block included)."""
        return self._count(messages, tools)[0]

    def remaining_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        """Tokens left in the agent's capacity after `messages`."""
        used, capacity = self._count(messages, tools)
        return max(0, capacity - used)

    def _count(self, messages: Sequence[LLMMessage], tools: Sequence[Tool | ToolSchema]) -> tuple[int, int]:
        """`(prompt tokens, agent capacity)` on the agent's model (a `MemoryPool` of several models's is loaded for it; nothing is bound)."""
        agent = self._resolve_agent_id()
        with seat(self._pool, None, model=model_for(self._pool, agent, self._model)) as lease:
            pool = lease.pool
            conv, kw = with_tools(
                to_agentmem_messages(messages), tool_schemas(tools) or self._agent_tools.get(agent, []), pool.tool_format
            )
            return pool.count_tokens(conv, **kw), pool.capacity

    async def close(self) -> None:
        """Stop using the pool (closes it when this was the last client of a pool it loaded)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_pool:
            release(self._pool)

    # ------------------------------------------------------------------ generation
    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: Optional[bool | type[BaseModel]] = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: Optional[CancellationToken] = None,
    ) -> CreateResult:
        """One reply: text, JSON, or tool calls (`content` is then a list of `FunctionCall`).

        Raises:
            ValueError: bad messages, tools, `tool_choice`, `json_output` or create args.
            asyncio.CancelledError: `cancellation_token` was cancelled (generation stops).
            agentmem.ContextOverflowError: the prompt does not fit the agent's capacity.
            agentmem.ModelMismatchError: on a `MemoryPool` of several models, the agent is bound to another model than `model`.
        """
        sampling = self._sampling(extra_create_args)
        agent = self._resolve_agent_id()
        result: CreateResult | None = None
        with await self._seat(agent) as lease:
            plan = self._plan(lease.pool, agent, sampling, messages, tools, tool_choice, json_output)
            async for item in self._execute(lease.pool, plan, cancellation_token, stream=False):
                if isinstance(item, CreateResult):
                    result = item
        assert result is not None
        event_logger.info(
            LLMCallEvent(
                messages=plan.messages,
                response=result.model_dump(),
                prompt_tokens=result.usage.prompt_tokens,
                completion_tokens=result.usage.completion_tokens,
            )
        )
        return result

    async def create_stream(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: Optional[bool | type[BaseModel]] = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: Optional[CancellationToken] = None,
    ) -> AsyncGenerator[Union[str, CreateResult], None]:
        """Like `create`, yielding text pieces as they are generated and the `CreateResult` last.

        A reply that is a tool call yields no text pieces (its calls are in the result).
        On a `MemoryPool` of several models the model stays held until the stream ends or is closed.
        """
        sampling = self._sampling(extra_create_args)
        agent = self._resolve_agent_id()
        result: CreateResult | None = None
        with await self._seat(agent) as lease:
            plan = self._plan(lease.pool, agent, sampling, messages, tools, tool_choice, json_output)
            event_logger.info(LLMStreamStartEvent(messages=plan.messages))
            # closed before the seat is released (a stream left early stops its generation first)
            async with contextlib.aclosing(self._execute(lease.pool, plan, cancellation_token, stream=True)) as items:
                async for item in items:
                    if isinstance(item, CreateResult):
                        result = item
                    yield item
        assert result is not None
        event_logger.info(
            LLMStreamEndEvent(
                response=result.model_dump(),
                prompt_tokens=result.usage.prompt_tokens,
                completion_tokens=result.usage.completion_tokens,
            )
        )

    # ------------------------------------------------------------------ internals
    def _resolve_agent_id(self) -> str:
        if self._agent_id is not None:
            return self._agent_id
        try:
            aid = MessageHandlerContext.agent_id()
        except RuntimeError:
            return FALLBACK_AGENT_ID
        return runtime_agent_id(aid)

    async def _seat(self, agent: str) -> ModelLease:
        """The seat of one call (`agentmem.models.aseat`): this pool as it is, or a lease on the agent's model."""
        return await aseat(self._pool, agent, model=self._model)

    def _sampling(self, extra_create_args: Mapping[str, Any]) -> dict[str, Any]:
        """This client's sampling defaults under the call's `extra_create_args` (checked before any model is held)."""
        if self._closed:
            raise RuntimeError("this AgentMemChatCompletionClient is closed")
        extra = dict(extra_create_args)
        check_args(extra, "extra_create_args")
        return {**self._defaults, **extra}

    def _plan(
        self,
        pool: MemoryPool,
        agent: str,
        sampling: dict[str, Any],
        messages: Sequence[LLMMessage],
        tools: Sequence[Tool | ToolSchema],
        tool_choice: Any,
        json_output: Any,
    ) -> _Plan:
        """The `_Plan` of one call on `pool`, its agent's model's pool (`plan_call` with this client's options and the agent's tools)."""
        learn_runtime_id(self._pool, agent)
        conv = to_agentmem_messages(messages)
        schemas = tool_schemas(tools)
        if schemas:
            self._agent_tools[agent] = schemas
        return plan_call(
            agent,
            conv,
            sampling,
            schemas,
            # keep the prompt (and so the KV prefix) stable on calls without tools
            schemas or self._agent_tools.get(agent, []),
            pool.tool_format,
            tool_choice,
            json_output,
            parallel=self._parallel,
            force_tools=self._force_tools,
            speaker_selection=self._speaker_selection,
        )

    def _record(self, plan: _Plan, result: ChatResult) -> None:
        self.last_result = result
        if self.on_result is not None:
            self.on_result(plan.agent_id, result)

    async def _execute(
        self, pool: MemoryPool, plan: _Plan, token: CancellationToken | None, *, stream: bool
    ) -> AsyncGenerator[str | CreateResult, None]:
        """`execute` on `pool` (the seat's), counting the call's tokens before its result is yielded.

        Hints for the pool (see `agentmem_autogen._hints`): a selection call expects its
        candidates, then its answer (told to this client's pool, a `MemoryPool` of several models too); a
        reply that is a tool call holds the agent on its model's pool.
        """
        candidates = candidate_names(plan.messages) if self._speaker_selection else []
        if candidates:
            await selection_started(self._pool, plan.agent_id, candidates)
        async for item in execute(pool, plan, token, self._record, stream=stream):
            if isinstance(item, CreateResult):
                if item.finish_reason == "function_calls":
                    await hold_after_call(pool, plan.agent_id)
                elif candidates and isinstance(item.content, str):
                    await selection_done(self._pool, plan.agent_id, item.content, candidates)
                await pin_facts(pool, plan.agent_id, plan.messages)
                usage = item.usage
                self._last_usage = usage
                self._total_usage = RequestUsage(
                    self._total_usage.prompt_tokens + usage.prompt_tokens,
                    self._total_usage.completion_tokens + usage.completion_tokens,
                )
            yield item


def _open_pool(config: PoolConfig) -> MemoryPool:
    """How the shared-pool registry opens a pool this client asks for."""
    return MemoryPool(config=config)


def clients_for(
    pool: MemoryPool, agent_ids: Iterable[str], **options: Any
) -> dict[str, AgentMemChatCompletionClient]:
    """One client per agent over one pool: `{agent_id: client}`.

    Args:
        pool: the shared pool (a `MemoryPool` of several models too: pass `model=` to bind them all to one model).
        agent_ids: distinct ids (give a `SelectorGroupChat`'s selector one of its own).
        **options: keyword arguments for every client (`max_tokens`, `temperature`,
            `create_args`, ...).

    >>> clients = clients_for(pool, ["pm", "engineer", "selector"], max_tokens=96)  # doctest: +SKIP
    """
    ids = list(agent_ids)
    dup = sorted({a for a in ids if ids.count(a) > 1})
    if dup:
        raise ValueError(f"duplicate agent id(s) {dup}")
    return {a: AgentMemChatCompletionClient(pool, agent_id=a, **options) for a in ids}
