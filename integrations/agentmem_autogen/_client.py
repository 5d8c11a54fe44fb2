"""AgentMemChatCompletionClient: an AutoGen model client whose agents keep their KV.

One `agentmem.MemoryPool` holds the model and one llama.cpp context; each
client speaks for one agent of it (`agent_id`), so when a team switches from
the product manager to the engineer, the engineer's history is restored from its
kept KV instead of being prefilled again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Dict, Iterable, Literal, Mapping, Optional, Sequence, Union

from autogen_core import EVENT_LOGGER_NAME, CancellationToken, Component, FunctionCall, MessageHandlerContext
from autogen_core.logging import LLMCallEvent, LLMStreamEndEvent, LLMStreamStartEvent
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    FinishReasons,
    LLMMessage,
    ModelFamily,
    ModelInfo,
    RequestUsage,
    validate_model_info,
)
from autogen_core.tools import Tool, ToolSchema
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Self

from agentmem import ChatResult, MemoryPool, PoolConfig
from agentmem.tools import (
    JSON_OBJECT_GRAMMAR,
    ToolFormat,
    acquire,
    get_tool_format,
    choice_grammar,
    opens_tool_call,
    register,
    release,
    schema_grammar,
    text_before_json,
    tools_prompt,
    with_system_block,
)

from ._messages import candidate_names, parse_tool_calls, to_agentmem_messages, tool_schemas

__all__ = ["AgentMemChatCompletionClient", "AgentMemChatCompletionClientConfig", "clients_for"]

logger = logging.getLogger(__name__)
event_logger = logging.getLogger(EVENT_LOGGER_NAME)

SAMPLING_ARGS: frozenset[str] = frozenset(
    {
        "max_tokens", "temperature", "top_k", "top_p", "min_p",
        "repeat_penalty", "repeat_last_n", "seed", "stop", "grammar",
    }
)
"""Keys accepted in `create_args` and in `extra_create_args` of a call."""

FALLBACK_AGENT_ID = "autogen"
"""The KV slot of a client without `agent_id` used outside an AutoGen runtime."""


class AgentMemChatCompletionClientConfig(BaseModel):
    """Serializable configuration of `AgentMemChatCompletionClient` (`dump_component`)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    agent_id: Optional[str] = None
    """Whose KV this client uses in the pool. `None`: the AutoGen agent making the call
    (its runtime `AgentId`), so one client can serve a whole team."""
    pool: Dict[str, Any] = Field(default_factory=dict)
    """The pool's `agentmem.PoolConfig` as a dict; an open pool with the same
    configuration in this process is reused instead of loading the model again."""
    max_tokens: int = 256
    """Tokens to generate at most per call (`extra_create_args` may override)."""
    temperature: float = 0.0
    """Sampling temperature; `0` is greedy (deterministic)."""
    create_args: Dict[str, Any] = Field(default_factory=dict)
    """Default sampling options: `top_k`, `top_p`, `min_p`, `repeat_penalty`,
    `repeat_last_n`, `seed`, `stop`, `grammar` (GBNF)."""
    parallel_tool_calls: bool = False
    """Let one reply call several tools (default: one call per reply, which keeps a
    small model from looping)."""
    force_tools: bool = False
    """Treat `tool_choice="auto"` as `"required"` when a call offers tools: every such
    reply is a grammar-valid tool call. For small models that rarely decide to call a
    tool on their own (AgentChat's AssistantAgent has no `tool_choice` argument)."""
    speaker_selection: bool = False
    """For the client of a `SelectorGroupChat`: constrain a reply to one of the candidate
    names its selection prompt lists (`select the next role from ['pm', 'engineer'] ...`,
    the last such list in the prompt), so a small model always names a valid speaker."""
    model_info: Optional[ModelInfo] = None
    """Overrides `AgentMemChatCompletionClient.DEFAULT_MODEL_INFO`."""


@dataclass(slots=True)
class _Plan:
    """What one `create` call will do (built and validated before any generation)."""

    agent_id: str
    messages: list[dict[str, Any]]
    sampling: dict[str, Any]
    grammar: Optional[str]  # constraint of the first generation
    tool_names: list[str] = field(default_factory=list)  # tools the reply may call
    prefix: Optional[str] = None  # start of the reply, given in the prompt (forced tool call)
    retry: Optional[tuple[str, str]] = None  # (prefix, grammar) redoing a malformed call in auto mode
    stream_text: bool = True  # pieces are text for the caller (not a tool call)
    fmt: ToolFormat = field(default_factory=lambda: get_tool_format("envelope"))  # the model's call syntax

    @property
    def forced(self) -> bool:
        return self.prefix is not None


