"""AgentMemChatClient and AgentMemContextProvider over a `ModelPool` (issue #26): each on its agent's model.

Each call is held on its agent's model while it runs; the provider's recall runs on that
model too, under its own seat (binding nothing), and the client pins its facts there.

The model pool is `FakeModelPool` (the real bindings and leases, a counting tier) over
two pools of the tiny model.
"""

from __future__ import annotations


import pytest

pytest.importorskip("agent_framework")

from agent_framework import Agent, Message  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.errors import ModelMismatchError, UnknownModelError  # noqa: E402
from agentmem_maf import AgentMemChatClient, AgentMemContextProvider  # noqa: E402
from tests.fixtures.model_pools import FakeModelPool, calls_on, released, where  # noqa: E402

HI = [Message("user", ["Name a colour."])]


async def test_each_agent_runs_on_its_models_pool_and_responses_name_it(
        model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    plan = Agent(client=AgentMemChatClient(model_team, model="small", max_tokens=4), name="maf-plan")
    code = Agent(client=AgentMemChatClient(model_team, model="big", max_tokens=4), name="maf-code")
    for _ in range(2):
        for agent in (plan, code):
            await agent.run("Name a colour.")
            assert model_team.fake_tier.held == 0
    assert plan.client.last_result.kv == code.client.last_result.kv == "reused"  # type: ignore[attr-defined]
    assert where(tiny_model_pools, "maf-plan") == ["small"]
    assert where(tiny_model_pools, "maf-code") == ["big"]
    assert model_team.fake_tier.log == calls_on("small", "big", "small", "big")
    response = await code.client.get_response(HI)  # type: ignore[attr-defined]
    assert response.model == "big" and code.client.model_name == "big"  # type: ignore[attr-defined]


async def test_a_stream_holds_its_model_until_it_ends_or_is_left(model_team: FakeModelPool) -> None:
    client = AgentMemChatClient(model_team, agent_id="maf-stream", model="big", max_tokens=12)
    stream = client.get_response(HI, stream=True)
    held = [model_team.fake_tier.uses["big"] async for _ in stream]
    assert set(held) == {1} and model_team.fake_tier.held == 0
    assert (await stream.get_final_response()).model == "big"
    async with client.get_response(HI, stream=True) as stream:  # MAF's way to leave early
        async for _ in stream:
            assert model_team.fake_tier.uses["big"] == 1
            break
    assert await released(model_team)


async def test_another_model_for_a_bound_agent_raises_the_typed_error(model_team: FakeModelPool) -> None:
    await AgentMemChatClient(model_team, agent_id="maf-bound", model="small", max_tokens=2).get_response(HI)
    wrong = AgentMemChatClient(model_team, agent_id="maf-bound", model="big", max_tokens=2)
    with pytest.raises(ModelMismatchError):
        await wrong.get_response(HI)
    assert model_team.fake_tier.held == 0


def test_construction_checks_the_model(model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    with pytest.raises(UnknownModelError):
        AgentMemChatClient(model_team, model="huge")
    with pytest.raises(UnknownModelError):  # a pool of one holds its model only
        AgentMemChatClient(FakeModelPool({"small": tiny_model_pools["small"]}), model="big")
    client = AgentMemChatClient(model_team, agent_id="maf-new")
    assert client.pool is model_team and client.model_name == "small"  # the default, nothing bound
    assert model_team.model_of("maf-new") is None


# ---------------------------------------------------------------------- AgentMemContextProvider over a ModelPool
def _pinned(pool: MemoryPool, agent_id: str) -> bool:
    led = pool._core.agent(agent_id).ledger
    return bool(led.pinned[: len(led)].any())


async def test_the_provider_recalls_on_the_agents_model_and_its_facts_are_pinned_there(
        model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    memory = AgentMemContextProvider(model_team, facts=["The customer is ACME."])  # whichever model it is bound to
    agent = Agent(client=AgentMemChatClient(model_team, model="big", max_tokens=3), name="maf-mem",
                  context_providers=[memory])
    session = agent.create_session()
    await agent.run("Which customer is this about?", session=session)  # recall before the first call: binds nothing
    assert model_team.model_of("maf-mem") == "big" and model_team.fake_tier.log == calls_on("big")
    recalls = {name: p.stats()["totals"]["recalls"] for name, p in tiny_model_pools.items()}
    await agent.run("Which customer again?", session=session)
    assert model_team.fake_tier.log == calls_on("big", "big", "big")  # the recall's seat, then the call's
    after = {name: p.stats()["totals"]["recalls"] for name, p in tiny_model_pools.items()}
    assert (after["big"] - recalls["big"], after["small"] - recalls["small"]) == (1, 0)
    assert _pinned(tiny_model_pools["big"], "maf-mem") and where(tiny_model_pools, "maf-mem") == ["big"]
    assert await memory.recall("maf-mem", "customer") == [] and model_team.fake_tier.held == 0


async def test_the_provider_on_another_model_for_a_bound_agent_raises_the_typed_error(
        model_team: FakeModelPool) -> None:
    await AgentMemChatClient(model_team, agent_id="maf-mem-bound", model="small", max_tokens=2).get_response(HI)
    memory = AgentMemContextProvider(model_team, agent_id="maf-mem-bound", model="big")
    with pytest.raises(ModelMismatchError):
        await memory.recall("maf-mem-bound", "which colour was named")
    assert model_team.fake_tier.held == 0 and model_team.model_of("maf-mem-bound") == "small"


def test_the_provider_checks_the_model(model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    with pytest.raises(UnknownModelError):
        AgentMemContextProvider(model_team, model="huge")
    with pytest.raises(UnknownModelError):  # a pool of one holds its model only
        AgentMemContextProvider(FakeModelPool({"small": tiny_model_pools["small"]}), model="big")
    assert AgentMemContextProvider(model_team, model="big").pool is model_team and model_team.fake_tier.log == []
