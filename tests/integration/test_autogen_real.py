"""AgentMemChatCompletionClient on the real bundled models: AgentChat end to end.

One pool serves the whole module; generations are kept short.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_agentchat.conditions import MaxMessageTermination  # noqa: E402
from autogen_agentchat.messages import TextMessage, ToolCallExecutionEvent, ToolCallRequestEvent  # noqa: E402
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat  # noqa: E402
from autogen_core.models import (  # noqa: E402
    AssistantMessage,
    ChatCompletionClient,
    CreateResult,
    SystemMessage,
    UserMessage,
)
from pydantic import BaseModel  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient, choice_grammar, clients_for  # noqa: E402

pytestmark = pytest.mark.integration

MSGS = [
    SystemMessage(content="You are a product manager. Answer in one short sentence."),
    UserMessage(content="What should the first release of a todo app include?", source="ceo"),
]


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny and 22 C in {city}."


@pytest.fixture(scope="module")
def pool(default_model_path):
    # one thread: two threads stall on a CPU shared with other work (grammar sampling worst)
    with MemoryPool(default_model_path, n_ctx=4096, resident_agents=3, n_threads=1) as p:
        yield p


async def test_assistant_agent_tool_loop(pool):
    client = AgentMemChatCompletionClient(pool, agent_id="it-helper", max_tokens=24, force_tools=True)
    calls = []
    client.on_result = lambda agent, r: calls.append(r)
    agent = AssistantAgent(
        "helper", model_client=client, tools=[get_weather], reflect_on_tool_use=True,
        system_message="You are a helpful assistant.",
    )
    result = await agent.run(task="What is the weather in Paris?")
    request = next(m for m in result.messages if isinstance(m, ToolCallRequestEvent))
    assert request.content[0].name == "get_weather"
    assert isinstance(json.loads(request.content[0].arguments)["city"], str)
    execution = next(m for m in result.messages if isinstance(m, ToolCallExecutionEvent))
    assert execution.content[0].is_error is False and "sunny" in execution.content[0].content
    assert isinstance(result.messages[-1], TextMessage)
    call, reflection = calls
    # The reflection reuses the prompt and the call's fixed head: the head was given to the
    # model as the start of its reply, tokenized exactly as the next prompt renders it.
    # (Only the model-chosen argument tokens may differ from the canonical tokenization.)
    assert reflection.usage.cached_tokens >= call.usage.prompt_tokens, (reflection.usage, call.usage)


async def test_round_robin_team_runs_rounds_and_reuses_kv(pool):
    clients = clients_for(pool, ["it-pm", "it-engineer"], max_tokens=16)
    calls = []
    for c in clients.values():
        c.on_result = lambda agent, r: calls.append((agent, r.kv, r.usage.cached_tokens, r.usage.prompt_tokens))
    team = RoundRobinGroupChat(
        [
            AssistantAgent("pm", model_client=clients["it-pm"], system_message="You are a product manager. Be brief."),
            AssistantAgent("engineer", model_client=clients["it-engineer"], system_message="You are an engineer."),
        ],
        termination_condition=MaxMessageTermination(5),
    )
    result = await team.run(task="Plan a todo app.")
    assert [m.source for m in result.messages] == ["user", "pm", "engineer", "pm", "engineer"]
    assert [a for a, *_ in calls] == ["it-pm", "it-engineer"] * 2
    for agent, kv, cached, prompt in calls[2:]:
        assert kv == "reused" and cached > prompt // 2, (agent, kv, cached, prompt)


async def test_selector_team_with_its_own_selector_kv(pool):
    names = ["pm", "engineer"]
    clients = clients_for(pool, ["sel-pm", "sel-engineer"], max_tokens=12)
    selector = AgentMemChatCompletionClient(
        pool, agent_id="sel-selector", max_tokens=8, create_args={"grammar": choice_grammar(names)}
    )
    team = SelectorGroupChat(
        [AssistantAgent(n, model_client=clients[f"sel-{n}"], description=f"the {n}") for n in names],
        model_client=selector,
        termination_condition=MaxMessageTermination(3),
        allow_repeated_speaker=True,  # else with two agents only the first turn asks the model
    )
    seen = []
    selector.on_result = lambda agent, r: seen.append((r.kv, r.usage.cached_tokens))
    result = await team.run(task="Plan a todo app.")
    assert len(result.messages) == 3 and {m.source for m in result.messages[1:]} <= set(names)
    assert len(seen) == 2 and seen[1][1] > 0, seen  # the selector prompt's head was kept
    assert "sel-selector" in pool.agents()


async def test_streaming_ends_with_create_result(pool):
    client = AgentMemChatCompletionClient(pool, agent_id="it-stream", max_tokens=16)
    items = [x async for x in client.create_stream(MSGS)]
    assert isinstance(items[-1], CreateResult) and all(isinstance(x, str) for x in items[:-1])
    assert "".join(items[:-1]) == items[-1].content


async def test_component_round_trip_shares_pool_and_kv(pool):
    client = AgentMemChatCompletionClient(pool, agent_id="it-writer", max_tokens=12)
    first = await client.create(MSGS)
    loaded = ChatCompletionClient.load_component(client.dump_component().model_dump())
    assert isinstance(loaded, AgentMemChatCompletionClient) and loaded.pool is pool
    follow = [*MSGS, AssistantMessage(content=first.content, source="pm"), UserMessage(content="Why?", source="ceo")]
    again = await loaded.create(follow)
    assert again.cached is True, "the loaded client speaks for the same agent, whose KV was kept"


async def test_usage_adds_up(pool):
    client = AgentMemChatCompletionClient(pool, agent_id="it-usage", max_tokens=8)
    history = list(MSGS)
    per_call = []
    for question in ("Why?", "And then?"):
        r = await client.create(history)
        assert r.usage.prompt_tokens == client.count_tokens(history)
        assert client.actual_usage() == r.usage
        per_call.append(r.usage)
        history += [AssistantMessage(content=r.content, source="pm"), UserMessage(content=question, source="ceo")]
    total = client.total_usage()
    assert total.prompt_tokens == sum(u.prompt_tokens for u in per_call)
    assert total.completion_tokens == sum(u.completion_tokens for u in per_call)
    assert client.remaining_tokens(history) == pool.capacity - client.count_tokens(history)


class Feature(BaseModel):
    name: str
    priority: int


async def test_json_output_is_valid_from_the_small_model(pool):
    client = AgentMemChatCompletionClient(pool, agent_id="it-json", max_tokens=48)
    r = await client.create(MSGS, json_output=Feature)
    assert r.finish_reason == "stop", r.content
    Feature.model_validate_json(r.content)
