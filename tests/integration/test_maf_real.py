"""agentmem_maf on the real instruct model: a two-agent MAF workflow with a tool round trip, KV kept across turns, streaming, structured output.

Qwen2.5-Coder-0.5B-Instruct only (`instruct_model_path`): the tool round trip needs a
model that calls tools in its template's syntax. Greedy decoding, so a run is repeatable.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("agent_framework")

from agent_framework import Agent, Message, WorkflowBuilder, tool  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from agentmem import ChatResult, MemoryPool  # noqa: E402
from agentmem_maf import AgentMemChatClient, AgentMemContextProvider, clients_for  # noqa: E402

pytestmark = pytest.mark.integration

WEIGHED: list[int] = []


@tool
def order_weight(order_id: int) -> str:
    """The weight of an order, by its number."""
    WEIGHED.append(order_id)
    return f"Order {order_id} weighs {order_id * 1.5:.1f} kg."


class Colour(BaseModel):
    name: str
    warm: bool


@pytest.fixture(scope="module")
def pool(instruct_model_path):
    # one thread: immune to the thread-barrier stalls a busy shared CPU causes
    with MemoryPool(instruct_model_path, n_ctx=4096, resident_agents=2, n_threads=1) as p:
        yield p


def _record(clients: dict[str, AgentMemChatClient]) -> list[tuple[str, ChatResult]]:
    seen: list[tuple[str, ChatResult]] = []
    for c in clients.values():
        c.on_result = lambda agent, r: seen.append((agent, r))
    return seen


def test_a_two_agent_workflow_runs_a_tool_and_its_next_turn_reads_the_kept_kv(pool):
    clients = clients_for(pool, ["clerk", "writer"], max_tokens=48,
                          function_invocation_configuration={"max_function_calls": 1})
    seen = _record(clients)
    clerk = Agent(client=clients["clerk"], name="clerk", tools=[order_weight],
                  instructions="You look order weights up with the order_weight tool, then state the weight.")
    writer = Agent(client=clients["writer"], name="writer",
                   instructions="You write the customer one short, friendly sentence about their order.")
    workflow = WorkflowBuilder(start_executor=clerk).add_edge(clerk, writer).build()
    WEIGHED.clear()

    first = asyncio.run(workflow.run("What does order 17 weigh?"))
    outputs = [o.text for o in first.get_outputs()]
    assert WEIGHED == [17], f"the clerk's tool ran once, for order 17: {WEIGHED=}, {outputs=}"
    assert len(outputs) == 2 and all(outputs), outputs
    # the writer read the clerk's tool result (another agent's call and result, as the clerk's words)
    assert "25.5" in outputs[1], outputs
    clerk_calls = [r for a, r in seen if a == "clerk"]
    assert len(clerk_calls) >= 2, "a call, then the answer to its result"
    after_tool = clerk_calls[1]
    assert after_tool.usage.cached_tokens >= clerk_calls[0].usage.prompt_tokens, (
        "the answer after the tool result reused the whole call's KV", after_tool.usage, clerk_calls[0].usage)

    n_before = len(seen)
    second = asyncio.run(workflow.run("And order 18?"))
    assert [o.text for o in second.get_outputs()] and 18 in WEIGHED
    clerk_next = next(r for a, r in seen[n_before:] if a == "clerk")
    # the clerk's whole first turn came from kept KV (live, or restored after the writer's turn)
    assert clerk_next.kv in ("reused", "restored"), clerk_next.kv
    assert clerk_next.usage.cached_tokens >= after_tool.usage.prompt_tokens, (clerk_next.usage, after_tool.usage)
    totals = pool.stats()["totals"]
    assert totals["cached_tokens"] > totals["prefill_tokens"] / 2, totals


def test_streaming_yields_text_updates_and_usage(pool):
    client = AgentMemChatClient(pool, agent_id="streamer", max_tokens=24)
    agent = Agent(client=client, name="streamer", instructions="Answer in a few words.")

    async def go() -> tuple[list[str], Any]:
        stream = agent.run("Name three primary colours.", stream=True)
        pieces = [u.text async for u in stream]
        return pieces, await stream.get_final_response()

    pieces, final = asyncio.run(go())
    assert len([p for p in pieces if p]) > 1, pieces
    assert final.text == "".join(pieces) and final.text.strip()
    assert final.usage_details["input_token_count"] > 0 and final.usage_details["output_token_count"] > 0


def test_structured_output_is_a_parsed_model(pool):
    client = AgentMemChatClient(pool, agent_id="judge", max_tokens=48)
    r = asyncio.run(client.get_response([Message("user", ["Describe the colour orange."])],
                                        options={"response_format": Colour}))
    assert isinstance(r.value, Colour) and r.value.name, r.text


def test_pinned_facts_reach_the_model(pool):
    memory = AgentMemContextProvider(pool, facts=["The customer's name is Ada Lovelace."], k=0)
    agent = Agent(client=AgentMemChatClient(pool, max_tokens=24), name="concierge", context_providers=[memory],
                  instructions="You are a concierge. Answer in one short sentence.")
    r = asyncio.run(agent.run("What is the customer's name?", session=agent.create_session()))
    assert "Ada" in r.text, r.text
    # the system message holding the facts is pinned: pinning it again reports its tokens
    assert pool.pin("concierge", 0) > 0
