"""AgentMemMemory on the tiny model: AutoGen's `Memory` protocol over an agent's facts and evicted text.

The tiny model writes noise, so what is pinned is the plumbing: facts reach the
model context once and are pinned in the KV by the agent's client; text evicted
under a budget is found by `query` and brought back by `update_context`; config
round trip; validation.
"""

from __future__ import annotations

import pytest

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_core.memory import Memory, MemoryContent, MemoryMimeType  # noqa: E402
from autogen_core.model_context import UnboundedChatCompletionContext  # noqa: E402
from autogen_core.models import SystemMessage, UserMessage  # noqa: E402

from agentmem import ConfigError, MemoryPool  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient, AgentMemMemory  # noqa: E402
from agentmem_autogen._memory import FACTS_HEADER, RECALL_HEADER  # noqa: E402


@pytest.fixture
def pool(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=4096, resident_agents=2, chat_format="chatml", n_threads=1) as p:
        yield p


def fact(text: str) -> MemoryContent:
    return MemoryContent(content=text, mime_type=MemoryMimeType.TEXT)


async def test_facts_reach_the_context_once_and_are_pinned_in_the_kv(pool):
    memory = AgentMemMemory(pool, agent_id="analyst")
    assert isinstance(memory, Memory)
    await memory.add(fact("The customer is ACME."))
    await memory.add(fact("The customer is ACME."))  # a duplicate is kept once
    await memory.add(MemoryContent(content={"budget": 5}, mime_type=MemoryMimeType.JSON))
    client = AgentMemChatCompletionClient(pool, agent_id="analyst", max_tokens=3)
    agent = AssistantAgent("analyst", model_client=client, memory=[memory])
    await agent.run(task="hello")
    await agent.run(task="again")
    ctx = await agent._model_context.get_messages()
    facts = [m for m in ctx if isinstance(m, SystemMessage) and m.content.startswith(FACTS_HEADER)]
    assert len(facts) == 1 and "ACME" in facts[0].content and '{"budget": 5}' in facts[0].content
    led = pool.engine()._core.agent("analyst").ledger
    assert led.pinned[: len(led)].any(), "the facts message is pinned"
    hits = await memory.query("who is the customer")
    assert [r.metadata["source"] for r in hits.results] == ["fact"] and "ACME" in hits.results[0].content
    await memory.clear()
    assert memory.facts == []


async def test_evicted_text_comes_back_through_update_context(pool):
    pool.set_budget("keeper", 160)
    client = AgentMemChatCompletionClient(pool, agent_id="keeper", max_tokens=4)
    memory = AgentMemMemory(pool, agent_id="keeper", k=2)
    agent = AssistantAgent("keeper", model_client=client, memory=[memory])
    await agent.run(task="Remember this: the vault password is marmalade.")
    for i in range(6):
        await agent.run(task=f"Filler turn {i}: talk about the weather and nothing else at all today.")
    assert pool.stats()["agents"]["keeper"]["evicted_tokens"] > 0
    found = await memory.query("vault password")
    assert any(r.metadata["source"] == "recall" and "marmalade" in r.content for r in found.results), found
    ctx = UnboundedChatCompletionContext()
    await ctx.add_message(UserMessage(content="What is the vault password?", source="user"))
    res = await memory.update_context(ctx)
    msgs = await ctx.get_messages()
    assert isinstance(msgs[-1], SystemMessage) and msgs[-1].content.startswith(RECALL_HEADER)
    assert "marmalade" in msgs[-1].content and res.memories.results
    again = await memory.update_context(ctx)  # already in the context: not added twice
    assert again.memories.results == [] and len(await ctx.get_messages()) == len(msgs)


async def test_config_round_trip_reuses_the_open_pool(pool):
    memory = AgentMemMemory(pool, agent_id="a", k=4, facts=["x is 1"])
    config = memory.dump_component()
    assert config.provider == "agentmem_autogen.AgentMemMemory"
    same = AgentMemMemory.load_component(config)
    assert same._pool is pool and same.facts == ["x is 1"] and same._k == 4 and same.agent_id == "a"
    await same.close()
    assert not pool.closed


def test_bad_arguments_are_typed_errors(pool):
    with pytest.raises(ConfigError, match="agent_id"):
        AgentMemMemory(pool, agent_id="")
    with pytest.raises(ConfigError, match="k"):
        AgentMemMemory(pool, agent_id="a", k=-1)
    with pytest.raises(TypeError, match="MemoryPool"):
        AgentMemMemory(object(), agent_id="a")  # type: ignore[arg-type]
