"""AgentMemChatCompletionClient over a `ModelPool` (issue #26): each call on its agent's model, held while it runs.

The model pool is `FakeModelPool` (the real bindings and leases, a counting tier) over
two pools of the tiny model.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

pytest.importorskip("autogen_core")

from autogen_core import CancellationToken  # noqa: E402
from autogen_core.models import CreateResult, UserMessage  # noqa: E402

from agentmem import ConfigError, MemoryPool  # noqa: E402
from agentmem.errors import ModelMismatchError, UnknownModelError  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient, clients_for  # noqa: E402
from tests.fixtures.model_pools import FakeModelPool  # noqa: E402

MSGS = [UserMessage(content="Name a colour.", source="user")]


@pytest.fixture(scope="module")
def pools(tiny_model_path: Any) -> Iterator[dict[str, MemoryPool]]:
    out = {"small": MemoryPool(str(tiny_model_path), n_ctx=512, resident_agents=2, chat_format="chatml", n_threads=1),
           "big": MemoryPool(str(tiny_model_path), n_ctx=1024, resident_agents=2, chat_format="chatml", n_threads=1)}
    yield out
    for p in out.values():
        p.close()


@pytest.fixture
def team(pools: dict[str, MemoryPool]) -> FakeModelPool:
    return FakeModelPool(pools)


async def test_each_client_runs_on_its_agents_model_and_keeps_its_kv(team: FakeModelPool, pools: dict[str, MemoryPool]) -> None:
    clients = {"ag-plan": AgentMemChatCompletionClient(team, agent_id="ag-plan", model="small", max_tokens=4),
               "ag-code": AgentMemChatCompletionClient(team, agent_id="ag-code", model="big", max_tokens=4)}
    for _ in range(2):
        for c in clients.values():
            r = await c.create(MSGS)
            assert isinstance(r, CreateResult) and team.fake_tier.held == 0
    assert all(c.last_result is not None and c.last_result.kv == "reused" for c in clients.values())
    assert "ag-plan" in pools["small"].stats()["agents"] and "ag-plan" not in pools["big"].stats()["agents"]
    assert "ag-code" in pools["big"].stats()["agents"] and "ag-code" not in pools["small"].stats()["agents"]
    assert team.fake_tier.log == [("acquire", "small"), ("release", "small"), ("acquire", "big"), ("release", "big")] * 2


async def test_a_stream_holds_its_model_until_it_ends_is_closed_or_cancelled(team: FakeModelPool) -> None:
    client = AgentMemChatCompletionClient(team, agent_id="ag-stream", model="big", max_tokens=12)
    held = [team.fake_tier.uses["big"] async for _ in client.create_stream(MSGS)]
    assert set(held) == {1} and team.fake_tier.held == 0
    stream = client.create_stream(MSGS)
    await stream.__anext__()
    assert team.fake_tier.uses["big"] == 1
    await stream.aclose()  # left early: the generation stops, then the hold ends
    assert team.fake_tier.held == 0
    token = CancellationToken()
    with pytest.raises(asyncio.CancelledError):
        async for _ in client.create_stream(MSGS, extra_create_args={"max_tokens": 200}, cancellation_token=token):
            token.cancel()
    assert team.fake_tier.held == 0


async def test_another_model_for_a_bound_agent_raises_the_typed_error(team: FakeModelPool) -> None:
    await AgentMemChatCompletionClient(team, agent_id="ag-bound", model="small", max_tokens=2).create(MSGS)
    wrong = AgentMemChatCompletionClient(team, agent_id="ag-bound", model="big", max_tokens=2)
    with pytest.raises(ModelMismatchError):
        await wrong.create(MSGS)
    with pytest.raises(ModelMismatchError):
        _ = [x async for x in wrong.create_stream(MSGS)]
    assert team.fake_tier.held == 0


def test_construction_checks_the_model_and_counting_binds_nothing(team: FakeModelPool, pools: dict[str, MemoryPool]) -> None:
    with pytest.raises(UnknownModelError):
        AgentMemChatCompletionClient(team, agent_id="x", model="huge")
    with pytest.raises(ConfigError, match="names a model of a ModelPool"):
        AgentMemChatCompletionClient(pools["small"], agent_id="x", model="small")
    client = AgentMemChatCompletionClient(team, agent_id="ag-count", model="big")
    assert client.pool is team and client.model == "big"
    assert client.count_tokens(MSGS) > 0 and client.remaining_tokens(MSGS) == 1024 - client.count_tokens(MSGS)
    assert team.model_of("ag-count") is None and team.fake_tier.held == 0
    with pytest.raises(ConfigError, match="pool: a client over a ModelPool cannot be dumped"):
        client.dump_component()
    both = clients_for(team, ["ag-a", "ag-b"], model="small")
    assert {c.model for c in both.values()} == {"small"}
