"""ChatAgentMem: a LangChain chat model whose every agent keeps its KV memory."""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, AsyncIterator, Callable, Iterator, Literal, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, InvalidToolCall, ToolCall
from langchain_core.output_parsers import JsonOutputKeyToolsParser, JsonOutputParser, PydanticOutputParser, PydanticToolsParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

from agentmem import ChatResult as PoolResult
from agentmem.tools import (
    JSON_OBJECT_GRAMMAR,
    ToolFormat,
    get_tool_format,
    json_prompt,
    schema_grammar,
    split_forced_prefix,
    tools_prompt,
    with_system_block,
)

from ._common import AgentMemFields, agent_lock, async_agent_lock, timings_dict, usage_dict
from ._messages import to_pool_messages
from ._tools import ToolSpec, find_tool_calls, normalize_tool_choice, normalize_tools, parse_tool_calls

__all__ = ["ChatAgentMem"]

_CALL_KEYS = {
    "agent_id",
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "seed",
    "grammar",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
}


@functools.lru_cache(maxsize=256)
def _tool_grammar(fmt: ToolFormat, tools_json: str, only: str | None, parallel: bool) -> tuple[str, str]:
    tools = json.loads(tools_json)
    if only is not None:
        tools = [t for t in tools if t["name"] == only]
    return fmt.forced(tools, parallel=parallel)


@functools.lru_cache(maxsize=256)
def _json_grammar(schema_json: str | None) -> tuple[str, str]:
    grammar = JSON_OBJECT_GRAMMAR if schema_json is None else schema_grammar(json.loads(schema_json))
    return split_forced_prefix(grammar)


def _response_schema(response_format: Any) -> dict[str, Any] | None:
    """`response_format` → a JSON schema, or `None` for "any JSON object".

    Accepts `{"type": "json_object"}`, OpenAI's
    `{"type": "json_schema", "json_schema": {"schema": ...}}`, a JSON schema
    dict, a pydantic class or a TypedDict.
    """
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_object":
            return None
        if kind == "json_schema":
            inner = response_format.get("json_schema", response_format)
            schema = inner.get("schema") if isinstance(inner, dict) else None
            if not isinstance(schema, dict):
                raise ValueError("response_format of type 'json_schema' needs a 'schema' dict")
            return schema
    return convert_to_json_schema(response_format)


@dataclass
class _Call:
    """One model call, prepared: what goes to the pool and how to read the reply."""

    agent_id: str
    messages: list[dict[str, Any]]
    sampling: dict[str, Any]
    mode: Literal["text", "json", "tools", "auto"] = "text"
    prefix: str = ""
    tool_names: tuple[str, ...] = ()
    forced: Callable[[], _Call] | None = None  # auto mode: the same call with a call forced
    fmt: ToolFormat = field(default_factory=lambda: get_tool_format("envelope"))  # the model's call syntax

    def pool_messages(self) -> list[dict[str, Any]]:
        if not self.prefix:
            return self.messages
        return [*self.messages, {"role": "assistant", "content": self.prefix}]


@dataclass
class _Reply:
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)
    retry: bool = False
    rewrite: str | None = None  # the call as the template writes it back, when the model wrote it otherwise


def _written_back(call: _Call, full: str, reply: _Reply) -> _Reply:
    """`reply`, marked for a rewrite when its calls are not written the way the template writes them back.

    A model may write a call in another shape than its template's (a bare JSON object,
    other spacing); the next prompt renders the template's form, and the KV of the
    call would be re-prefilled then. `_rewrite_call` puts the template's form in the KV now.
    """
    if not call.fmt.native or not reply.tool_calls or reply.invalid_tool_calls:
        return reply
    back = call.fmt.written_back(reply.content, [(c["name"], c["args"]) for c in reply.tool_calls])
    if back != full.strip():
        reply.rewrite = back
    return reply


def _rewrite_call(call: _Call, reply: _Reply) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """Pool arguments that prefill `reply.rewrite` as the agent's reply (nothing is generated)."""
    assert reply.rewrite is not None
    keep = {k: v for k, v in call.sampling.items() if k == "tools"}
    return call.agent_id, [*call.messages, {"role": "assistant", "content": reply.rewrite}], {**keep, "max_tokens": 0}


