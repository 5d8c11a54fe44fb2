"""AgentMemChatCompletionClient and AgentMemMemory over a `ModelPool` (issue #26): each on its agent's model.

The memory's recall runs on the agent's model too, under its own seat (binding nothing);
the client pins its facts on that model's pool.

The model pool is `FakeModelPool` (the real bindings and leases, a counting tier) over
two pools of the tiny model.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_core import CancellationToken  # noqa: E402
from autogen_core.memory import MemoryContent, MemoryMimeType  # noqa: E402
from autogen_core.models import CreateResult, UserMessage  # noqa: E402

from agentmem import ConfigError, MemoryPool  # noqa: E402
from agentmem.errors import ModelMismatchError, UnknownModelError  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient, AgentMemMemory, clients_for  # noqa: E402
from tests.fixtures.model_pools import FakeModelPool, calls_on, where  # noqa: E402

MSGS = [UserMessage(content="Name a colour.", source="user")]


async def test_each_client_runs_on_its_agents_model_and_keeps_its_kv(
        model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    clients = {"ag-plan": AgentMemChatCompletionClient(model_team, agent_id="ag-plan", model="small", max_tokens=4),
               "ag-code": AgentMemChatCompletionClient(model_team, agent_id="ag-code", model="big", max_tokens=4)}
    for _ in range(2):
        for c in clients.values():
            r = await c.create(MSGS)
            assert isinstance(r, CreateResult) and model_team.fake_tier.held == 0
    assert all(c.last_result is not None and c.last_result.kv == "reused" for c in clients.values())
    assert where(tiny_model_pools, "ag-plan") == ["small"]
    assert where(tiny_model_pools, "ag-code") == ["big"]
    assert model_team.fake_tier.log == calls_on("small", "big", "small", "big")


async def test_a_stream_holds_its_model_until_it_ends_is_closed_or_cancelled(model_team: FakeModelPool) -> None:
    client = AgentMemChatCompletionClient(model_team, agent_id="ag-stream", model="big", max_tokens=12)
    held = [model_team.fake_tier.uses["big"] async for _ in client.create_stream(MSGS)]
    assert set(held) == {1} and model_team.fake_tier.held == 0
    stream = client.create_stream(MSGS)
    await stream.__anext__()
    assert model_team.fake_tier.uses["big"] == 1
    await stream.aclose()  # left early: the generation stops, then the hold ends
    assert model_team.fake_tier.held == 0
    token = CancellationToken()
    with pytest.raises(asyncio.CancelledError):
        async for _ in client.create_stream(MSGS, extra_create_args={"max_tokens": 200}, cancellation_token=token):
            token.cancel()
    assert model_team.fake_tier.held == 0


async def test_another_model_for_a_bound_agent_raises_the_typed_error(model_team: FakeModelPool) -> None:
    await AgentMemChatCompletionClient(model_team, agent_id="ag-bound", model="small", max_tokens=2).create(MSGS)
    wrong = AgentMemChatCompletionClient(model_team, agent_id="ag-bound", model="big", max_tokens=2)
    with pytest.raises(ModelMismatchError):
        await wrong.create(MSGS)
    with pytest.raises(ModelMismatchError):
        _ = [x async for x in wrong.create_stream(MSGS)]
    assert model_team.fake_tier.held == 0


def test_construction_checks_the_model_and_counting_binds_nothing(
        model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    with pytest.raises(UnknownModelError):
        AgentMemChatCompletionClient(model_team, agent_id="x", model="huge")
    with pytest.raises(UnknownModelError):  # a pool of one holds its model only
        AgentMemChatCompletionClient(FakeModelPool({"small": tiny_model_pools["small"]}), agent_id="x", model="big")
    client = AgentMemChatCompletionClient(model_team, agent_id="ag-count", model="big")
    assert client.pool is model_team and client.model == "big"
    assert client.count_tokens(MSGS) > 0 and client.remaining_tokens(MSGS) == 1024 - client.count_tokens(MSGS)
    assert model_team.model_of("ag-count") is None and model_team.fake_tier.held == 0
    with pytest.raises(ConfigError, match="pool: a client over a pool of several models cannot be dumped"):
        client.dump_component()
    both = clients_for(model_team, ["ag-a", "ag-b"], model="small")
    assert {c.model for c in both.values()} == {"small"}


# ---------------------------------------------------------------------- AgentMemMemory over a ModelPool
def _pinned(pool: MemoryPool, agent_id: str) -> bool:
    led = pool._core.agent(agent_id).ledger
    return bool(led.pinned[: len(led)].any())


async def test_memory_recalls_on_the_agents_model_and_its_facts_are_pinned_there(
        model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    memory = AgentMemMemory(model_team, agent_id="ag-mem")  # no model: whichever the agent is bound to
    await memory.add(MemoryContent(content="The customer is ACME.", mime_type=MemoryMimeType.TEXT))
    client = AgentMemChatCompletionClient(model_team, agent_id="ag-mem", model="big", max_tokens=3)
    agent = AssistantAgent("ag_mem", model_client=client, memory=[memory])
    await agent.run(task="Which customer is this about?")  # recall before the first call: binds nothing
    assert model_team.model_of("ag-mem") == "big" and model_team.fake_tier.log == calls_on("big")
    recalls = {name: p.stats()["totals"]["recalls"] for name, p in tiny_model_pools.items()}
    await agent.run(task="Which customer again?")
    assert model_team.fake_tier.log == calls_on("big", "big", "big")  # the recall's seat, then the call's
    after = {name: p.stats()["totals"]["recalls"] for name, p in tiny_model_pools.items()}
    assert (after["big"] - recalls["big"], after["small"] - recalls["small"]) == (1, 0)
    assert _pinned(tiny_model_pools["big"], "ag-mem") and where(tiny_model_pools, "ag-mem") == ["big"]
    await memory.query("customer")
    assert model_team.fake_tier.held == 0 and memory.facts == ["The customer is ACME."]


async def test_memory_on_another_model_for_a_bound_agent_raises_the_typed_error(model_team: FakeModelPool) -> None:
    await AgentMemChatCompletionClient(model_team, agent_id="ag-mem-bound", model="small", max_tokens=2).create(MSGS)
    memory = AgentMemMemory(model_team, agent_id="ag-mem-bound", model="big")
    with pytest.raises(ModelMismatchError):
        await memory.query("which colour was named")
    assert model_team.fake_tier.held == 0 and model_team.model_of("ag-mem-bound") == "small"


def test_memory_construction_checks_the_model(
        model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    with pytest.raises(UnknownModelError):
        AgentMemMemory(model_team, agent_id="x", model="huge")
    with pytest.raises(UnknownModelError):  # a pool of one holds its model only
        AgentMemMemory(FakeModelPool({"small": tiny_model_pools["small"]}), agent_id="x", model="big")
    with pytest.raises(ConfigError, match="pool: a memory over a pool of several models cannot be dumped"):
        AgentMemMemory(model_team, agent_id="x", model="big").dump_component()
    assert model_team.model_of("x") is None and model_team.fake_tier.log == []
