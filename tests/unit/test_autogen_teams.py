"""AgentChat teams over one pool on the tiny model: every agent (and the selector) keeps its own KV.

The tiny model writes noise, so these tests pin the plumbing: teams run, each
participant's calls land on its own agent id, later turns reuse kept KV, the
selector's speaker-selection calls use the selector's id, and the tool loop of an
AssistantAgent completes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_agentchat.conditions import MaxMessageTermination  # noqa: E402
from autogen_agentchat.messages import ToolCallExecutionEvent, ToolCallRequestEvent  # noqa: E402
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient, clients_for  # noqa: E402

NAMES = ["pm", "engineer", "reviewer"]


@pytest.fixture(scope="module")
def pool(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=4096, resident_agents=2, chat_format="chatml", n_threads=1) as p:
        yield p


def record(clients):
    calls = []
    for c in clients.values():
        c.on_result = lambda agent, r: calls.append((agent, r.kv, r.usage.cached_tokens))
    return calls


def team_agents(clients, **kw):
    return [AssistantAgent(n, model_client=clients[n], system_message=f"You are the {n}.", **kw) for n in NAMES]


async def test_round_robin_team_uses_one_kv_per_agent(pool):
    clients = clients_for(pool, [f"rr-{n}" for n in NAMES], max_tokens=6)
    clients = {n: clients[f"rr-{n}"] for n in NAMES}
    calls = record(clients)
    team = RoundRobinGroupChat(team_agents(clients), termination_condition=MaxMessageTermination(7))
    result = await team.run(task="plan the next release")
    assert [m.source for m in result.messages] == ["user", *NAMES, *NAMES]
    assert [a for a, _, _ in calls] == [f"rr-{n}" for n in NAMES] * 2
    # second round: each agent's earlier prompt and reply are kept (live or restored from RAM,
    # since only 2 of the 3 agents fit in the pool's sequences)
    for agent, kv, cached in calls[3:]:
        assert kv in ("reused", "restored") and cached > 0, (agent, kv, cached)


async def test_selector_calls_use_the_selectors_own_agent_id(pool, caplog):
    clients = clients_for(pool, [f"sel-{n}" for n in [*NAMES, "selector"]], max_tokens=6)
    clients["sel-selector"] = AgentMemChatCompletionClient(
        pool, agent_id="sel-selector", max_tokens=16, speaker_selection=True
    )
    calls = record(clients)
    workers = {n: clients[f"sel-{n}"] for n in NAMES}
    team = SelectorGroupChat(
        team_agents(workers),
        model_client=clients["sel-selector"],
        termination_condition=MaxMessageTermination(4),
    )
    result = await team.run(task="plan the next release")
    speakers = [m.source for m in result.messages[1:]]
    assert len(speakers) == 3 and set(speakers) <= set(NAMES)
    # speaker_selection: every answer is one of the candidates the prompt offers (never the
    # previous speaker, which AgentChat leaves out), so no selection is retried
    assert all(a != b for a, b in zip(speakers, speakers[1:])), speakers
    assert "failed to select" not in caplog.text
    selector_calls = [c for c in calls if c[0] == "sel-selector"]
    worker_calls = [c for c in calls if c[0] != "sel-selector"]
    assert len(selector_calls) == 3 and len(worker_calls) == 3
    assert [a for a, _, _ in worker_calls] == [f"sel-{s}" for s in speakers]
    # the selector prompt grows by the new messages only; its head is kept
    assert all(cached > 0 for _, _, cached in selector_calls[1:])


async def test_one_client_without_agent_id_serves_a_whole_team(pool):
    client = AgentMemChatCompletionClient(pool, max_tokens=4)
    before = set(pool.agents())
    team = RoundRobinGroupChat(team_agents({n: client for n in NAMES}), termination_condition=MaxMessageTermination(4))
    await team.run(task="go")
    new = set(pool.agents()) - before
    # one KV slot per participant, named after its AutoGen agent type ("<name>_<team id>")
    assert sorted(a.split("_")[0] for a in new) == sorted(NAMES)


def set_flag(on: bool) -> str:
    """Switch the flag."""
    return f"flag {'on' if on else 'off'}"


async def test_assistant_agent_tool_loop_with_reflection(pool):
    client = AgentMemChatCompletionClient(pool, agent_id="tool-user", max_tokens=24, force_tools=True)
    agent = AssistantAgent("helper", model_client=client, tools=[set_flag], reflect_on_tool_use=True)
    result = await agent.run(task="switch the flag on")
    kinds = [type(m) for m in result.messages]
    assert ToolCallRequestEvent in kinds and ToolCallExecutionEvent in kinds
    execution = next(m for m in result.messages if isinstance(m, ToolCallExecutionEvent))
    assert execution.content[0].is_error is False and execution.content[0].content.startswith("flag ")
    assert isinstance(result.messages[-1].content, str)


async def test_streaming_assistant_agent(pool):
    client = AgentMemChatCompletionClient(pool, agent_id="streamer", max_tokens=6)
    agent = AssistantAgent("s", model_client=client, model_client_stream=True)
    events = [e async for e in agent.run_stream(task="hello")]
    chunks = [e for e in events if type(e).__name__ == "ModelClientStreamingChunkEvent"]
    final = events[-1].messages[-1]
    assert chunks and "".join(c.content for c in chunks) == final.content
