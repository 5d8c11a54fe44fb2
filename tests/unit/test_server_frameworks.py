"""Framework clients against `agentmem serve`: LangChain `ChatOpenAI` and AutoGen `OpenAIChatCompletionClient`.

Their own OpenAI clients, pointed at the server with `base_url`, one agent per client
through the `X-Agent-Id` header; the tiny model, so the checks are protocol and KV reuse.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

import httpx  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.server import ServerSettings, create_app  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402


class Pet(BaseModel):
    kind: Literal["cat", "dog"]
    friendly: bool


@pytest.fixture(scope="module")
def server(tiny_model_path: Any) -> Any:
    pool = MemoryPool(str(tiny_model_path), n_ctx=4096, resident_agents=2, n_threads=1)
    with ServerThread(create_app(pool, settings=ServerSettings(model_name="tiny", default_max_tokens=8))) as srv:
        yield srv
    pool.close()


def agent_stats(server: Any, agent_id: str) -> dict[str, Any]:
    return httpx.get(f"{server.base_url}/agents/{agent_id}").json()


def test_langchain_chat_openai(server: Any) -> None:
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Weather of a city."""
        return "sunny"

    model = lc.ChatOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", model="tiny", max_tokens=8,
                          default_headers={"X-Agent-Id": "lc-planner"}, max_retries=0)
    msgs: list[Any] = [SystemMessage("You plan."), HumanMessage("Plan a picnic.")]
    first = model.invoke(msgs)
    assert first.usage_metadata["input_token_details"].get("cache_read", 0) == 0
    msgs += [first, HumanMessage("And then?")]
    second = model.invoke(msgs)
    assert second.usage_metadata["input_token_details"]["cache_read"] >= first.usage_metadata["input_tokens"]

    chunks = list(model.stream([HumanMessage("Stream.")]))
    assert "".join(c.content for c in chunks)

    ai = model.bind_tools([get_weather], tool_choice="any").invoke([HumanMessage("Weather in Rome?")], max_tokens=64)
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather"
    assert ai.tool_calls[0]["args"]["city"] in ("Paris", "Rome")
    follow = model.bind_tools([get_weather], tool_choice="none").invoke(
        [HumanMessage("Weather in Rome?"), ai, ToolMessage("sunny", tool_call_id=ai.tool_calls[0]["id"])])
    assert isinstance(follow, AIMessage)

    pet = model.with_structured_output(Pet, method="json_schema").invoke("A pet?", max_tokens=64)
    assert isinstance(pet, Pet)


def test_langchain_create_agent_loop(server: Any) -> None:
    lc = pytest.importorskip("langchain_openai")
    agents = pytest.importorskip("langchain.agents")
    from langchain_core.tools import tool

    @tool
    def lookup(topic: Literal["tides", "winds"]) -> str:
        """Look a topic up."""
        return f"{topic}: calm"

    model = lc.ChatOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", model="tiny", max_tokens=8,
                          default_headers={"X-Agent-Id": "lc-agent"}, max_retries=0)
    graph = agents.create_agent(model, tools=[lookup], system_prompt="Use tools when useful.")
    out = graph.invoke({"messages": [{"role": "user", "content": "Tides today?"}]})
    assert out["messages"][-1].type == "ai"
    out = graph.invoke({"messages": [*out["messages"], {"role": "user", "content": "And winds?"}]})
    assert agent_stats(server, "lc-agent")["cached_tokens"] > 0  # the second turn reused the agent's KV


def test_autogen_round_robin_group_chat(server: Any) -> None:
    oa = pytest.importorskip("autogen_ext.models.openai")
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.conditions import MaxMessageTermination
    from autogen_agentchat.teams import RoundRobinGroupChat

    info = {"vision": False, "function_calling": True, "json_output": True, "family": "unknown",
            "structured_output": True}

    def client(agent_id: str) -> Any:
        return oa.OpenAIChatCompletionClient(model="tiny", base_url=f"{server.base_url}/v1", api_key="unused",
                                             model_info=info, max_tokens=6, default_headers={"X-Agent-Id": agent_id})

    async def main() -> Any:
        writer = AssistantAgent("writer", model_client=client("ag-writer"), system_message="You write.")
        critic = AssistantAgent("critic", model_client=client("ag-critic"), system_message="You critique.")
        team = RoundRobinGroupChat([writer, critic], termination_condition=MaxMessageTermination(5))
        return await team.run(task="Write a line about the sea.")

    result = asyncio.run(main())
    assert len(result.messages) == 5
    for agent_id in ("ag-writer", "ag-critic"):
        stats = agent_stats(server, agent_id)
        assert stats["calls"] == 2 and stats["cached_tokens"] > 0, stats
