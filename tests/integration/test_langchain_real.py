"""ChatAgentMem on the real bundled models: what the KV memory buys through LangChain.

Complements the standard suite (test_langchain_standard.py) with the things only
agentmem does: an agent switch restores instead of re-prefilling, a tool call the
model emitted is matched by the next prompt's KV, and ``cache_read`` says so.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem_langchain import ChatAgentMem  # noqa: E402

pytestmark = pytest.mark.integration

SYSTEM = "You are a helpful assistant in a team of agents. Answer briefly. " * 6


@pytest.fixture(scope="module")
def pool(default_model_path: Any) -> Any:
    # resident_agents=1: every switch between two agents parks one and restores the other.
    p = MemoryPool(str(default_model_path), n_ctx=4096, resident_agents=1, n_threads=1)
    yield p
    p.close()


@tool
def lookup(city: str) -> str:
    """Look up facts about a city."""
    return f"{city} is a city."


def test_agent_switch_restores_instead_of_prefilling(pool: MemoryPool) -> None:
    a = ChatAgentMem(pool=pool, agent_id="switch-a", max_tokens=8)
    b = ChatAgentMem(pool=pool, agent_id="switch-b", max_tokens=8)
    ha: list[Any] = [SystemMessage(SYSTEM), HumanMessage("Name a fruit.")]
    hb: list[Any] = [SystemMessage(SYSTEM), HumanMessage("Name a colour.")]
    ha.append(a.invoke(ha))
    hb.append(b.invoke(hb))  # parks a
    ha.append(HumanMessage("Another one."))
    second = a.invoke(ha)  # restores a
    meta, usage = second.response_metadata, second.usage_metadata
    assert meta["kv"] == "restored", meta
    assert usage is not None
    cached = usage["input_token_details"]["cache_read"]
    assert cached >= usage["input_tokens"] - 16, usage  # only the new user turn (and turn glue) is decoded
    assert meta["timings"]["prefill_s"] < meta["timings"]["total_s"]


def test_forced_tool_call_is_reused_by_the_next_prompt(pool: MemoryPool) -> None:
    model = ChatAgentMem(pool=pool, agent_id="tools", max_tokens=32).bind_tools([lookup], tool_choice="lookup")
    history: list[Any] = [SystemMessage(SYSTEM), HumanMessage("Tell me about Paris.")]
    call = model.invoke(history)
    assert [c["name"] for c in call.tool_calls] == ["lookup"], call
    assert isinstance(call.tool_calls[0]["args"].get("city"), str)
    first_total = call.usage_metadata["total_tokens"]  # type: ignore[index]
    history += [call, ToolMessage(lookup.invoke(call.tool_calls[0]["args"]), tool_call_id=call.tool_calls[0]["id"], name="lookup")]
    answer = model.invoke(history, tool_choice="none")
    cached = answer.usage_metadata["input_token_details"]["cache_read"]  # type: ignore[index]
    # The call's JSON was emitted in the canonical form agentmem renders, so the
    # KV kept from the first call (prompt + call) matches the new prompt, bar the
    # last token or two of the call (re-tokenized at the turn end).
    assert cached >= first_total - 3, (cached, first_total)


async def test_async_stream_reports_restore_and_usage(pool: MemoryPool) -> None:
    a = ChatAgentMem(pool=pool, agent_id="astream-a", max_tokens=8)
    b = ChatAgentMem(pool=pool, agent_id="astream-b", max_tokens=8)
    history: list[Any] = [SystemMessage(SYSTEM), HumanMessage("Count to three.")]
    history.append(await a.ainvoke(history))
    await b.ainvoke([HumanMessage("Hello")])
    history.append(HumanMessage("Again."))
    chunks = [c async for c in a.astream(history)]
    last = chunks[-1]
    assert last.chunk_position == "last" and last.usage_metadata is not None
    assert last.response_metadata["kv"] == "restored"
    assert last.usage_metadata["input_token_details"]["cache_read"] > 0
