"""ChatAgentMem / AgentMemLLM behaviour on the tiny synthetic model.

The tiny model has random weights, so these tests check *mechanics*: agent
identity, usage and cache accounting, streaming shape, async, stop strings,
grammar-constrained tool calls and structured output (valid whatever the
weights), message conversion — not what the model says.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
import threading
from typing import Any, Literal

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import (  # noqa: E402
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import ConfigurableField  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

import agentmem_langchain  # noqa: E402
from agentmem import MemoryPool  # noqa: E402
from agentmem.engine.chat_format import ToolCall as PoolToolCall  # noqa: E402
from agentmem.engine.chat_format import tool_calls_text  # noqa: E402
from agentmem_langchain import AgentMemLLM, ChatAgentMem, close_shared_pools, shared_pool  # noqa: E402
from agentmem.tools import integer_range, schema_grammar, split_forced_prefix, tool_call_grammar  # noqa: E402
from agentmem_langchain._messages import to_pool_messages  # noqa: E402
from agentmem_langchain._tools import normalize_tool_choice, parse_tool_calls  # noqa: E402
from agentmem_langchain._plan import _Call  # noqa: E402  (agentmem.calls.CallPlan)
from agentmem_langchain._reply import _Holder, _read  # noqa: E402

# n_threads=1: the tiny model decodes in microseconds; more threads only add
# synchronisation cost on a busy 2-core machine.
POOL_OPTIONS: dict[str, Any] = {"n_ctx": 1024, "resident_agents": 2, "n_threads": 1}


@pytest.fixture(scope="module")
def pool(tiny_model_path: Any) -> Any:
    p = MemoryPool(str(tiny_model_path), **POOL_OPTIONS)
    yield p
    p.close()


@pytest.fixture
def chat(pool: MemoryPool, request: pytest.FixtureRequest) -> ChatAgentMem:
    """A chat model on its own agent (named after the test)."""
    return ChatAgentMem(pool=pool, agent_id=request.node.name, max_tokens=12)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def ping() -> str:
    """Check the connection."""
    return "pong"


class Pet(BaseModel):
    """A pet."""

    kind: Literal["cat", "dog"] = Field(description="species")
    legs: int = Field(description="number of legs")


# --------------------------------------------------------------------------- package surface
def test_public_api_is_pinned() -> None:
    assert agentmem_langchain.__all__ == ["AgentMemLLM", "AgentMemRetriever", "ChatAgentMem", "close_shared_pools", "shared_pool"]


def test_import_without_langchain_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = {k: v for k, v in sys.modules.items() if k == "agentmem_langchain" or k.startswith("agentmem_langchain.")}
    for k in saved:
        monkeypatch.delitem(sys.modules, k)
    monkeypatch.setitem(sys.modules, "langchain_core", None)  # makes `import langchain_core` fail
    try:
        with pytest.raises(ImportError, match=r"pip install 'agentmem-kv\[langchain\]'"):
            importlib.import_module("agentmem_langchain")
    finally:
        monkeypatch.undo()
        sys.modules.update(saved)


def test_construction_loads_nothing(tmp_path: Any) -> None:
    model = ChatAgentMem(model_path=str(tmp_path / "not-yet.gguf"), agent_id="x", pool_options={"n_ctx": 256})
    assert model.pool is None
    assert model.resolved_model_name() == "not-yet"


def test_bad_pool_options_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="resident_agents must be >= 1"):
        ChatAgentMem(pool_options={"resident_agents": 0})
    with pytest.raises(ValueError, match="unknown pool option"):
        ChatAgentMem(pool_options={"n_ctxx": 10})


def test_pool_and_pool_options_are_exclusive(pool: MemoryPool) -> None:
    with pytest.raises(ValueError, match="either pool"):
        ChatAgentMem(pool=pool, pool_options={"n_ctx": 256})


def test_empty_agent_id_is_rejected() -> None:
    with pytest.raises(ValueError, match="agent_id"):
        ChatAgentMem(agent_id="")


def test_shared_pool_is_shared_by_equal_options(tiny_model_path: Any) -> None:
    a = ChatAgentMem(model_path=str(tiny_model_path), agent_id="a", pool_options={"n_ctx": 256, "n_threads": 1})
    b = AgentMemLLM(model_path=str(tiny_model_path), agent_id="b", pool_options={"n_ctx": 256, "n_threads": 1})
    try:
        assert a.get_pool() is b.get_pool() is shared_pool(str(tiny_model_path), n_ctx=256, n_threads=1)
        a.invoke("hi", max_tokens=2)
        b.invoke("hi", max_tokens=2)
        assert set(a.get_pool().agents()) == {"a", "b"}
    finally:
        close_shared_pools()
    assert a.get_pool() is not None  # a closed shared pool is replaced on next use
    close_shared_pools()


# --------------------------------------------------------------------------- messages
def test_messages_convert_to_pool_roles() -> None:
    msgs = to_pool_messages(
        [
            SystemMessage("sys"),
            HumanMessage([{"type": "text", "text": "a"}, "b"], name="ann"),
            AIMessage(
                [{"type": "text", "text": "thinking aloud"}, {"type": "tool_use", "id": "1", "name": "add", "input": {}}],
                tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "1"}],
            ),
            ToolMessage("3", tool_call_id="1", name="add", status="error"),
            ChatMessage(role="developer", content="dev"),
        ]
    )
    assert msgs == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "ab", "name": "ann"},
        {
            "role": "assistant",
            "content": "thinking aloud",
            "tool_calls": [{"id": "1", "name": "add", "arguments": {"a": 1, "b": 2}}],
        },
        {"role": "tool", "content": "3", "tool_call_id": "1", "name": "add"},
        {"role": "system", "content": "dev"},
    ]


def test_non_text_content_is_an_error_naming_the_message() -> None:
    image = {"type": "image", "base64": "AAAA", "mime_type": "image/png"}
    with pytest.raises(ValueError, match=r"messages\[1\]\.content\[0\].*'image'"):
        to_pool_messages([HumanMessage("hi"), HumanMessage([image])])
    with pytest.raises(ValueError, match="ChatMessage role 'robot'"):
        to_pool_messages([ChatMessage(role="robot", content="x")])


def test_tool_results_land_in_tool_result_regions(pool: MemoryPool, chat: ChatAgentMem) -> None:
    history = [
        HumanMessage("1+2?"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1"}]),
        ToolMessage("3", tool_call_id="c1", name="add"),
    ]
    chat.bind_tools([add]).invoke(history)
    regions = pool.stats()["agents"][chat.agent_id]["regions"]
    assert regions.get("tool_result", 0) > 0 and regions.get("tool_call", 0) > 0, regions


# --------------------------------------------------------------------------- invoke, usage, identity
def test_invoke_reports_usage_and_metadata(chat: ChatAgentMem) -> None:
    msg = chat.invoke("Hello there")
    u = msg.usage_metadata
    assert u is not None
    assert u["output_tokens"] <= 12 and u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert u["input_token_details"] == {"cache_read": 0}
    meta = msg.response_metadata
    assert meta["model_name"] == "tiny-llama" and meta["model_provider"] == "agentmem"
    assert meta["agent_id"] == chat.agent_id and meta["kv"] == "prefilled"
    assert meta["finish_reason"] in ("stop", "length")
    assert set(meta["timings"]) == {"ttft_s", "restore_s", "prefill_s", "decode_s", "total_s"}


def test_cache_read_counts_kept_prompt_tokens(chat: ChatAgentMem) -> None:
    first = chat.invoke([HumanMessage("Hello there")])
    second = chat.invoke([HumanMessage("Hello there"), first, HumanMessage("And then?")])
    assert second.response_metadata["kv"] == "reused"
    cached = second.usage_metadata["input_token_details"]["cache_read"]  # type: ignore[index]
    assert first.usage_metadata["input_tokens"] <= cached < second.usage_metadata["input_tokens"]  # type: ignore[index]


def test_agent_id_per_call_config_and_configurable_fields(pool: MemoryPool) -> None:
    model = ChatAgentMem(pool=pool, agent_id="id-default", max_tokens=2)
    assert model.invoke("x").response_metadata["agent_id"] == "id-default"
    assert model.invoke("x", agent_id="id-kwarg").response_metadata["agent_id"] == "id-kwarg"
    cfg = model.with_config(configurable={"agent_id": "id-config"})
    assert cfg.invoke("x").response_metadata["agent_id"] == "id-config"
    field = model.configurable_fields(agent_id=ConfigurableField(id="agent_id"))
    assert field.invoke("x", config={"configurable": {"agent_id": "id-field"}}).response_metadata["agent_id"] == "id-field"
    chunks = list(cfg.stream("x"))
    assert chunks[-1].response_metadata["agent_id"] == "id-config"
    assert {"id-default", "id-kwarg", "id-config", "id-field"} <= set(pool.agents())


def test_instances_share_one_pool(pool: MemoryPool) -> None:
    planner = ChatAgentMem(pool=pool, agent_id="share-planner", max_tokens=2)
    writer = ChatAgentMem(pool=pool, agent_id="share-writer", max_tokens=2)
    planner.invoke("plan")
    writer.invoke("write")
    assert {"share-planner", "share-writer"} <= set(pool.agents())


def test_unknown_call_argument_is_an_error(chat: ChatAgentMem) -> None:
    with pytest.raises(ValueError, match=r"unsupported argument\(s\) \['frobnicate'\]"):
        chat.invoke("x", frobnicate=1)


def test_stop_strings_per_call_and_per_instance(chat: ChatAgentMem) -> None:
    text = chat.invoke("Hello", max_tokens=24).text
    if len(text) < 4:
        pytest.skip(f"the tiny model ended too early to pick a stop string: {text!r}")
    stop = text[2:4]
    cut = text[: text.index(stop)]
    assert chat.invoke("Hello", max_tokens=24, stop=[stop]).text == cut
    other = ChatAgentMem(pool=chat.pool, agent_id=chat.agent_id, stop=[stop], max_tokens=24)
    assert other.invoke("Hello").text == cut
    assert other._get_ls_params()["ls_stop"] == [stop]


def test_batch_on_one_agent_is_serialized(chat: ChatAgentMem) -> None:
    """Regression: batch() runs inputs in threads; two calls on one agent must not interleave."""
    solo = [chat.invoke(p).text for p in ("one", "two", "three")]
    assert chat.batch(["one", "two", "three"], config={"max_concurrency": 3}) is not None
    assert [m.text for m in chat.batch(["one", "two", "three"])] == solo


# --------------------------------------------------------------------------- streaming and async
def test_stream_matches_invoke_and_puts_usage_on_last_chunk(chat: ChatAgentMem) -> None:
    whole = chat.invoke("Stream me")
    chunks = list(chat.stream("Stream me"))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert [c.chunk_position for c in chunks].count("last") == 1 and chunks[-1].chunk_position == "last"
    with_usage = [c for c in chunks if c.usage_metadata]
    assert with_usage == [chunks[-1]]
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert full.content == whole.content
    assert full.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]  # type: ignore[index]
    assert full.response_metadata["model_name"] == "tiny-llama"


async def test_async_paths_match_sync(chat: ChatAgentMem) -> None:
    whole = chat.invoke("Async me")
    a = await chat.ainvoke("Async me")
    assert a.content == whole.content
    full = None
    async for c in chat.astream("Async me"):
        full = c if full is None else full + c
    assert full is not None and full.content == whole.content and full.usage_metadata is not None
    both = await chat.abatch(["Async me", "Async me"])
    assert [m.content for m in both] == [whole.content, whole.content]


async def test_async_calls_on_different_agents_overlap(pool: MemoryPool) -> None:
    models = [ChatAgentMem(pool=pool, agent_id=f"async-{i}", max_tokens=4) for i in range(3)]
    results = await asyncio.gather(*(m.ainvoke("hi") for m in models))
    assert [r.response_metadata["agent_id"] for r in results] == ["async-0", "async-1", "async-2"]


def test_stream_events_v3(chat: ChatAgentMem) -> None:
    stream = chat.stream_events("Events", version="v3")
    events = list(stream)
    assert events
    assert stream.output.response_metadata["agent_id"] == chat.agent_id


# --------------------------------------------------------------------------- tools
@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, "auto"),
        ("auto", "auto"),
        ("none", "none"),
        (False, "none"),
        ("any", "required"),
        ("required", "required"),
        (True, "required"),
        ("add", "add"),
        ({"type": "function", "function": {"name": "add"}}, "add"),
        ({"type": "tool", "name": "ping"}, "ping"),
        ({"type": "any"}, "required"),
    ],
)
def test_tool_choice_forms(choice: Any, expected: str) -> None:
    assert normalize_tool_choice(choice, ["add", "ping"]) == expected


def test_unknown_tool_choice_lists_the_tools() -> None:
    with pytest.raises(ValueError, match=r"bound tools: \['add', 'ping'\]"):
        normalize_tool_choice("mul", ["add", "ping"])


@pytest.mark.parametrize("choice", ["any", "add", {"type": "function", "function": {"name": "add"}}])
def test_forced_tool_call_parses_and_matches_the_rendered_history(chat: ChatAgentMem, choice: Any) -> None:
    ai = chat.bind_tools([add, ping], tool_choice=choice).invoke("What is 1 + 2?", max_tokens=64)
    assert not ai.invalid_tool_calls, ai.invalid_tool_calls
    assert len(ai.tool_calls) == 1
    call = ai.tool_calls[0]
    assert call["id"] and call["type"] == "tool_call"
    if choice != "any":
        assert call["name"] == "add"
    if call["name"] == "add":
        assert set(call["args"]) == {"a", "b"} and all(isinstance(v, int) for v in call["args"].values())
    # What the model emitted is exactly what agentmem renders for this call next turn.
    emitted = tool_calls_text([PoolToolCall(id="", name=call["name"], arguments=call["args"])])
    assert json.loads(emitted) == {"tool_calls": [{"name": call["name"], "arguments": call["args"]}]}


def test_forced_tool_call_streams_as_tool_call_chunks(chat: ChatAgentMem) -> None:
    bound = chat.bind_tools([add], tool_choice="any")
    whole = bound.invoke("1+2", max_tokens=64)
    chunks = list(bound.stream("1+2", max_tokens=64))
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]
    assert full.usage_metadata is not None


def test_no_argument_tool_is_fully_forced(chat: ChatAgentMem) -> None:
    ai = chat.bind_tools([ping], tool_choice="ping").invoke("ping it")
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("ping", {})]


def test_tool_call_cut_by_max_tokens_is_an_invalid_tool_call(chat: ChatAgentMem) -> None:
    bound = chat.bind_tools([add], tool_choice="any")
    ai = bound.invoke("1+2", max_tokens=1)
    assert ai.tool_calls == [] and len(ai.invalid_tool_calls) == 1
    bad = ai.invalid_tool_calls[0]
    assert bad["name"] == "add" and bad["args"].startswith('{"a":') and "invalid tool-call JSON" in (bad["error"] or "")
    assert ai.response_metadata["finish_reason"] == "length"
    # Streamed, a cut-off call merges into a call with partial arguments (LangChain's convention).
    full = None
    for chunk in bound.stream("1+2", max_tokens=1):
        full = chunk if full is None else full + chunk
    assert full is not None and [c["name"] for c in full.tool_calls + full.invalid_tool_calls] == ["add"]


def test_parallel_tool_calls_allow_several(chat: ChatAgentMem) -> None:
    ai = chat.bind_tools([add, ping], tool_choice="any", parallel_tool_calls=True).invoke("go", max_tokens=96)
    assert ai.tool_calls or ai.invalid_tool_calls  # random weights: any number of calls, valid when complete


def test_tool_choice_none_never_parses_calls(chat: ChatAgentMem) -> None:
    ai = chat.bind_tools([add], tool_choice="none").invoke("1+2")
    assert ai.tool_calls == [] and ai.invalid_tool_calls == []


def _auto_call() -> _Call:
    forced = _Call("a", [], sampling={}, mode="tools", prefix='{"tool_calls": [', tool_names=("add",))
    return _Call("a", [], sampling={}, mode="auto", tool_names=("add",), forced=lambda: forced)


def test_auto_mode_reads_text_calls_and_retries_broken_calls() -> None:
    call = _auto_call()
    assert _read(call, "Just text.").content == "Just text."
    good = _read(call, '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}')
    assert [(c["name"], c["args"]) for c in good.tool_calls] == [("add", {"a": 1, "b": 2})]
    assert _read(call, '{"tool_calls": [{"name": "add", "argu').retry
    assert _read(call, '{"tool_calls": [{"name": "mul", "arguments": {}}]}').retry  # unknown tool


def test_auto_mode_holds_back_only_what_may_be_a_call() -> None:
    h = _Holder(_auto_call())
    assert h.push("{") == "" and h.push('"tool') == ""
    h2 = _Holder(_auto_call())
    assert h2.push("  ") == "" and h2.push("Hi") == "  Hi" and h2.push(" there") == " there"


def test_parse_tool_calls() -> None:
    assert parse_tool_calls("hello") is None
    calls, invalid = parse_tool_calls('{"tool_calls": [{"name": "f", "arguments": {}}, {"name": 3}]}')  # type: ignore[misc]
    assert [c["name"] for c in calls] == ["f"] and len(invalid) == 1


# --------------------------------------------------------------------------- grammars
def test_grammar_uses_the_canonical_json_spacing() -> None:
    g = schema_grammar({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}})
    assert "space" not in g and '": "' in g and '", "' in g


def test_forced_prefix_of_a_single_tool() -> None:
    g = tool_call_grammar([{"name": "add", "parameters": add.args_schema.model_json_schema()}])  # type: ignore[union-attr]
    prefix, rest = split_forced_prefix(g)
    assert prefix == '{"tool_calls": [{"name": "add", "arguments": {"a":'
    assert rest.startswith('root ::= " "')


def test_forced_prefix_stops_at_a_choice() -> None:
    g = tool_call_grammar([{"name": "a", "parameters": {}}, {"name": "b", "parameters": {}}])
    assert split_forced_prefix(g)[0] == '{"tool_calls": [{"name": "'


def test_unsupported_schema_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="cannot build a grammar"):
        schema_grammar({"type": "object", "properties": {"x": {"$ref": "http://elsewhere/x.json"}}})


# --------------------------------------------------------------------------- structured output
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_is_valid_on_random_weights(chat: ChatAgentMem, method: str) -> None:
    chat = chat.model_copy(update={"max_tokens": 64})
    structured = chat.with_structured_output(Pet, method=method, include_raw=True)  # type: ignore[arg-type]
    out = structured.invoke("A pet?")
    assert set(out) == {"raw", "parsed", "parsing_error"}
    assert isinstance(out["parsed"], Pet), out
    as_dict = chat.with_structured_output(Pet.model_json_schema(), method=method).invoke("A pet?")  # type: ignore[arg-type]
    assert isinstance(as_dict, dict) and set(as_dict) == {"kind", "legs"}


def test_structured_output_streams_partial_json(chat: ChatAgentMem) -> None:
    chunks = list(chat.model_copy(update={"max_tokens": 64}).with_structured_output(Pet.model_json_schema()).stream("A pet?"))
    assert chunks and set(chunks[-1]) == {"kind", "legs"}


def test_json_mode_binds_a_json_object_grammar(chat: ChatAgentMem) -> None:
    call = chat._prepare([HumanMessage("x")], None, {"response_format": {"type": "json_object"}})
    assert call.mode == "json" and call.sampling["grammar"] and call.prefix == "{"
    assert "Reply with only a JSON object." in call.messages[0]["content"]


def test_structured_output_rejects_unknown_method(chat: ChatAgentMem) -> None:
    with pytest.raises(ValueError, match="unknown method"):
        chat.with_structured_output(Pet, method="xml")  # type: ignore[arg-type]


def test_raw_grammar_passthrough(chat: ChatAgentMem) -> None:
    ai = chat.invoke("Say yes", grammar='root ::= "yes" | "no"')
    assert ai.text in ("yes", "no")


# --------------------------------------------------------------------------- AgentMemLLM
def test_llm_invoke_generate_and_usage(pool: MemoryPool) -> None:
    llm = AgentMemLLM(pool=pool, agent_id="llm-unit", max_tokens=8)
    text = llm.invoke("The colours are")
    assert isinstance(text, str)
    res = llm.generate(["The colours are" + text + " and"])
    info = res.generations[0][0].generation_info
    assert info is not None and info["agent_id"] == "llm-unit"
    assert info["usage"]["input_token_details"]["cache_read"] > 0  # the longer prompt extends the first one
    assert res.llm_output is not None and res.llm_output["token_usage"]["cached_tokens"] == info["usage"]["input_token_details"]["cache_read"]


def test_llm_stream_async_and_config_agent(pool: MemoryPool) -> None:
    llm = AgentMemLLM(pool=pool, agent_id="llm-stream", max_tokens=6)
    whole = llm.invoke("Once upon")
    assert "".join(llm.stream("Once upon")) == whole
    assert asyncio.run(llm.ainvoke("Once upon")) == whole

    async def collect() -> str:
        return "".join([p async for p in llm.astream("Once upon")])

    assert asyncio.run(collect()) == whole
    llm.with_config(configurable={"agent_id": "llm-config"}).invoke("x")
    assert "llm-config" in pool.agents()
    streaming = AgentMemLLM(pool=pool, agent_id="llm-stream", max_tokens=6, streaming=True)
    assert streaming.invoke("Once upon") == whole


def test_llm_rejects_chat_only_arguments(pool: MemoryPool) -> None:
    with pytest.raises(ValueError, match="unsupported argument"):
        AgentMemLLM(pool=pool).invoke("x", tools=[])


def test_agent_lock_serializes_threads(pool: MemoryPool) -> None:
    from agentmem_langchain._common import agent_lock

    inside = 0
    peak = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, peak
        with agent_lock(pool, "locked-agent"):
            with guard:
                inside += 1
                peak = max(peak, inside)
            threading.Event().wait(0.01)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 1


def _gbnf_to_regex(expr: str) -> str:
    out = []
    for tok in re.findall(r'"(?:\\.|[^"\\])*"|\[[^\]]*\]|[()|]|\S+', expr):
        out.append(re.escape(tok[1:-1]) if tok.startswith('"') else tok)
    return "".join(out)


@pytest.mark.parametrize(
    ("lo", "hi"), [(-2, 12), (-999, 999), (0, 0), (7, 123), (-50, -3), (1, None), (None, -7), (100, 1000), (19, 20)]
)
def test_integer_range_grammar_is_exact(lo: int | None, hi: int | None) -> None:
    """Regression: integer bounds were ignored and the base model answered 3000000000000000 for lt=1000."""
    rx = re.compile("(?:" + _gbnf_to_regex(integer_range(lo, hi)) + ")$")
    for v in range((lo if lo is not None else -1200) - 30, (hi if hi is not None else 1200) + 31):
        assert bool(rx.match(str(v))) == ((lo is None or v >= lo) and (hi is None or v <= hi)), v
    assert not rx.match("-0") and not rx.match("007")


def test_schema_bounds_reach_the_grammar() -> None:
    g = schema_grammar({"type": "integer", "exclusiveMinimum": -1000, "exclusiveMaximum": 1000})
    assert "[1-9] [0-9] [0-9] )" in g and "[0-9] [0-9] [0-9] [0-9]" not in g
