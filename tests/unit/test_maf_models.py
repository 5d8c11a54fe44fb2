"""AgentMemChatClient over a `ModelPool` (issue #26): each call on its agent's model, held while it runs.

The model pool is `FakeModelPool` (the real bindings and leases, a counting tier) over
two pools of the tiny model.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

pytest.importorskip("agent_framework")

from agent_framework import Agent, Message  # noqa: E402

from agentmem import ConfigError, MemoryPool  # noqa: E402
from agentmem.errors import ModelMismatchError, UnknownModelError  # noqa: E402
from agentmem_maf import AgentMemChatClient  # noqa: E402
from tests.fixtures.model_pools import FakeModelPool  # noqa: E402

HI = [Message("user", ["Name a colour."])]


@pytest.fixture(scope="module")
def pools(tiny_model_path: Any) -> Iterator[dict[str, MemoryPool]]:
    out = {"small": MemoryPool(str(tiny_model_path), n_ctx=512, resident_agents=2, n_threads=1),
           "big": MemoryPool(str(tiny_model_path), n_ctx=1024, resident_agents=2, n_threads=1)}
    yield out
    for p in out.values():
        p.close()


@pytest.fixture
def team(pools: dict[str, MemoryPool]) -> FakeModelPool:
    return FakeModelPool(pools)


async def test_each_agent_runs_on_its_models_pool_and_responses_name_it(team: FakeModelPool,
                                                                         pools: dict[str, MemoryPool]) -> None:
    plan = Agent(client=AgentMemChatClient(team, model="small", max_tokens=4), name="maf-plan")
    code = Agent(client=AgentMemChatClient(team, model="big", max_tokens=4), name="maf-code")
    for _ in range(2):
        for agent in (plan, code):
            await agent.run("Name a colour.")
            assert team.fake_tier.held == 0
    assert plan.client.last_result.kv == code.client.last_result.kv == "reused"  # type: ignore[attr-defined]
    assert "maf-plan" in pools["small"].stats()["agents"] and "maf-plan" not in pools["big"].stats()["agents"]
    assert "maf-code" in pools["big"].stats()["agents"] and "maf-code" not in pools["small"].stats()["agents"]
    assert team.fake_tier.log == [("acquire", "small"), ("release", "small"), ("acquire", "big"), ("release", "big")] * 2
    response = await code.client.get_response(HI)  # type: ignore[attr-defined]
    assert response.model == "big" and code.client.model_name == "big"  # type: ignore[attr-defined]


async def test_a_stream_holds_its_model_until_it_ends_or_is_left(team: FakeModelPool) -> None:
    client = AgentMemChatClient(team, agent_id="maf-stream", model="big", max_tokens=12)
    stream = client.get_response(HI, stream=True)
    held = [team.fake_tier.uses["big"] async for _ in stream]
    assert set(held) == {1} and team.fake_tier.held == 0
    assert (await stream.get_final_response()).model == "big"
    async with client.get_response(HI, stream=True) as stream:  # MAF's way to leave early
        async for _ in stream:
            assert team.fake_tier.uses["big"] == 1
            break
    for _ in range(200):  # MAF closes its stream's generator on exit
        if not team.fake_tier.held:
            break
        await asyncio.sleep(0.01)
    assert team.fake_tier.held == 0


async def test_another_model_for_a_bound_agent_raises_the_typed_error(team: FakeModelPool) -> None:
    await AgentMemChatClient(team, agent_id="maf-bound", model="small", max_tokens=2).get_response(HI)
    wrong = AgentMemChatClient(team, agent_id="maf-bound", model="big", max_tokens=2)
    with pytest.raises(ModelMismatchError):
        await wrong.get_response(HI)
    assert team.fake_tier.held == 0


def test_construction_checks_the_model(team: FakeModelPool, pools: dict[str, MemoryPool]) -> None:
    with pytest.raises(UnknownModelError):
        AgentMemChatClient(team, model="huge")
    with pytest.raises(ConfigError, match="names a model of a ModelPool"):
        AgentMemChatClient(pools["small"], model="small")
    client = AgentMemChatClient(team, agent_id="maf-new")
    assert client.pool is team and client.model_name == "small"  # the default, nothing bound
    assert team.model_of("maf-new") is None