def _read(call: _Call, text: str) -> _Reply:
    """Interpret the generated `text` of `call`."""
    full = call.prefix + text
    if call.mode in ("text", "json"):
        return _Reply(content=full)
    parsed = parse_tool_calls(full, call.fmt)
    if call.mode == "auto":
        if parsed is None and call.fmt.native:  # a native call after some text: the text is the content
            found = find_tool_calls(full, call.tool_names, call.fmt)
            if found is not None:
                return _written_back(call, full, _Reply(content=found[1], tool_calls=found[0]))
        if parsed is None:
            return _Reply(content=full)
        calls, invalid = parsed
        bad = invalid or not calls or any(c["name"] not in call.tool_names for c in calls)
        if bad and call.forced is not None:
            return _Reply(retry=True)
        return _written_back(call, full, _Reply(tool_calls=calls, invalid_tool_calls=invalid))
    if parsed is None:  # cannot happen under the grammar, unless cut by a stop string
        return _Reply(invalid_tool_calls=[InvalidToolCall(type="invalid_tool_call", name=None, args=full, id=None, error="no tool-call JSON in the reply")])
    calls, invalid = parsed
    return _Reply(tool_calls=calls, invalid_tool_calls=invalid)


class _Holder:
    """Decides, while streaming, which text may be shown now.

    Text replies stream as they come. A forced tool call is held to the end (it
    arrives as tool-call chunks). In `auto` mode the start of a reply is held
    while it could still be a tool call (in the model's syntax, `call.fmt`).
    """

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.held = ""
        self.decided: str | None = {"text": "text", "json": "text", "tools": "tool"}.get(call.mode)

    def push(self, piece: str) -> str:
        if self.decided == "text":
            return piece
        self.held += piece
        if self.decided is None:
            opens = self.call.fmt.opens_call(self.held)
            if opens:
                self.decided = "tool"
            elif opens is False:
                self.decided = "text"
                out, self.held = self.held, ""
                return out
        return ""

    def rest(self, reply: _Reply) -> str:
        """Held text still to show once the reply is known."""
        if reply.tool_calls or reply.invalid_tool_calls or reply.retry:
            return ""
        return self.held


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
        pip install 'agentmem[langchain,model]'
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
    def _prepare(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> _Call:
        kwargs = dict(kwargs)
        self._reject_unknown(kwargs, _CALL_KEYS)
        agent = self._agent_from(kwargs)
        sampling = self._sampling_from(kwargs, stop)
        msgs = to_pool_messages(messages)
        fmt = self.get_pool().tool_format
        grammar = kwargs.get("grammar")
        tools = kwargs.get("tools") or []
        choice = kwargs.get("tool_choice") or "auto"
        response_format = kwargs.get("response_format")
        if grammar is not None and (tools or response_format is not None):
            raise ValueError("a raw 'grammar' cannot be combined with tools or response_format")
        if tools and response_format is not None and choice != "none":
            raise ValueError("tools and response_format cannot be used together (unless tool_choice='none')")
        if grammar is not None:
            return _Call(agent, msgs, {**sampling, "grammar": grammar})

        if tools:
            specs = [ToolSpec(t["name"], t.get("description", ""), t.get("parameters") or {}) for t in tools]
            names = tuple(s.name for s in specs)
            choice = normalize_tool_choice(choice, names)
            if fmt.native:  # the model's own template shows the tools
                sampling = {**sampling, "tools": [s.as_dict() for s in specs]}
            else:
                msgs = with_system_block(msgs, tools_prompt([s.as_dict() for s in specs]))
            parallel = bool(kwargs.get("parallel_tool_calls", False)) and fmt.parallel
            tools_json = json.dumps([s.as_dict() for s in specs])

            def forced(only: str | None = None) -> _Call:
                prefix, g = _tool_grammar(fmt, tools_json, only, parallel)
                return _Call(agent, msgs, {**sampling, "grammar": g}, "tools", prefix, names, fmt=fmt)

            if choice == "required":
                return forced()
            if choice in names:
                return forced(choice)
            if choice == "auto":
                return _Call(agent, msgs, sampling, "auto", "", names, forced=forced, fmt=fmt)
            # "none": tools stay described (same prompt prefix, same kept KV) but are not called
        if response_format is not None and not (tools and choice != "none"):
            schema = _response_schema(response_format)
            msgs = with_system_block(msgs, json_prompt(schema))
            prefix, g = _json_grammar(None if schema is None else json.dumps(schema))
            return _Call(agent, msgs, {**sampling, "grammar": g}, "json", prefix)
        return _Call(agent, msgs, sampling)

    def _message_fields(self, call: _Call, reply: _Reply, results: list[PoolResult]) -> dict[str, Any]:
        first, last = results[0], results[-1]
        meta: dict[str, Any] = {
            "model_name": self.resolved_model_name(),
            "model_provider": "agentmem",
            "finish_reason": last.finish_reason,
            "agent_id": call.agent_id,
            "kv": first.kv,
            "timings": timings_dict(first),
        }
        if len(results) > 1:
            meta["retried_with_grammar"] = True
        return {"usage_metadata": usage_dict(results), "response_metadata": meta}

    # ------------------------------------------------------------------ LangChain hooks
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._prepare(messages, stop, kwargs)
        pool = self.get_pool()
        with agent_lock(pool, call.agent_id):
            results = [pool.chat(call.agent_id, call.pool_messages(), **call.sampling)]
            reply = _read(call, results[0].text)
            if reply.retry:
                assert call.forced is not None
                call = call.forced()
                results.append(pool.chat(call.agent_id, call.pool_messages(), **call.sampling))
                reply = _read(call, results[-1].text)
            if reply.rewrite is not None:
                agent, msgs, kw = _rewrite_call(call, reply)
                results.append(pool.chat(agent, msgs, **kw))
        message = AIMessage(
            content=reply.content,
            tool_calls=reply.tool_calls,
            invalid_tool_calls=reply.invalid_tool_calls,
            **self._message_fields(call, reply, results),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._prepare(messages, stop, kwargs)
        pool = self.get_pool()
        async with async_agent_lock(pool, call.agent_id):
            results = [await pool.achat(call.agent_id, call.pool_messages(), **call.sampling)]
            reply = _read(call, results[0].text)
            if reply.retry:
                assert call.forced is not None
                call = call.forced()
                results.append(await pool.achat(call.agent_id, call.pool_messages(), **call.sampling))
                reply = _read(call, results[-1].text)
            if reply.rewrite is not None:
                agent, msgs, kw = _rewrite_call(call, reply)
                results.append(await pool.achat(agent, msgs, **kw))
        message = AIMessage(
            content=reply.content,
            tool_calls=reply.tool_calls,
            invalid_tool_calls=reply.invalid_tool_calls,
            **self._message_fields(call, reply, results),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _final_chunk(self, call: _Call, reply: _Reply, results: list[PoolResult], content: str) -> ChatGenerationChunk:
        tool_call_chunks = [
            {"name": tc["name"], "args": json.dumps(tc["args"], ensure_ascii=False), "id": tc["id"], "index": i, "type": "tool_call_chunk"}
            for i, tc in enumerate(reply.tool_calls)
        ]
        tool_call_chunks += [
            {"name": tc.get("name"), "args": tc.get("args"), "id": tc.get("id"), "index": len(tool_call_chunks) + i, "type": "tool_call_chunk"}
            for i, tc in enumerate(reply.invalid_tool_calls)
        ]
        msg = AIMessageChunk(
            content=content,
            tool_call_chunks=tool_call_chunks,  # type: ignore[arg-type]
            chunk_position="last",
            **self._message_fields(call, reply, results),
        )
        return ChatGenerationChunk(message=msg)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._prepare(messages, stop, kwargs)
        pool = self.get_pool()
        holder = _Holder(call)

        def emit(text: str) -> ChatGenerationChunk:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
            if run_manager:
                run_manager.on_llm_new_token(text, chunk=chunk)
            return chunk

        with agent_lock(pool, call.agent_id):
            if call.mode == "json" and call.prefix:
                yield emit(call.prefix)
            stream = pool.chat_stream(call.agent_id, call.pool_messages(), **call.sampling)
            with contextlib.closing(stream):
                for piece in stream:
                    shown = holder.push(piece)
                    if shown:
                        yield emit(shown)
            assert stream.result is not None
            results = [stream.result]
            reply = _read(call, results[0].text)
            if reply.retry:
                assert call.forced is not None
                call = call.forced()
                results.append(pool.chat(call.agent_id, call.pool_messages(), **call.sampling))
                reply = _read(call, results[-1].text)
            if reply.rewrite is not None:
                agent, msgs, kw = _rewrite_call(call, reply)
                results.append(pool.chat(agent, msgs, **kw))
        yield self._final_chunk(call, reply, results, holder.rest(reply))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call = self._prepare(messages, stop, kwargs)
        pool = self.get_pool()
        holder = _Holder(call)

        async def emit(text: str) -> ChatGenerationChunk:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
            if run_manager:
                await run_manager.on_llm_new_token(text, chunk=chunk)
            return chunk

        async with async_agent_lock(pool, call.agent_id):
            if call.mode == "json" and call.prefix:
                yield await emit(call.prefix)
            result: PoolResult | None = None
            async with contextlib.aclosing(pool.achat_stream(call.agent_id, call.pool_messages(), **call.sampling)) as items:
                async for item in items:
                    if isinstance(item, PoolResult):
                        result = item
                        continue
                    shown = holder.push(item)
                    if shown:
                        yield await emit(shown)
            assert result is not None
            results = [result]
            reply = _read(call, result.text)
            if reply.retry:
                assert call.forced is not None
                call = call.forced()
                results.append(await pool.achat(call.agent_id, call.pool_messages(), **call.sampling))
                reply = _read(call, results[-1].text)
            if reply.rewrite is not None:
                agent, msgs, kw = _rewrite_call(call, reply)
                results.append(await pool.achat(agent, msgs, **kw))
        yield self._final_chunk(call, reply, results, holder.rest(reply))

