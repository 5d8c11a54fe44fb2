"""ChatAgentMem / AgentMemLLM over a `ModelPool` (issue #26): each call on its agent's model, held while it runs.

The model pool is `FakeModelPool` (the real bindings and leases, a counting tier) over
two pools of the tiny model; the real two-model run is
`tests/integration/test_langchain_models_real.py`.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import HumanMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402


from agentmem import MemoryPool  # noqa: E402
from agentmem.errors import ModelMismatchError, UnknownModelError  # noqa: E402
from agentmem_langchain import AgentMemLLM, ChatAgentMem  # noqa: E402
from tests.fixtures.model_pools import FakeModelPool, calls_on, released, wait_released, where  # noqa: E402


def test_each_agent_runs_on_its_models_pool_and_keeps_its_kv(
        model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    planner = ChatAgentMem(pool=model_team, agent_id="lc-plan", model="small", max_tokens=6)
    coder = ChatAgentMem(pool=model_team, agent_id="lc-code", model="big", max_tokens=6)
    model_team.fake_tier.log.clear()  # each profile read its loaded model's capacity under a lease
    first = [planner.invoke("Plan a page."), coder.invoke("Write a function.")]
    again = [planner.invoke("Plan a page. Then?"), coder.invoke("Write a function. Then?")]
    assert [m.response_metadata["model_name"] for m in first + again] == ["small", "big", "small", "big"]
    assert [m.response_metadata["kv"] for m in first] == ["prefilled", "prefilled"]
    assert [m.response_metadata["kv"] for m in again] == ["reused", "reused"]
    assert all(m.usage_metadata["input_token_details"]["cache_read"] > 0 for m in again)  # type: ignore[index]
    assert where(tiny_model_pools, "lc-plan") == ["small"]
    assert where(tiny_model_pools, "lc-code") == ["big"]
    assert model_team.fake_tier.log == calls_on("small", "big", "small", "big")


def test_a_new_agent_without_a_model_is_bound_to_the_default(model_team: FakeModelPool) -> None:
    chat = ChatAgentMem(pool=model_team, max_tokens=2)
    chat.invoke("hi", agent_id="lc-per-call")
    chat.with_config(configurable={"agent_id": "lc-configured"}).invoke("hi")
    assert model_team.model_of("lc-per-call") == model_team.model_of("lc-configured") == "small"
    assert chat.resolved_model_name() == "small" and model_team.fake_tier.held == 0


def test_a_stream_holds_its_model_until_it_ends_or_is_closed(model_team: FakeModelPool) -> None:
    coder = ChatAgentMem(pool=model_team, agent_id="lc-stream", model="big", max_tokens=8)
    seen = []
    for chunk in coder.stream("Count to five."):
        seen.append(model_team.fake_tier.uses["big"])
    assert set(seen) == {1} and model_team.fake_tier.held == 0
    assert chunk.response_metadata["model_name"] == "big"
    it = coder.stream("Count to six.")
    next(it)
    assert model_team.fake_tier.uses["big"] == 1
    it.close()  # left early: the pool stream is closed, then the model's hold ends
    assert model_team.fake_tier.held == 0


async def test_async_calls_and_an_async_stream_closed_early_release_the_model(model_team: FakeModelPool) -> None:
    coder = ChatAgentMem(pool=model_team, agent_id="lc-async", model="big", max_tokens=8)
    msg = await coder.ainvoke("Count to five.")
    assert msg.response_metadata["model_name"] == "big" and model_team.fake_tier.held == 0
    stream = coder.astream("Count to six.")
    await stream.__anext__()
    assert model_team.fake_tier.uses["big"] == 1
    await stream.aclose()  # LangChain's astream leaves its inner stream to the loop's finalizer: a tick later
    assert await released(model_team)


def test_another_model_for_a_bound_agent_raises_the_typed_error(model_team: FakeModelPool) -> None:
    ChatAgentMem(pool=model_team, agent_id="lc-bound", model="small", max_tokens=2).invoke("hi")
    wrong = ChatAgentMem(pool=model_team, agent_id="lc-bound", model="big", max_tokens=2)
    with pytest.raises(ModelMismatchError) as info:
        wrong.invoke("hi")
    assert (info.value.bound, info.value.asked) == ("small", "big")
    with pytest.raises(ModelMismatchError):
        list(wrong.stream("hi"))
    assert model_team.fake_tier.held == 0


def test_model_is_checked_at_construction(model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    with pytest.raises(UnknownModelError):
        ChatAgentMem(pool=model_team, model="huge")
    with pytest.raises(UnknownModelError):  # a pool of one holds its model only
        ChatAgentMem(pool=FakeModelPool({"small": tiny_model_pools["small"]}), model="big")


def test_profile_and_token_counts_use_the_agents_model(model_team: FakeModelPool) -> None:
    big = ChatAgentMem(pool=model_team, agent_id="lc-profile", model="big")
    assert big.profile is not None and big.profile["max_input_tokens"] == 1024  # from its config: nothing held
    default = ChatAgentMem(pool=model_team, agent_id="lc-profile-2")
    assert default.profile is not None and default.profile["max_input_tokens"] == 512
    assert big.get_num_tokens_from_messages([HumanMessage("hello")]) > 0 and big.get_num_tokens("hello") > 0
    assert model_team.model_of("lc-profile") is None and model_team.fake_tier.held == 0  # counting binds nothing


def test_the_llm_runs_on_its_agents_model_too(
        model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool]) -> None:
    llm = AgentMemLLM(pool=model_team, agent_id="lc-llm", model="big", max_tokens=4)
    res = llm.generate(["Once upon a time"])
    assert res.generations[0][0].generation_info["model_name"] == "big"  # type: ignore[index]
    pieces = list(llm.stream("Once upon a time there"))
    assert pieces and where(tiny_model_pools, "lc-llm") == ["big"]
    assert wait_released(model_team)


def test_a_tool_call_reply_holds_the_agent_on_its_models_pool(
        model_team: FakeModelPool, tiny_model_pools: dict[str, MemoryPool], monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[tuple[str, str, Any]] = []
    for name, pool in tiny_model_pools.items():
        monkeypatch.setattr(pool, "hold", lambda agent_id, ttl_s=None, name=name: held.append((name, agent_id, ttl_s)))

    @tool
    def ping() -> str:
        """Check the connection."""
        return "pong"

    coder = ChatAgentMem(pool=model_team, agent_id="lc-hold", model="big", max_tokens=24)
    assert coder.bind_tools([ping], tool_choice="ping").invoke("Ping.").tool_calls
    assert held == [("big", "lc-hold", None)] and model_team.fake_tier.held == 0
