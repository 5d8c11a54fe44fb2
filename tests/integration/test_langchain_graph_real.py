"""ChatAgentMem in a real LangGraph graph on the bundled instruct model: ids, counts, hints.

One model object is shared by two nodes; each lands on its own agent, the graph's
hints reach the pool, a tool-calling node is held through its tool, and the token
count LangChain asks for is the prompt the call then reports.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem_langchain import ChatAgentMem  # noqa: E402

pytestmark = pytest.mark.integration


@tool
def lookup(city: str) -> str:
    """Facts about a city."""
    return f"{city} has a river and an old bridge."


class State(TypedDict):
    messages: Annotated[list[BaseMessage], operator.add]


def test_graph_nodes_are_agents_with_hints_and_exact_counts(instruct_model_path: Any) -> None:
    with MemoryPool(str(instruct_model_path), n_ctx=4096, resident_agents=1, n_threads=1) as pool:
        model = ChatAgentMem(pool=pool, max_tokens=12)
        force = {"type": "function", "function": {"name": "lookup"}}

        def researcher(s: State) -> dict[str, Any]:
            msgs = [SystemMessage("You research cities."), *s["messages"]]
            if isinstance(s["messages"][-1], ToolMessage):
                return {"messages": [AIMessage(model.bind_tools([lookup], tool_choice="none").invoke(msgs).text)]}
            call = model.bind_tools([lookup], tool_choice=force).invoke(msgs)
            result = lookup.invoke(call.tool_calls[0]["args"])
            return {"messages": [call, ToolMessage(result, tool_call_id=call.tool_calls[0]["id"], name="lookup")]}

        def writer(s: State) -> dict[str, Any]:
            msgs = [SystemMessage("You write one sentence."), *s["messages"]]
            counted = model.get_num_tokens_from_messages(msgs)
            ai = model.invoke(msgs)
            assert ai.usage_metadata["input_tokens"] == counted
            return {"messages": [AIMessage(ai.text)]}

        g = StateGraph(State)
        g.add_node("researcher", researcher)
        g.add_node("writer", writer)
        g.add_edge(START, "researcher")
        g.add_conditional_edges("researcher", lambda s: "researcher" if s["messages"][-1].type == "tool" else "writer",
                                ["researcher", "writer"])
        g.add_edge("writer", END)
        app = g.compile(checkpointer=InMemorySaver())
        model.follow(app)
        cfg = {"configurable": {"thread_id": "real"}}
        app.invoke({"messages": [HumanMessage("Tell me about Prague.")]}, cfg)
        app.invoke({"messages": [HumanMessage("And Lyon?")]}, cfg)
        stats = pool.stats()
        assert {"real/researcher", "real/writer"} <= set(stats["agents"])
        hints = stats["hints"]
        assert hints["holds"] >= 2 and hints["expected"] >= 1, hints
        # round 2: each agent continued its own KV (one live sequence: restored, not re-read)
        assert stats["agents"]["real/writer"]["calls"] == 2
        assert stats["totals"]["cached_tokens"] > 0
        assert model.profile is not None and model.profile["max_input_tokens"] == pool.capacity
