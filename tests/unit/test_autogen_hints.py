"""AutoGen teams feeding the pool's hints (tiny model, AgentChat's own teams and agents).

What is pinned: a `RoundRobinGroupChat` under `follow` expects its whole turn order
from each selected speaker on; a `SelectorGroupChat`'s `speaker_selection` client
expects its candidates (mapped to the clients' agent ids) and then its answer, with no
app code; a reply that is a tool call holds its agent until the reflection call.
"""

from __future__ import annotations

import pytest

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_agentchat.conditions import MaxMessageTermination  # noqa: E402
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient, clients_for, follow  # noqa: E402

NAMES = ["pm", "engineer", "reviewer"]


@pytest.fixture
def pool(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=4096, resident_agents=2, chat_format="chatml", n_threads=1) as p:
        yield p


def spy(pool: MemoryPool) -> list[tuple[str, list[str]]]:
    """Record every `expect` (and the calls between them) without changing what they do."""
    log: list[tuple[str, list[str]]] = []
    expect = pool.expect
    pool.expect = lambda ids, soon=True, scope=None: (log.append(("expect", list(ids))), expect(ids, soon=soon, scope=scope))[1]  # type: ignore[method-assign]
    return log


def agents(clients, **kw):
    return [AssistantAgent(n, model_client=clients[n], system_message=f"You are the {n}.", **kw) for n in NAMES]


async def test_follow_round_robin_expects_the_turn_order_from_each_speaker(pool):
    clients = clients_for(pool, [f"rr-{n}" for n in NAMES], max_tokens=4)
    log = spy(pool)
    for c in clients.values():
        c.on_result = lambda agent, r: log.append(("call", [agent]))
    team = follow(RoundRobinGroupChat(agents({n: clients[f"rr-{n}"] for n in NAMES}),
                                      termination_condition=MaxMessageTermination(7)))
    await team.run(task="plan the release")
    ids = [f"rr-{n}" for n in NAMES]
    calls = [i for i, (kind, _) in enumerate(log) if kind == "call"]
    assert [log[i][1][0] for i in calls] == ids * 2
    for i in calls:
        kind, order = log[i - 1]
        assert kind == "expect", log
        j = ids.index(log[i][1][0])
        assert order == ids[j:] + ids[:j], (log[i], order)
    h = pool.stats()["hints"]
    assert h["expected"] == 3, h  # the second round's calls (first calls are not counted)
    with pytest.raises(ValueError, match="before the team's first run"):
        follow(team)


def test_follow_rejects_what_is_not_a_fresh_team(pool):
    client = AgentMemChatCompletionClient(pool, agent_id="x")
    with pytest.raises(TypeError, match="group chat team"):
        follow(AssistantAgent("x", model_client=client))
    team = follow(RoundRobinGroupChat(agents({n: client for n in NAMES})))
    with pytest.raises(ValueError, match="already"):
        follow(team)


async def test_selector_client_expects_its_candidates_then_its_answer_without_app_code(pool):
    ids = {n: f"sel-{n}" for n in NAMES}  # agent ids are not the participant names
    clients = clients_for(pool, [*ids.values()], max_tokens=4)
    selector = AgentMemChatCompletionClient(pool, agent_id="sel-selector", max_tokens=12, speaker_selection=True)
    log = spy(pool)
    for c in [*clients.values(), selector]:
        c.on_result = lambda agent, r: log.append(("call", [agent]))
    team = SelectorGroupChat(agents({n: clients[ids[n]] for n in NAMES}), model_client=selector,
                             termination_condition=MaxMessageTermination(7))
    result = await team.run(task="plan the release")
    speakers = [m.source for m in result.messages[1:]]
    # each worker call comes right after the expectation naming it first, then the selector
    worker_calls = [i for i, (k, a) in enumerate(log) if k == "call" and a[0] != "sel-selector"]
    assert len(worker_calls) == len(speakers) == 6
    seen = set()
    for i, name in zip(worker_calls, speakers):
        expects = [order for kind, order in log[:i] if kind == "expect"]
        wanted = ids[name] if name in seen else name  # before its first call only the name is known
        assert expects[-1] == [wanted, "sel-selector"], (name, expects[-1])
        seen.add(name)
    # before each selection: the selector, then its candidates as one branch (the previous speaker is not one)
    before = [order for kind, order in log if kind == "expect" and isinstance(order[-1], list)]
    assert before and all(order[0] == "sel-selector" for order in before), before
    assert len(before[0][1]) == len(NAMES) and all(len(order[1]) == len(NAMES) - 1 for order in before[1:]), before
    assert pool.stats()["hints"]["expected"] > 0


def set_flag(on: bool) -> str:
    """Switch the flag."""
    return f"flag {'on' if on else 'off'}"


async def test_a_tool_call_reply_holds_the_agent_until_its_reflection(pool):
    client = AgentMemChatCompletionClient(pool, agent_id="tool-user", max_tokens=24, force_tools=True)
    agent = AssistantAgent("helper", model_client=client, tools=[set_flag], reflect_on_tool_use=True)
    await agent.run(task="switch the flag on")
    h = pool.stats()["hints"]
    assert h["holds"] >= 1 and h["hold_hits"] == 1 and h["held"] == [], h
