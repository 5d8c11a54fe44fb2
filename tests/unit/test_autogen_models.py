"""AgentMemChatCompletionClient over a `ModelPool` (issue #26): each call on its agent's model, held while it runs.

The model pool is `FakeModelPool` (the real bindings and leases, a counting tier) over
two pools of the tiny model.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("autogen_core")

from autogen_core import CancellationToken  # noqa: E402
from autogen_core.models import CreateResult, UserMessage  # noqa: E402

from agentmem import ConfigError, MemoryPool  # noqa: E402
from agentmem.errors import ModelMismatchError, UnknownModelError  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient, clients_for  # noqa: E402
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
    with pytest.raises(ConfigError, match="names a model of a ModelPool"):
        AgentMemChatCompletionClient(tiny_model_pools["small"], agent_id="x", model="small")
    client = AgentMemChatCompletionClient(model_team, agent_id="ag-count", model="big")
    assert client.pool is model_team and client.model == "big"
    assert client.count_tokens(MSGS) > 0 and client.remaining_tokens(MSGS) == 1024 - client.count_tokens(MSGS)
    assert model_team.model_of("ag-count") is None and model_team.fake_tier.held == 0
    with pytest.raises(ConfigError, match="pool: a client over a ModelPool cannot be dumped"):
        client.dump_component()
    both = clients_for(model_team, ["ag-a", "ag-b"], model="small")
    assert {c.model for c in both.values()} == {"small"}