class AgentMemChatCompletionClient(ChatCompletionClient, Component[AgentMemChatCompletionClientConfig]):
    """AutoGen `ChatCompletionClient` over an agentmem `agentmem.MemoryPool`.

    Every AgentChat agent gets its own client (its own `agent_id`) over one shared
    pool: the pool keeps each agent's KV state — live in a llama.cpp sequence or
    parked in RAM — so a team's turn switch restores the next agent's context in
    milliseconds instead of prefilling its whole history again.

    Setup:
    ```bash
    pip install 'agentmem[autogen,model]'
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

    Args:
        pool: the shared pool. `None`: the open pool of `pool_config` in this
            process, loaded once if none is open (the clients that loaded it close it).
        agent_id: the agent whose KV this client uses; `None` = the calling AutoGen agent.
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
        if pool is not None and pool_config is not None:
            raise ValueError("pass either pool= (an open MemoryPool) or pool_config=, not both")
        if pool is not None and not isinstance(pool, MemoryPool):
            raise TypeError(f"pool must be an agentmem.MemoryPool, got {type(pool).__name__}")
        args = dict(create_args or {})
        _check_args(args, "create_args")
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
        if pool is not None:
            self._pool, self._owns_pool = pool, False
            register(pool)
        else:
            if isinstance(pool_config, Mapping):
                cfg = PoolConfig.from_dict(pool_config)
            else:
                cfg = pool_config or PoolConfig()
            self._pool, self._owns_pool = acquire(cfg, _open_pool)
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
        """The shared `agentmem.MemoryPool`."""
        return self._pool

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
        agent = self._resolve_agent_id()
        conv, kw = self._with_tools(to_agentmem_messages(messages), tool_schemas(tools) or self._agent_tools.get(agent, []))
        return self._pool.count_tokens(conv, **kw)

    def remaining_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        """Tokens left in the agent's capacity after `messages`."""
        return max(0, self._pool.capacity - self.count_tokens(messages, tools=tools))

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
        """
        plan = self._plan(messages, tools, tool_choice, json_output, extra_create_args)
        result: CreateResult | None = None
        async for item in self._execute(plan, cancellation_token, stream=False):
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
        """
        plan = self._plan(messages, tools, tool_choice, json_output, extra_create_args)
        event_logger.info(LLMStreamStartEvent(messages=plan.messages))
        result: CreateResult | None = None
        async for item in self._execute(plan, cancellation_token, stream=True):
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
    def _with_tools(
        self, conv: list[dict[str, Any]], schemas: Sequence[Mapping[str, Any]]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The conversation and pool keywords that show `schemas` to the model.

        A native tool format gets them through the chat template (`tools=`); otherwise
        agentmem's tools block ends the system message.
        """
        if not schemas:
            return conv, {}
        if self._pool.tool_format.native:
            shown = [{"name": s["name"], "description": s.get("description") or "", "parameters": s.get("parameters") or {}} for s in schemas]
            return conv, {"tools": shown}
        return with_system_block(conv, tools_prompt(schemas)), {}

    def _resolve_agent_id(self) -> str:
        if self._agent_id is not None:
            return self._agent_id
        try:
            aid = MessageHandlerContext.agent_id()
        except RuntimeError:
            return FALLBACK_AGENT_ID
        return aid.type if aid.key == "default" else f"{aid.type}/{aid.key}"

    def _plan(
        self,
        messages: Sequence[LLMMessage],
        tools: Sequence[Tool | ToolSchema],
        tool_choice: Any,
        json_output: Any,
        extra_create_args: Mapping[str, Any],
    ) -> _Plan:
        if self._closed:
            raise RuntimeError("this AgentMemChatCompletionClient is closed")
        extra = dict(extra_create_args)
        _check_args(extra, "extra_create_args")
        sampling = {**self._defaults, **extra}
        user_grammar = sampling.pop("grammar", None)
        agent = self._resolve_agent_id()
        conv = to_agentmem_messages(messages)
        schemas = tool_schemas(tools)
        names = [s["name"] for s in schemas]
        if schemas:
            self._agent_tools[agent] = schemas
        # keep the prompt (and so the KV prefix) stable on calls without tools
        conv, tools_kw = self._with_tools(conv, schemas or self._agent_tools.get(agent, []))
        sampling.update(tools_kw)
        fmt = self._pool.tool_format
        parallel = self._parallel and fmt.parallel

        # which tools the reply may / must call
        if isinstance(tool_choice, Tool):
            if tool_choice.name not in names:
                raise ValueError(f"tool_choice names tool {tool_choice.name!r}, which is not among tools {names}")
            forced = [s for s in schemas if s["name"] == tool_choice.name]
        elif tool_choice == "required":
            if not schemas:
                raise ValueError("tool_choice='required' but no tools were given")
            forced = schemas
        elif tool_choice == "auto":
            forced = schemas if self._force_tools else []
        elif tool_choice == "none":
            forced = []
        else:
            raise ValueError(f"tool_choice must be a Tool, 'auto', 'required' or 'none', got {tool_choice!r}")
        allowed = [] if tool_choice == "none" else ([s["name"] for s in forced] if forced else names)

        # the output constraint
        if json_output is None or json_output is False:
            json_grammar = None
        elif json_output is True:
            json_grammar = JSON_OBJECT_GRAMMAR
        elif isinstance(json_output, type) and issubclass(json_output, BaseModel):
            json_grammar = schema_grammar(json_output.model_json_schema())
        else:
            raise ValueError(f"json_output must be None, a bool or a pydantic BaseModel subclass, got {json_output!r}")
        if user_grammar is not None and (json_grammar is not None or forced):
            raise ValueError("a 'grammar' create arg cannot be combined with json_output or a forced tool_choice")

        if forced:
            prefix, grammar = fmt.continuation(forced, parallel=parallel)
            return _Plan(agent, conv, sampling, grammar, allowed, prefix=prefix, stream_text=False, fmt=fmt)
        if allowed and json_grammar is not None:
            # A JSON reply or a tool call: one grammar admits both; the parse decides.
            if json_output is not True:
                json_grammar = fmt.call_or_document(schemas, json_output.model_json_schema(), parallel=parallel)
            elif fmt.native:  # the envelope is a JSON object; a native call is not
                json_grammar = fmt.call_or_document(schemas, {"type": "object"}, parallel=parallel)
            return _Plan(agent, conv, sampling, json_grammar, allowed, stream_text=False, fmt=fmt)
        if allowed:
            retry = fmt.continuation(schemas, parallel=parallel)
            return _Plan(agent, conv, sampling, user_grammar, allowed, retry=retry, fmt=fmt)
        if json_grammar is None and user_grammar is None and self._speaker_selection:
            names = candidate_names(conv)
            if names:
                user_grammar = choice_grammar(names)
        return _Plan(agent, conv, sampling, json_grammar or user_grammar, [])

    async def _pool_stream(
        self, plan: _Plan, grammar: str | None, prefix: str | None, token: CancellationToken | None
    ) -> AsyncGenerator[str | ChatResult, None]:
        """One pool generation as an async stream; cancelling `token` stops it at once.

        `prefix` is given to the model as the start of its reply (continued, not closed).
        """
        kw = dict(plan.sampling)
        if grammar is not None:
            kw["grammar"] = grammar
        msgs = plan.messages if prefix is None else [*plan.messages, {"role": "assistant", "content": prefix}]
        agen = self._pool.achat_stream(plan.agent_id, msgs, **kw)
        loop = asyncio.get_running_loop()
        current: list[asyncio.Future[Any]] = []
        cancelled = False

        def on_cancel() -> None:
            nonlocal cancelled
            cancelled = True
            for f in current:
                loop.call_soon_threadsafe(f.cancel)

        if token is not None:
            token.add_callback(on_cancel)
        try:
            while True:
                if cancelled:
                    raise asyncio.CancelledError("cancelled by the CancellationToken")
                fut = asyncio.ensure_future(agen.__anext__())
                current[:] = [fut]
                try:
                    item = await fut
                except StopAsyncIteration:
                    return
                finally:
                    current.clear()
                yield item
        finally:
            await agen.aclose()

    async def _generate(
        self, plan: _Plan, grammar: str | None, prefix: str | None, token: CancellationToken | None
    ) -> ChatResult:
        """Run one pool generation to its end."""
        result: ChatResult | None = None
        async for item in self._pool_stream(plan, grammar, prefix, token):
            if isinstance(item, ChatResult):
                result = item
        assert result is not None, "the pool stream ended without a ChatResult"
        self._record(plan, result)
        return result

    def _record(self, plan: _Plan, result: ChatResult) -> None:
        self.last_result = result
        if self.on_result is not None:
            self.on_result(plan.agent_id, result)

    async def _execute(
        self, plan: _Plan, token: CancellationToken | None, *, stream: bool
    ) -> AsyncGenerator[str | CreateResult, None]:
        results: list[ChatResult] = []
        if stream and plan.stream_text:
            # Stream text as it comes, except a reply that opens like a tool call
            # (held back until it is known whether it is one).
            held: list[str] = []
            holding: bool | None = None  # undecided until the first non-blank piece
            r1: ChatResult | None = None
            async for item in self._pool_stream(plan, plan.grammar, None, token):
                if isinstance(item, ChatResult):
                    r1 = item
                    continue
                if holding is None:
                    held.append(item)
                    lead = "".join(held).lstrip()
                    if not lead:
                        continue
                    opens = _opens(plan, lead)
                    if opens is None:
                        continue  # could still be a call: keep holding
                    holding = bool(plan.tool_names) and opens
                    if not holding:
                        for piece in held:
                            yield piece
                        held.clear()
                elif holding:
                    held.append(item)
                else:
                    yield item
            assert r1 is not None, "the pool stream ended without a ChatResult"
            self._record(plan, r1)
            results.append(r1)
            text = r1.text
            unsent = "".join(held)
        else:
            r1 = await self._generate(plan, plan.grammar, plan.prefix, token)
            results.append(r1)
            text = (plan.prefix or "") + r1.text
            unsent = text if stream else ""

        content: str | list[FunctionCall] = text
        thought: str | None = None
        finish: FinishReasons = "length" if r1.finish_reason == "length" else "stop"
        if plan.tool_names:
            written = text  # the reply as the model wrote it (the forced prefix included)
            parsed = parse_tool_calls(text, plan.tool_names, plan.fmt)
            if parsed is None and plan.retry is not None and plan.fmt.looks_like_call(text, plan.tool_names):
                logger.debug("agent %r: malformed tool call %r; redoing it under the grammar", plan.agent_id, text[:80])
                prefix, grammar = plan.retry
                r2 = await self._generate(plan, grammar, prefix, token)
                results.append(r2)
                written = prefix + r2.text
                parsed = parse_tool_calls(written, plan.tool_names, plan.fmt)
                if parsed is not None:
                    j = text.find(plan.fmt.opener) if plan.fmt.native else -1
                    parsed = (parsed[0], text[:j].strip() if j != -1 else text_before_json(text))
            if parsed is not None:
                content, before = parsed
                thought = before or None
                finish = "function_calls"
                unsent = ""
                back = plan.fmt.written_back(before, [(c.name, c.arguments) for c in content]) if plan.fmt.native else None
                if back is not None and back != written.strip():
                    # The model wrote the call in another shape than its template writes it back:
                    # put the template's form in the KV now (prefill only), so the next call keeps it.
                    quiet = dataclasses.replace(plan, sampling={**plan.sampling, "max_tokens": 0})
                    results.append(await self._generate(quiet, None, back, token))
            elif plan.forced:
                logger.warning(
                    "agent %r: forced tool call did not complete (finish=%s, %d tokens): %r",
                    plan.agent_id, r1.finish_reason, r1.usage.completion_tokens, text[:120],
                )
        if stream and unsent:
            yield unsent

        usage = RequestUsage(
            prompt_tokens=sum(r.usage.prompt_tokens for r in results),
            completion_tokens=sum(r.usage.completion_tokens for r in results),
        )
        self._last_usage = usage
        self._total_usage = RequestUsage(
            self._total_usage.prompt_tokens + usage.prompt_tokens,
            self._total_usage.completion_tokens + usage.completion_tokens,
        )
        yield CreateResult(
            finish_reason=finish,
            content=content,
            usage=usage,
            cached=r1.usage.cached_tokens > 0,
            thought=thought,
        )


def _opens(plan: _Plan, lead: str) -> bool | None:
    """Whether a streamed reply opening with `lead` may be a call (None: not known yet)."""
    if not plan.tool_names:
        return False
    if plan.fmt.native:
        native = plan.fmt.opens_call(lead)
        if native is not False:
            return native
    return opens_tool_call(lead, lenient=True)


def _open_pool(config: PoolConfig) -> MemoryPool:
    """How the shared-pool registry opens a pool this client asks for."""
    return MemoryPool(config=config)


def _check_args(args: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(args) - SAMPLING_ARGS)
    if unknown:
        raise ValueError(f"unknown {where} key(s) {unknown}; valid: {', '.join(sorted(SAMPLING_ARGS))}")


def clients_for(
    pool: MemoryPool, agent_ids: Iterable[str], **options: Any
) -> dict[str, AgentMemChatCompletionClient]:
    """One client per agent over one pool: `{agent_id: client}`.

    Args:
        pool: the shared pool.
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
