"""AgentMemChatCompletionClient on the tiny synthetic model: the AutoGen contract, tools, JSON, streaming.

The tiny model has random weights, so its free text is noise; what is pinned here is
what does not depend on the weights: message conversion, grammar-constrained tool
calls and JSON, streaming shape, usage accounting, KV reuse, cancellation, the
component config round trip and the shared-pool registry.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from typing import Literal

import pytest

pytest.importorskip("autogen_core")

from autogen_core import AgentId, CancellationToken, FunctionCall, Image, MessageHandlerContext  # noqa: E402
from autogen_core.models import (  # noqa: E402
    AssistantMessage,
    ChatCompletionClient,
    CreateResult,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    SystemMessage,
    UserMessage,
    validate_model_info,
)
from autogen_core.tools import FunctionTool  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import agentmem_autogen  # noqa: E402
from agentmem import MemoryPool, MessageError  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient, choice_grammar, clients_for  # noqa: E402
from agentmem.tools import looks_like_tool_call  # noqa: E402
from agentmem_autogen._messages import candidate_names, parse_tool_calls, to_agentmem_messages  # noqa: E402


def set_flag(on: bool) -> str:
    """Switch the flag on or off."""
    return f"flag is {'on' if on else 'off'}"


def set_level(level: Literal["low", "high"]) -> str:
    """Set the level."""
    return f"level {level}"


FLAG = FunctionTool(set_flag, description="Switch the flag on or off.")
LEVEL = FunctionTool(set_level, description="Set the level.")
MSGS = [SystemMessage(content="You are terse."), UserMessage(content="hello world", source="bob")]


def exactly(text: str) -> str:
    """A GBNF grammar that admits only ``text`` (scripts what the tiny model "says")."""
    return "root ::= " + json.dumps(text)


class Verdict(BaseModel):
    ok: bool
    level: Literal["low", "high"]


@pytest.fixture(scope="module")
def pool(tiny_model_path):
    # one thread: immune to the thread-barrier stalls a busy shared CPU causes
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=4, chat_format="chatml", n_threads=1) as p:
        yield p


@pytest.fixture
def client(pool, request):
    # byte-level tiny vocabulary: a tool call takes a few dozen tokens
    c = AgentMemChatCompletionClient(pool, agent_id=f"t-{request.node.name}", max_tokens=48)
    yield c
    asyncio.run(c.close())


def test_public_api_is_pinned():
    assert sorted(agentmem_autogen.__all__) == sorted(
        [
            "SAMPLING_ARGS",
            "AgentMemChatCompletionClient",
            "AgentMemChatCompletionClientConfig",
            "AgentMemMemory",
            "AgentMemMemoryConfig",
            "choice_grammar",
            "clients_for",
            "follow",
        ]
    )


def test_import_without_autogen_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "autogen_core", None)
    for name in [m for m in sys.modules if m == "agentmem_autogen" or m.startswith("agentmem_autogen.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'agentmem-kv\[autogen\]'"):
        importlib.import_module("agentmem_autogen")


def test_is_a_chat_completion_client_with_model_info(client):
    assert isinstance(client, ChatCompletionClient)
    info = client.model_info
    validate_model_info(info)
    assert (info["function_calling"], info["json_output"], info["structured_output"], info["vision"]) == (
        True, True, True, False,
    )
    assert info["family"] == "unknown"
    assert client.capabilities == info


# ---------------------------------------------------------------- messages
def test_every_llm_message_type_converts():
    call = FunctionCall(id="c1", name="set_flag", arguments='{"on": true}')
    msgs = [
        SystemMessage(content="sys"),
        UserMessage(content="hi", source="pm"),
        UserMessage(content=["part one", "part two"], source="user"),
        AssistantMessage(content="sure", source="me"),
        AssistantMessage(content=[call], thought="let me switch it", source="me"),
        FunctionExecutionResultMessage(
            content=[FunctionExecutionResult(content="flag is on", name="set_flag", call_id="c1", is_error=False)]
        ),
    ]
    assert to_agentmem_messages(msgs) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi", "name": "pm"},
        {"role": "user", "content": "part one\npart two", "name": "user"},
        {"role": "assistant", "content": "sure"},
        {
            "role": "assistant",
            "content": "let me switch it",
            "tool_calls": [{"id": "c1", "name": "set_flag", "arguments": '{"on": true}'}],
        },
        {"role": "tool", "content": "flag is on", "tool_call_id": "c1", "name": "set_flag"},
    ]


def test_image_content_is_a_clear_error():
    img = Image.from_base64(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=="
    )
    with pytest.raises(MessageError, match=r"messages\[0\]\.content\[1\] is an Image"):
        to_agentmem_messages([UserMessage(content=["look", img], source="u")])


def test_user_source_is_rendered(client, pool):
    n_named = client.count_tokens([UserMessage(content="hello world", source="the_reviewer")])
    assert n_named == pool.count_tokens([{"role": "user", "content": "hello world", "name": "the_reviewer"}])
    assert n_named > pool.count_tokens([{"role": "user", "content": "hello world"}])


def test_count_and_remaining_tokens(client, pool):
    n = client.count_tokens(MSGS)
    assert n == pool.count_tokens(to_agentmem_messages(MSGS))
    assert client.remaining_tokens(MSGS) == pool.capacity - n
    assert client.count_tokens(MSGS, tools=[FLAG]) > n


# ---------------------------------------------------------------- create / stream / usage
async def test_create_text_usage_and_cached(client):
    r1 = await client.create(MSGS)
    assert isinstance(r1, CreateResult) and isinstance(r1.content, str)
    assert r1.cached is False, "a fresh agent has no kept KV"
    assert r1.usage.prompt_tokens == client.count_tokens(MSGS)
    assert 0 < r1.usage.completion_tokens <= 48
    assert client.actual_usage() == r1.usage
    follow = [*MSGS, AssistantMessage(content=r1.content, source="me"), UserMessage(content="and then?", source="bob")]
    r2 = await client.create(follow)
    assert r2.cached is True
    assert client.last_result is not None and client.last_result.kv == "reused"
    assert client.last_result.usage.cached_tokens >= r1.usage.prompt_tokens
    total = client.total_usage()
    assert (total.prompt_tokens, total.completion_tokens) == (
        r1.usage.prompt_tokens + r2.usage.prompt_tokens,
        r1.usage.completion_tokens + r2.usage.completion_tokens,
    )


async def test_create_stream_yields_text_then_result(client):
    items = [x async for x in client.create_stream(MSGS)]
    assert isinstance(items[-1], CreateResult)
    pieces = items[:-1]
    assert pieces and all(isinstance(p, str) for p in pieces)
    assert "".join(pieces) == items[-1].content
    assert client.actual_usage() == items[-1].usage


async def test_on_result_hook_sees_every_pool_call(client):
    seen = []
    client.on_result = lambda agent, r: seen.append((agent, r.kv))
    await client.create(MSGS)
    assert seen == [(client.agent_id, "prefilled")]


# ---------------------------------------------------------------- tools
async def test_required_tool_call_is_valid(client):
    r = await client.create(MSGS, tools=[FLAG], tool_choice="required")
    assert r.finish_reason == "function_calls"
    assert isinstance(r.content, list) and len(r.content) == 1
    call = r.content[0]
    assert isinstance(call, FunctionCall) and call.name == "set_flag" and call.id
    assert isinstance(json.loads(call.arguments)["on"], bool)


async def test_specific_tool_choice_picks_that_tool(client):
    r = await client.create(MSGS, tools=[FLAG, LEVEL], tool_choice=LEVEL)
    assert [c.name for c in r.content] == ["set_level"]
    assert json.loads(r.content[0].arguments)["level"] in ("low", "high")


async def test_required_with_several_tools_calls_one_of_them(client):
    r = await client.create(MSGS, tools=[FLAG, LEVEL], tool_choice="required")
    assert r.finish_reason == "function_calls" and r.content[0].name in ("set_flag", "set_level")


async def test_force_tools_turns_auto_into_required(pool):
    c = AgentMemChatCompletionClient(pool, agent_id="forced", max_tokens=48, force_tools=True)
    r = await c.create(MSGS, tools=[FLAG])
    assert r.finish_reason == "function_calls"
    r = await c.create(MSGS)  # no tools offered: text
    assert isinstance(r.content, str)


async def test_tool_choice_none_returns_text(client):
    r = await client.create(MSGS, tools=[FLAG], tool_choice="none")
    assert isinstance(r.content, str) and r.finish_reason in ("stop", "length")


async def test_tool_loop_history_renders_and_reuses_kv(client):
    r1 = await client.create(MSGS, tools=[FLAG], tool_choice="required")
    call = r1.content[0]
    history = [
        *MSGS,
        AssistantMessage(content=r1.content, source="me"),
        FunctionExecutionResultMessage(
            content=[
                FunctionExecutionResult(content=set_flag(**json.loads(call.arguments)), name=call.name, call_id=call.id)
            ]
        ),
    ]
    r2 = await client.create(history, tool_choice="none")  # the reflection step passes no tools
    assert isinstance(r2.content, str)
    kept = client.last_result.usage.cached_tokens
    # The tools block stayed in the prompt although the reflection passed no tools, so
    # the KV of the first call's prompt was kept. (On the real model the grammar-written
    # call is kept too: see tests/integration/test_autogen_real.py; the tiny SentencePiece
    # vocabulary adds a space at every segment start, so its call tokens differ.)
    assert kept >= client.count_tokens(MSGS, tools=[FLAG]) - 3, f"{kept=}"


async def test_tools_block_sticks_to_the_agent(client):
    bare = client.count_tokens(MSGS)
    await client.create(MSGS, tools=[FLAG], tool_choice="required")
    assert client.count_tokens(MSGS) == client.count_tokens(MSGS, tools=[FLAG]) > bare


async def test_auto_mode_parses_a_call_and_keeps_the_text_before_it(client):
    grammar = exactly('Let me switch it.\n{"tool_calls": [{"name": "set_flag", "arguments": {"on": true}}]}')
    r = await client.create(MSGS, tools=[FLAG], extra_create_args={"grammar": grammar, "max_tokens": 200})
    assert r.finish_reason == "function_calls"
    assert [(c.name, json.loads(c.arguments)) for c in r.content] == [("set_flag", {"on": True})]
    assert r.thought == "Let me switch it."


async def test_auto_mode_redoes_a_malformed_call_under_the_grammar(client):
    broken = exactly('{"tool_calls": [{"name": "set_flag", "arguments": {"on": maybe')
    r = await client.create(MSGS, tools=[FLAG], extra_create_args={"grammar": broken, "max_tokens": 200})
    assert r.finish_reason == "function_calls"
    assert r.content[0].name == "set_flag" and isinstance(json.loads(r.content[0].arguments)["on"], bool)
    assert r.usage.completion_tokens > 0 and client.actual_usage() == r.usage


async def test_streamed_tool_call_yields_no_text(client):
    grammar = exactly('{"tool_calls": [{"name": "set_flag", "arguments": {"on": false}}]}')
    args = {"grammar": grammar, "max_tokens": 200}
    items = [x async for x in client.create_stream(MSGS, tools=[FLAG], extra_create_args=args)]
    assert len(items) == 1 and isinstance(items[0], CreateResult)
    assert items[0].content[0].name == "set_flag"
    items = [x async for x in client.create_stream(MSGS, tools=[FLAG], tool_choice="required")]
    assert len(items) == 1 and items[0].finish_reason == "function_calls"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tool_choice": "required"}, "no tools were given"),
        ({"tools": [FLAG], "tool_choice": LEVEL}, "not among tools"),
        ({"tools": [FLAG], "tool_choice": "sometimes"}, "tool_choice must be"),
        ({"json_output": 3}, "json_output must be"),
        ({"extra_create_args": {"frequency_penalty": 1}}, r"unknown extra_create_args key\(s\) \['frequency_pen"),
        ({"json_output": True, "extra_create_args": {"grammar": "root ::= \"x\""}}, "cannot be combined"),
        ({"tools": [FLAG, FLAG]}, "duplicate tool name"),
    ],
)
async def test_bad_arguments_are_named(client, kwargs, match):
    with pytest.raises(ValueError, match=match):
        await client.create(MSGS, **kwargs)


# ---------------------------------------------------------------- JSON
async def test_json_output_true_is_a_json_object(client):
    r = await client.create(MSGS, json_output=True, extra_create_args={"max_tokens": 200})
    assert r.finish_reason == "stop", r.content
    assert isinstance(json.loads(r.content), dict)


async def test_json_output_pydantic_model_validates(client):
    r = await client.create(MSGS, json_output=Verdict, extra_create_args={"max_tokens": 32})
    assert Verdict.model_validate_json(r.content)


async def test_json_output_with_tools_gives_json_or_a_call(client):
    r = await client.create(MSGS, tools=[FLAG], json_output=Verdict, extra_create_args={"max_tokens": 48})
    if r.finish_reason == "function_calls":
        assert r.content[0].name == "set_flag"
    else:
        assert Verdict.model_validate_json(r.content)


async def test_speaker_selection_answers_with_a_listed_candidate(pool):
    c = AgentMemChatCompletionClient(pool, agent_id="selector", max_tokens=16, speaker_selection=True)
    prompt = (
        "Roles: pm, engineer, writer.\n\nuser: plan it\n\n"
        "Read the above conversation. Then select the next role from ['engineer', 'writer'] to play."
    )
    r = await c.create([UserMessage(content=prompt, source="user")])
    assert r.content in ("engineer", "writer")
    r = await c.create(MSGS)  # no candidate list: unconstrained
    assert isinstance(r.content, str)


def test_candidate_names_takes_the_last_list():
    prompt = "from ['pm', 'engineer'] ...\n\nhistory\n\nselect the next role from ['engineer', 'writer_2'] to play"
    assert candidate_names([{"role": "user", "content": prompt}]) == ["engineer", "writer_2"]
    assert candidate_names([{"role": "user", "content": "no list"}]) == []


async def test_choice_grammar_picks_a_name(client):
    r = await client.create(MSGS, extra_create_args={"grammar": choice_grammar(["pm", "engineer"]), "max_tokens": 8})
    assert r.content in ("pm", "engineer")


# ---------------------------------------------------------------- cancellation, close
async def test_cancellation_stops_generation_and_frees_the_agent(client, pool):
    token = CancellationToken()
    seen = 0
    with pytest.raises(asyncio.CancelledError):
        async for item in client.create_stream(MSGS, extra_create_args={"max_tokens": 1000}, cancellation_token=token):
            seen += 1
            if seen == 3:
                token.cancel()
    assert pool.stats()["agents"][client.agent_id]["tokens"] < client.count_tokens(MSGS) + 100
    r = await client.create(MSGS)  # the agent is usable again
    assert isinstance(r.content, str)


async def test_cancelled_token_cancels_create(client):
    token = CancellationToken()
    token.cancel()
    with pytest.raises(asyncio.CancelledError):
        await client.create(MSGS, cancellation_token=token)


async def test_closed_client_refuses_calls(pool):
    c = AgentMemChatCompletionClient(pool, agent_id="closing")
    await c.close()
    await c.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await c.create(MSGS)
    assert not pool.closed, "a client never closes a pool it was handed"


# ---------------------------------------------------------------- agent ids
async def test_clients_for_gives_each_agent_its_own_kv(pool):
    clients = clients_for(pool, ["u-pm", "u-engineer"], max_tokens=4)
    assert [c.agent_id for c in clients.values()] == ["u-pm", "u-engineer"]
    for c in clients.values():
        await c.create(MSGS)
    assert {"u-pm", "u-engineer"} <= set(pool.agents())
    with pytest.raises(ValueError, match="duplicate agent id"):
        clients_for(pool, ["x", "x"])


async def test_agent_id_none_follows_the_calling_autogen_agent(pool):
    c = AgentMemChatCompletionClient(pool, max_tokens=2)
    await c.create(MSGS)
    assert "autogen" in pool.agents()
    with MessageHandlerContext.populate_context(AgentId("reviewer_team1", "default")):
        await c.create(MSGS)
    assert "reviewer_team1" in pool.agents()


# ---------------------------------------------------------------- component config
def test_component_round_trip_reuses_the_open_pool(pool):
    c = AgentMemChatCompletionClient(
        pool, agent_id="writer", max_tokens=12, temperature=0.5, create_args={"top_k": 5}, force_tools=True,
        speaker_selection=True,
    )
    model = c.dump_component()
    assert model.provider == "agentmem_autogen.AgentMemChatCompletionClient"
    assert model.config["pool"] == pool.config.to_dict()
    loaded = ChatCompletionClient.load_component(json.loads(model.model_dump_json()))
    assert isinstance(loaded, AgentMemChatCompletionClient)
    assert loaded.pool is pool, "loading must reuse the pool already open in this process"
    assert loaded.agent_id == "writer"
    assert loaded.dump_component().config == model.config


async def test_config_without_an_open_pool_loads_one_and_its_clients_close_it(tiny_model_path):
    cfg = dict(model_path=str(tiny_model_path), n_ctx=256, resident_agents=1, chat_format="chatml", n_threads=1)
    a = AgentMemChatCompletionClient(pool_config=cfg, agent_id="a", max_tokens=2)
    b = AgentMemChatCompletionClient.load_component(a.dump_component())
    assert b.pool is a.pool
    await a.create(MSGS)
    await a.close()
    assert not a.pool.closed, "b still uses it"
    await b.close()
    assert a.pool.closed


def test_pool_and_pool_config_are_exclusive(pool):
    with pytest.raises(ValueError, match="either pool"):
        AgentMemChatCompletionClient(pool, pool_config={"n_ctx": 256})
    with pytest.raises(ValueError, match="unknown create_args"):
        AgentMemChatCompletionClient(pool, create_args={"presence_penalty": 1})


# ---------------------------------------------------------------- parsing helpers
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"tool_calls": [{"name": "set_flag", "arguments": {"on": true}}]}', [("set_flag", {"on": True})]),
        ('Sure.\n```json\n{"name": "set_flag", "arguments": {"on": false}}\n```', [("set_flag", {"on": False})]),
        ('{"tool_calls": [{"name": "set_flag", "arguments": "{\\"on\\": true}"}]}', [("set_flag", {"on": True})]),
        ('{"tool_calls": [{"name": "unknown_tool", "arguments": {}}]}', None),
        ('{"name": "set_flag", "description": "x", "arguments": {}}', None),
        ("no call here", None),
    ],
)
def test_parse_tool_calls(text, expected):
    got = parse_tool_calls(text, ["set_flag"])
    if expected is None:
        assert got is None
    else:
        assert [(c.name, json.loads(c.arguments)) for c in got[0]] == expected


def test_looks_like_tool_call():
    assert looks_like_tool_call('{"tool_calls": [{"name": "set_fl', ["set_flag"])
    assert looks_like_tool_call('```json\n{"name": "set_flag", "argu', ["set_flag"])
    assert not looks_like_tool_call("The flag is set.", ["set_flag"])
