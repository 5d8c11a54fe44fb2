"""ChatAgentMem: a LangChain chat model whose every agent keeps its KV memory."""

from __future__ import annotations

import contextlib
from operator import itemgetter
from typing import Any, AsyncIterator, Callable, Iterator, Literal, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import JsonOutputKeyToolsParser, JsonOutputParser, PydanticOutputParser, PydanticToolsParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

from langchain_core.language_models.model_profile import ModelProfile

from agentmem import MemoryPool, PoolConfig
from agentmem.calls import CallOutcome, CallRunner
from agentmem.models import ModelLease
from agentmem.models.seats import model_for

from ._common import AgentMemFields, timings_dict, usage_dict
from ._messages import to_pool_messages
from ._plan import _CALL_KEYS, _Call, plan_call
from ._profile import profile_for
from ._rewrites import RewriteWatch
from ._reply import as_langchain, rest_of, tool_call_chunks
from ._tools import normalize_tool_choice, normalize_tools

__all__ = ["ChatAgentMem"]

_rewrite_watch = RewriteWatch()  # one per process: every model object on a pool sees the same agents

class ChatAgentMem(AgentMemFields, BaseChatModel):
    """LangChain chat model on an agentmem `agentmem.MemoryPool`.

    Every agent (`agent_id`) keeps its llama.cpp KV state between calls — live,
    or parked in RAM while other agents run — so a multi-agent app that switches
    agents pays a restore (milliseconds) instead of re-reading the agent's whole
    history. Calls send the whole history as usual; only what the agent's KV
    does not hold yet is decoded (`usage_metadata["input_token_details"]["cache_read"]`
    counts the rest).

    Setup:
        ```bash
        pip install 'agentmem-kv[langchain,model]'
        ```

    Instantiate (nothing is loaded until the first call):
        ```python
        from agentmem import MemoryPool
        from agentmem_langchain import ChatAgentMem

        pool = MemoryPool(n_ctx=4096, resident_agents=2)
        planner = ChatAgentMem(pool=pool, agent_id="planner", max_tokens=64)
        writer = ChatAgentMem(pool=pool, agent_id="writer", max_tokens=128)
        # or: ChatAgentMem(agent_id="planner")  -> a shared pool on the default model
        ```

    Invoke:
        ```python
        msg = planner.invoke([("system", "You plan."), ("human", "Plan a picnic.")])
        msg.usage_metadata
        # {'input_tokens': 19, 'output_tokens': 64, 'total_tokens': 83,
        #  'input_token_details': {'cache_read': 0}}
        msg.response_metadata["kv"], msg.response_metadata["timings"]["ttft_s"]
        # ('prefilled', 0.05)
        ```

    Agent per call:
        ```python
        model = ChatAgentMem(pool=pool)
        model.invoke("Hi", agent_id="coder")
        model.with_config(configurable={"agent_id": "reviewer"}).invoke("Hi")
        ```

    Several models (each call runs on its agent's model, held loaded until the reply ends):
        ```python
        from agentmem import MemoryPool

        team = MemoryPool(models={"planner": "gemma-3-270m", "coder": "qwen2.5-coder-0.5b-instruct"})
        planner = ChatAgentMem(pool=team, agent_id="plan", model="planner")
        coder = ChatAgentMem(pool=team, agent_id="code", model="coder")
        planner.invoke("Plan a page.").response_metadata["model_name"]   # 'planner'
        ```

    Stream (usage arrives on the last chunk):
        ```python
        pieces = [chunk.content for chunk in writer.stream("Write a haiku.")]
        # the last chunk carries usage_metadata (input/output tokens, cache_read)
        ```

    Tools (calls are grammar-constrained when forced, so they always parse):
        ```python
        def get_weather(city: str) -> str:
            "Weather of a city."
            ...

        ai = planner.bind_tools([get_weather], tool_choice="any").invoke("Weather in Paris?")
        ai.tool_calls
        # [{'name': 'get_weather', 'args': {'city': 'Paris'}, 'id': 'call_…', 'type': 'tool_call'}]
        ```

    Structured output (`json_schema` by default; also `function_calling` and `json_mode`):
        ```python
        from pydantic import BaseModel

        class Joke(BaseModel):
            setup: str
            punchline: str

        writer.with_structured_output(Joke).invoke("A joke about cats.")
        # Joke(setup='…', punchline='…')
        ```

    Async: `ainvoke`/`astream`/`abatch` run through the pool's async API.
    """

    # ------------------------------------------------------------------ identity
    @property
    def _llm_type(self) -> str:
        return "agentmem-chat"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        if not stop and self.stop:
            params["ls_stop"] = self.stop
        return params

    # invoke / ainvoke / stream / astream take `agent_id` from the run config (AgentMemFields)

    # ------------------------------------------------------------------ profile and token counts
    def _resolve_model_profile(self) -> ModelProfile | None:
        """LangChain's model profile: context size from the pool (or its options), capabilities.

        `max_input_tokens` is the most one agent's prompt may hold: the agent token budget
        (`agent_budget_tokens`) when one is set — beyond it the pool evicts inside the KV —
        else the per-agent capacity (`agent_capacity`, else `n_ctx`). Known without
        loading the model when built from `pool_options`.
        """
        if self.pool is not None:  # the loaded model's capacity, else its configuration's: nothing is loaded
            name = model_for(self.pool, self.agent_id, self.model)
            cfg, lease = self.pool.config_of(name), self.pool.lease_if_loaded(name)
            capacity = cfg.agent_capacity or cfg.n_ctx
            if lease is not None:
                with lease:
                    capacity = lease.pool.capacity
        else:
            cfg = PoolConfig.build(**({"model_path": self.model_path} if self.model_path else {}), **self.pool_options)
            capacity = cfg.agent_capacity or cfg.n_ctx
        return profile_for(cfg, capacity, self.resolved_model_name())

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence[Any] | None = None) -> int:
        """Prompt tokens of `messages` as a call renders them: the model's chat template and,
        with `tools`, the tools as a call shows them (the template's tool prompt or agentmem's
        tools block). Counts every token of the prompt, kept KV or not.

        Args:
            messages: the conversation.
            tools: tools as `bind_tools` takes them.
        """
        specs = [t.as_dict() for t in normalize_tools(tools)] if tools else None
        with self._model_seat() as lease:
            return lease.pool.count_tokens(to_pool_messages(messages), tools=specs)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ tools and structure
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools the model may call.

        Args:
            tools: LangChain tools, functions, pydantic classes or OpenAI tool dicts.
            tool_choice: `"auto"` (default: the model decides), `"none"`,
                `"any"`/`"required"`/`True` (some tool must be called), a tool
                name, or `{"type": "function", "function": {"name": ...}}`.
                Forced calls are decoded under a grammar built from the tools'
                JSON schemas, so they always parse and match the schema.
            parallel_tool_calls: allow several calls in one forced reply (default:
                exactly one — small models repeat calls otherwise).
            strict: accepted for compatibility; forced calls are always schema-exact.
            kwargs: bound as further call arguments.
        """
        del strict  # grammar-constrained calls are always strict
        specs = normalize_tools(tools)
        choice = normalize_tool_choice(tool_choice, [s.name for s in specs])
        bound = {"tools": [s.as_dict() for s in specs], "tool_choice": choice, **kwargs}
        if parallel_tool_calls is not None:
            bound["parallel_tool_calls"] = parallel_tool_calls
        return self.bind(**bound)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """Return replies parsed into `schema` (pydantic class, TypedDict or JSON schema).

        Args:
            schema: the output schema (may be `None` only with `json_mode`).
            method: `"json_schema"` (default; the reply is JSON decoded under a
                grammar built from the schema), `"function_calling"` (a forced
                call of a tool named after the schema) or `"json_mode"` (any JSON
                object; the prompt must describe the keys).
            include_raw: return `{"raw": AIMessage, "parsed": ..., "parsing_error": ...}`.
            strict: accepted for compatibility; `json_schema` and
                `function_calling` outputs always follow the schema exactly.
        """
        del strict
        if kwargs:
            raise ValueError(f"unsupported argument(s) {sorted(kwargs)}")
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        if method == "function_calling":
            if schema is None:
                raise ValueError("with_structured_output(method='function_calling') needs a schema")
            name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools(
                [schema],
                tool_choice=name,
                ls_structured_output_format={"kwargs": {"method": method}, "schema": schema},
            )
            parser: Runnable[Any, Any] = (
                PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
                if is_pydantic
                else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
            )
        elif method in ("json_schema", "json_mode"):
            if schema is None and method == "json_schema":
                raise ValueError("with_structured_output(method='json_schema') needs a schema")
            response_format: dict[str, Any] = (
                {"type": "json_object"}
                if method == "json_mode"
                else {"type": "json_schema", "json_schema": {"schema": convert_to_json_schema(schema)}}
            )
            llm = self.bind(
                response_format=response_format,
                ls_structured_output_format={"kwargs": {"method": method}, "schema": schema},
            )
            parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()  # type: ignore[arg-type]
        else:
            raise ValueError(f"unknown method {method!r}; valid: 'json_schema', 'function_calling', 'json_mode'")
        if not include_raw:
            return llm | parser
        parser_assign = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        parser_none = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parser_assign.with_fallbacks([parser_none], exception_key="parsing_error")

    # ------------------------------------------------------------------ preparing a call
    def _prepare(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any], *,
                 pool: MemoryPool | None = None) -> _Call:
        """The plan of a call on `pool`, its agent's model's pool (default: this object's `MemoryPool`)."""
        kwargs = dict(kwargs)
        self._reject_unknown(kwargs, _CALL_KEYS)
        agent = self._agent_from(kwargs)
        sampling = self._sampling_from(kwargs, stop)
        msgs = to_pool_messages(messages)
        if pool is None:
            pools = self.get_pool()
            pool = pools.engine(model_for(pools, agent, self.model))
        _rewrite_watch.check(pool, agent, messages, msgs)
        return plan_call(agent, msgs, sampling, pool.tool_format, kwargs)

    def _message_fields(self, outcome: CallOutcome, seat: ModelLease) -> dict[str, Any]:
        results = outcome.all_results  # a write-back counts: the agent's KV got it
        first, last = results[0], results[-1]
        meta: dict[str, Any] = {
            "model_name": self._seat_name(seat),
            "model_provider": "agentmem",
            "finish_reason": last.finish_reason,
            "agent_id": outcome.plan.agent_id,
            "kv": first.kv,
            "timings": timings_dict(first),
        }
        if len(results) > 1:
            meta["retried_with_grammar"] = True
        return {"usage_metadata": usage_dict(results), "response_metadata": meta}

    def _message(self, outcome: CallOutcome, seat: ModelLease) -> ChatResult:
        reply = as_langchain(outcome.plan, outcome.reply)
        message = AIMessage(content=reply.content, tool_calls=reply.tool_calls,
                            invalid_tool_calls=reply.invalid_tool_calls, **self._message_fields(outcome, seat))
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _final_chunk(self, outcome: CallOutcome, seat: ModelLease) -> ChatGenerationChunk:
        reply = as_langchain(outcome.plan, outcome.reply)
        msg = AIMessageChunk(
            content=rest_of(outcome, reply),
            tool_call_chunks=tool_call_chunks(reply),  # type: ignore[arg-type]
            chunk_position="last",
            **self._message_fields(outcome, seat),
        )
        return ChatGenerationChunk(message=msg)

    # ------------------------------------------------------------------ LangChain hooks
    # Each hook takes the seat of its agent's model (`agentmem.models.seat`: a `MemoryPool` as it
    # is, or a lease on a `MemoryPool` of several models's model, released when the reply ends or the stream closes),
    # then runs the one protocol (`agentmem.calls`) on its pool: plan, generate, read, retry, write back.
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._seat(self._agent_from(dict(kwargs))) as seat:
            outcome = CallRunner(seat.pool).collect(self._prepare(messages, stop, kwargs, pool=seat.pool))
            return self._message(outcome, seat)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with await self._aseat(self._agent_from(dict(kwargs))) as seat:
            outcome = await CallRunner(seat.pool).acollect(self._prepare(messages, stop, kwargs, pool=seat.pool))
            return self._message(outcome, seat)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        with self._seat(self._agent_from(dict(kwargs))) as seat:
            call = self._prepare(messages, stop, kwargs, pool=seat.pool)
            with contextlib.closing(CallRunner(seat.pool).run(call)) as events:  # closed before the seat ends
                for kind, value in events:
                    if kind == "done":
                        yield self._final_chunk(value, seat)  # type: ignore[arg-type]
                        continue
                    chunk = ChatGenerationChunk(message=AIMessageChunk(content=value))
                    if run_manager:
                        run_manager.on_llm_new_token(value, chunk=chunk)  # type: ignore[arg-type]
                    yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        with await self._aseat(self._agent_from(dict(kwargs))) as seat:
            call = self._prepare(messages, stop, kwargs, pool=seat.pool)
            async with contextlib.aclosing(CallRunner(seat.pool).arun(call)) as events:
                async for kind, value in events:
                    if kind == "done":
                        yield self._final_chunk(value, seat)  # type: ignore[arg-type]
                        continue
                    chunk = ChatGenerationChunk(message=AIMessageChunk(content=value))
                    if run_manager:
                        await run_manager.on_llm_new_token(value, chunk=chunk)  # type: ignore[arg-type]
                    yield chunk
