"""LangChain's `ChatOpenAI` in its default set-up (only `base_url`, `api_key`) against `agentmem serve`.

No agent id and no header: the server finds each conversation's kept KV from its history
(`--anonymous lines`). A tool round trip where the model calls the tool, the `ToolMessage`
back, and the second turn's `usage_metadata["input_token_details"]["cache_read"]` covers
the first turn's whole prompt; then `langchain.agents.create_agent` on the same model.
`max_tokens` only bounds the time on the 0.5B model; it names nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

pytest.importorskip("langchain_openai")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

from tests.integration.clients.conftest import Served  # noqa: E402

pytestmark = pytest.mark.integration

logger = logging.getLogger(__name__)


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"sunny, 21 C in {city}"


def _cache_read(msg: Any) -> int:
    """`usage_metadata["input_token_details"]["cache_read"]` of an `AIMessage` (0 when absent)."""
    usage = msg.usage_metadata or {}
    return int((usage.get("input_token_details") or {}).get("cache_read", 0))


def test_chatopenai_tool_round_trip_reads_kept_kv(served: Served) -> None:
    """The tool call parses into `tool_calls`; turn 2 reads turn 1's whole prompt from kept KV."""
    llm = ChatOpenAI(base_url=served.v1, api_key="x", model=served.model, max_tokens=48)
    msgs: list[Any] = [SystemMessage("You are LangChain's weather helper. After a tool answers, reply in one sentence."),
                       HumanMessage("What is the weather in Lisbon?")]
    t0 = time.monotonic()
    call = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(msgs)
    t1 = time.monotonic()
    assert isinstance(call, AIMessage) and call.tool_calls, call
    assert call.tool_calls[0]["name"] == "get_weather" and "city" in call.tool_calls[0]["args"], call.tool_calls
    result = get_weather.invoke(call.tool_calls[0])
    assert isinstance(result, ToolMessage) and result.tool_call_id == call.tool_calls[0]["id"]
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke(msgs + [call, result])
    t2 = time.monotonic()
    first_prompt = call.usage_metadata["input_tokens"]
    cached = _cache_read(answer)
    logger.info("ChatOpenAI: call %s in %.1f s (prompt %d); answer %r in %.1f s (prompt %d, cache_read %d); agentmem %s",
                call.tool_calls[0], t1 - t0, first_prompt, answer.content, t2 - t1,
                answer.usage_metadata["input_tokens"], cached, answer.response_metadata.get("agentmem"))
    assert answer.content, answer
    assert cached >= first_prompt, f"{cached=} < {first_prompt=}"


def test_create_agent_with_chatopenai_reads_kept_kv(served: Served) -> None:
    """`create_agent(ChatOpenAI(...), tools=[get_weather])`: the model call after the tool reads kept KV.

    `tool_choice` is the agent's (`auto`): the model chooses to call the tool.
    """
    create_agent = pytest.importorskip("langchain.agents").create_agent
    llm = ChatOpenAI(base_url=served.v1, api_key="x", model=served.model, max_tokens=48)
    agent = create_agent(llm, tools=[get_weather],
                         system_prompt="You are create_agent's weather helper. Use get_weather for weather questions; "
                                       "after it answers, reply in one sentence.")
    t0 = time.monotonic()
    messages: list[Any] = []
    # Two model calls (the tool call, then the call after the tool result); the 0.5B model may
    # go on calling the tool until the recursion limit, so stop there.
    for state in agent.stream({"messages": [{"role": "user", "content": "What is the weather in Oslo?"}]},
                              stream_mode="values"):
        messages = state["messages"]
        if sum(isinstance(m, AIMessage) for m in messages) >= 2:
            break
    elapsed = time.monotonic() - t0
    out = {"messages": messages}
    ais = [m for m in out["messages"] if isinstance(m, AIMessage)]
    tools = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    logger.info("create_agent: %.1f s, %s", elapsed,
                [(type(m).__name__, m.content[:60] if isinstance(m.content, str) else m.content,
                  getattr(m, "tool_calls", None), m.usage_metadata if isinstance(m, AIMessage) else None)
                 for m in out["messages"]])
    assert ais[0].tool_calls and ais[0].tool_calls[0]["name"] == "get_weather", ais[0]
    assert tools and "sunny" in str(tools[0].content), out["messages"]
    assert len(ais) >= 2, out["messages"]
    first_prompt = ais[0].usage_metadata["input_tokens"]
    assert _cache_read(ais[1]) >= first_prompt, (ais[1].usage_metadata, first_prompt)
