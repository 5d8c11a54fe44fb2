"""ChatAgentMem inside LangGraph: agent ids from the run config, profile, token counts, hints, rewrites.

Runs real LangGraph graphs on the tiny random-weight model (mechanics, not answers).
The workflow hints are checked against a pool whose `expect` / `hold` / `unhold` are
replaced by recorders, so the test does not depend on how the pool acts on them.
"""

from __future__ import annotations

import doctest
import logging
import operator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from agentmem import ConfigError, MemoryPool, PoolConfig  # noqa: E402
from agentmem_langchain import ChatAgentMem  # noqa: E402
from agentmem_langchain import _hints, _identity, _profile, _rewrites  # noqa: E402
from agentmem_langchain._identity import agent_from_config, node_path, resolve_agent  # noqa: E402


@pytest.fixture(scope="module")
def pool(tiny_model_path: Any) -> Any:
    p = MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=2, n_threads=1)
    yield p
    p.close()


class Recorder:
    """Stands in for the pool's hints API: records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.scopes: list[str | None] = []

    def expect(self, agent_ids: list[str], *, soon: bool = True, scope: str | None = None) -> None:
        self.calls.append(("expect", list(agent_ids), soon))
        self.scopes.append(scope)

    def hold(self, agent_id: str, *, ttl_s: float | None = None) -> None:
        self.calls.append(("hold", agent_id, ttl_s))

    def unhold(self, agent_id: str) -> None:
        self.calls.append(("unhold", agent_id))


@pytest.fixture
def hints(pool: MemoryPool, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    for name in ("expect", "hold", "unhold"):
        monkeypatch.setattr(pool, name, getattr(rec, name), raising=False)
    return rec


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


@tool
def ping() -> str:
    """Check the connection (no arguments: a forced call of it is fully determined)."""
    return "pong"


class State(TypedDict):
    messages: Annotated[list[BaseMessage], operator.add]
    turns: int


def _two_node_graph(model: ChatAgentMem) -> Any:
    """`writer` → `critic` → `writer` ... for two rounds, one model object for both nodes."""

    def writer(s: State) -> dict[str, Any]:
        ai = model.invoke([SystemMessage("You write."), *s["messages"]], max_tokens=3)
        return {"messages": [AIMessage(ai.text, response_metadata=ai.response_metadata)], "turns": s["turns"] + 1}

    def critic(s: State) -> dict[str, Any]:
        ai = model.invoke([SystemMessage("You criticise."), *s["messages"]], max_tokens=3)
        return {"messages": [AIMessage(ai.text, response_metadata=ai.response_metadata)]}

    g = StateGraph(State)
    g.add_node("writer", writer)
    g.add_node("critic", critic)
    g.add_edge(START, "writer")
    g.add_conditional_edges("critic", lambda s: "writer" if s["turns"] < 2 else END, ["writer", END])
    g.add_edge("writer", "critic")
    return g.compile(checkpointer=InMemorySaver())


# --------------------------------------------------------------------------- agent id precedence
def _cfg(**meta: Any) -> dict[str, Any]:
    conf = {k: meta.pop(k) for k in ("thread_id", "agent_id") if k in meta}
    return {"configurable": conf, "metadata": meta}


def test_precedence_of_the_agent_id_sources() -> None:
    graph = _cfg(thread_id="t1", langgraph_node="coder", checkpoint_ns="coder:ab12")
    kw = {"own": "default", "own_is_explicit": False, "hook": None}
    assert resolve_agent(graph, explicit=None, **kw) == "t1/coder"
    assert resolve_agent(graph, explicit="arg", **kw) == "arg"
    assert resolve_agent(_cfg(agent_id="conf", thread_id="t1", langgraph_node="coder"), explicit=None, **kw) == "conf"
    assert resolve_agent(graph, explicit=None, own="mine", own_is_explicit=True, hook=None) == "mine"
    assert resolve_agent(graph, explicit=None, own="default", own_is_explicit=False, hook=lambda c: "hooked") == "hooked"
    assert resolve_agent(graph, explicit=None, own="default", own_is_explicit=False, hook=lambda c: None) == "t1/coder"
    assert resolve_agent(_cfg(langgraph_node="coder"), explicit=None, **kw) == "coder"
    assert resolve_agent({}, explicit=None, **kw) == "default"


def test_node_path_names_the_parent_graphs_of_a_subgraph_node() -> None:
    assert node_path(_cfg(langgraph_node="model", checkpoint_ns="research:1a2b|model:3c4d")) == "research/model"
    assert node_path(_cfg(langgraph_node="model", checkpoint_ns="other:1a")) == "model"  # inconsistent: the node alone
    assert agent_from_config(_cfg(thread_id=7, langgraph_node="a")) == "7/a"
    assert node_path({"metadata": {"langgraph_node": ""}}) is None


@pytest.mark.parametrize(
    ("config", "source"),
    [
        (_cfg(thread_id="t\x00", langgraph_node="a"), "from thread_id and langgraph_node"),
        (_cfg(thread_id="x" * 300, langgraph_node="a"), "from thread_id and langgraph_node"),
        (_cfg(thread_id="share:brief", langgraph_node="a"), "from thread_id and langgraph_node"),
        (_cfg(agent_id="bad\nid"), "configurable.agent_id"),
    ],
)
def test_hostile_resolved_ids_are_config_errors_naming_the_source(config: dict[str, Any], source: str) -> None:
    with pytest.raises(ConfigError, match=source):
        ChatAgentMem().resolve_agent_id(config)


def test_hook_results_are_validated() -> None:
    model = ChatAgentMem(agent_id_from_config=lambda c: "")
    with pytest.raises(ConfigError, match=r"agent_id_from_config\(config\)"):
        model.resolve_agent_id(_cfg(langgraph_node="a"))


def test_summarizer_calls_get_their_own_agent() -> None:
    model = ChatAgentMem()
    cfg = _cfg(thread_id="t1", langgraph_node="model", lc_source="summarization")
    assert model.resolve_agent_id(cfg) == "t1/model/summarizer"


def test_one_model_shared_by_two_graph_nodes_lands_on_two_agents(pool: MemoryPool) -> None:
    model = ChatAgentMem(pool=pool)
    app = _two_node_graph(model)
    out = app.invoke({"messages": [HumanMessage("A poem.")], "turns": 0}, {"configurable": {"thread_id": "th-a"}})
    agents = [m.response_metadata["agent_id"] for m in out["messages"] if isinstance(m, AIMessage)]
    assert agents == ["th-a/writer", "th-a/critic", "th-a/writer", "th-a/critic"], agents
    assert {"th-a/writer", "th-a/critic"} <= set(pool.agents())
    # the second round continued each node's own memory
    assert pool.stats()["agents"]["th-a/writer"]["calls"] == 2
    # another thread is another set of agents; an explicit id still wins over the graph
    app.invoke({"messages": [HumanMessage("A song.")], "turns": 1}, {"configurable": {"thread_id": "th-b"}})
    assert {"th-b/writer", "th-b/critic"} <= set(pool.agents())
    fixed = _two_node_graph(ChatAgentMem(pool=pool, agent_id="fixed"))
    out = fixed.invoke({"messages": [HumanMessage("x")], "turns": 1}, {"configurable": {"thread_id": "th-c"}})
    assert {m.response_metadata["agent_id"] for m in out["messages"] if isinstance(m, AIMessage)} == {"fixed"}


# --------------------------------------------------------------------------- profile and token counts
def test_profile_from_pool_options_loads_nothing(tmp_path: Any) -> None:
    model = ChatAgentMem(model_path=str(tmp_path / "absent.gguf"), pool_options={"n_ctx": 3072})
    assert model.pool is None
    assert model.profile is not None and model.profile["max_input_tokens"] == 3072
    assert model.profile["tool_calling"] and model.profile["structured_output"] and not model.profile["image_inputs"]
    budgeted = ChatAgentMem(model_path=str(tmp_path / "absent.gguf"), pool_options={"n_ctx": 3072, "agent_budget_tokens": 1000})
    assert budgeted.profile is not None and budgeted.profile["max_input_tokens"] == 1000


def test_profile_from_a_pool_is_its_agent_capacity(pool: MemoryPool) -> None:
    model = ChatAgentMem(pool=pool)
    assert model.profile is not None and model.profile["max_input_tokens"] == pool.capacity
    assert _profile.profile_for(PoolConfig.build(n_ctx=512), 512, "m")["max_input_tokens"] == 512


def test_token_counts_match_what_a_call_prefills(pool: MemoryPool) -> None:
    model = ChatAgentMem(pool=pool, agent_id="count-agent", max_tokens=1)
    msgs = [SystemMessage("You count."), HumanMessage("one two three")]
    ai = model.invoke(msgs)
    assert model.get_num_tokens_from_messages(msgs) == ai.usage_metadata["input_tokens"]
    with_tools = model.bind_tools([lookup], tool_choice="none").invoke(msgs, agent_id="count-tools")
    assert model.get_num_tokens_from_messages(msgs, tools=[lookup]) == with_tools.usage_metadata["input_tokens"]
    assert model.get_num_tokens_from_messages(msgs, tools=[lookup]) > model.get_num_tokens_from_messages(msgs)
    assert model.get_num_tokens("one two three") == len(pool.engine().model.tokenize("one two three"))
    assert model.get_token_ids("one") == pool.engine().model.tokenize("one")


# --------------------------------------------------------------------------- hints
def test_a_reply_ending_in_a_tool_call_holds_the_agent(pool: MemoryPool, hints: Recorder) -> None:
    model = ChatAgentMem(pool=pool, agent_id="hold-agent", max_tokens=24)
    ai = model.bind_tools([ping], tool_choice="ping").invoke("Ping.")
    assert ai.tool_calls
    assert hints.calls == [("hold", "hold-agent", None)]  # default TTL (from its reload cost)
    model.invoke("Thanks.", max_tokens=1)  # the pool ends a hold at the next call itself
    assert hints.calls == [("hold", "hold-agent", None)]
    chunks = list(model.bind_tools([ping], tool_choice="ping").stream("Ping again."))
    assert chunks[-1].tool_call_chunks and hints.calls[-1] == ("hold", "hold-agent", None)


def test_text_replies_hold_nothing(pool: MemoryPool, hints: Recorder) -> None:
    ChatAgentMem(pool=pool, agent_id="no-hold", max_tokens=2).invoke("Hi")
    assert hints.calls == []


def test_a_pool_without_the_hints_api_is_left_alone(pool: MemoryPool, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("expect", "hold", "unhold"):
        monkeypatch.setattr(pool, name, None)  # what getattr finds on an older pool: nothing to call
    model = ChatAgentMem(pool=pool, agent_id="no-api", max_tokens=24)
    assert model.bind_tools([ping], tool_choice="ping").invoke("Ping.").tool_calls


def test_following_a_graph_expects_the_next_nodes_agents(pool: MemoryPool, hints: Recorder) -> None:
    model = ChatAgentMem(pool=pool)
    app = _two_node_graph(model)
    model.follow(app)
    app.invoke({"messages": [HumanMessage("A poem.")], "turns": 0}, {"configurable": {"thread_id": "fol"}})
    expects = [c[1] for c in hints.calls if c[0] == "expect"]
    # round 1: the critic is not known to call a model until it does; after that,
    # each node's reply expects the other node's agent, then its own (in this thread)
    assert expects[-2:] == [["fol/critic", "fol/writer"], ["fol/writer", "fol/critic"]], expects
    app.invoke({"messages": [HumanMessage("A song.")], "turns": 1}, {"configurable": {"thread_id": "fol2"}})
    expects = [c[1] for c in hints.calls if c[0] == "expect"]
    assert expects[-2:] == [["fol2/critic", "fol2/writer"], ["fol2/writer", "fol2/critic"]], expects  # the same nodes, this thread's agents


def test_next_nodes_step_over_nodes_that_never_call_a_model() -> None:
    f = _hints.GraphFollower({"__start__": ["boss"], "boss": ["a", "b"], "a": ["tools"], "tools": ["a", "boss"], "b": ["boss"]})
    for node in ("boss", "a", "b"):
        f.saw(node, f"t/{node}", auto=True)
    assert f.next_nodes("a") == ["a", "boss", "b"]  # a tool loop leads back to a itself
    assert f.next_levels("boss") == [("a", 1), ("b", 1), ("boss", 2)]
    assert f.next_nodes("nowhere") == []


def test_hops_count_model_calls_whichever_path_is_found_first() -> None:
    # the team of examples/langgraph_team.py: after the researcher, its own tool loop and
    # the supervisor are both one model call away, though the supervisor's edge comes first
    f = _hints.GraphFollower({"supervisor": ["coder", "researcher", "writer"], "researcher": ["supervisor", "tools"],
                              "tools": ["researcher"], "coder": ["supervisor"], "writer": ["supervisor"]})
    for node in ("supervisor", "researcher", "coder", "writer"):
        f.saw(node, node, auto=False)
    assert f.next_levels("researcher") == [("supervisor", 1), ("researcher", 1), ("coder", 2), ("writer", 2)]
    assert f.expected({"metadata": {"langgraph_node": "researcher"}}, lambda c: "x") == [
        ["supervisor", "researcher"], ["coder", "writer"]]


def test_a_branch_expects_its_candidates_without_prefetching_a_guess() -> None:
    f = _hints.GraphFollower({"__start__": ["boss"], "boss": ["a", "b"], "a": ["tools"], "tools": ["boss"], "b": ["boss"]})
    for node in ("boss", "a", "b"):
        f.saw(node, f"t/{node}", auto=True)
    sent: list[tuple[list[str], bool]] = []

    class Pool:
        def expect(self, ids: list[str], *, soon: bool = True, scope: str | None = None) -> None:
            assert scope == "t", "the graph's thread is the scope"
            sent.append((list(ids), soon))

    def resolve(config: Any) -> str:
        return f"t/{config['metadata']['langgraph_node']}"

    config = {"configurable": {"thread_id": "t"}, "metadata": {"langgraph_node": "boss", "checkpoint_ns": "boss:1"}}
    f.expect(Pool(), "t/boss", config, resolve, auto=True)  # one of two workers, then the boss again
    config = {"configurable": {"thread_id": "t"}, "metadata": {"langgraph_node": "a", "checkpoint_ns": "a:1"}}
    f.expect(Pool(), "t/a", config, resolve, auto=True)  # the boss for certain, then a branch
    # a branch is one item: the pool ranks its workers alike and prefetches only up to it
    assert sent == [([["t/a", "t/b"], "t/boss"], True), (["t/boss", ["t/a", "t/b"]], True)], sent


def test_follow_rejects_what_is_not_a_graph() -> None:
    with pytest.raises(TypeError, match="compiled LangGraph graph"):
        ChatAgentMem().follow(object())


def test_edges_of_a_compiled_graph_put_direct_edges_first(pool: MemoryPool) -> None:
    edges = _hints.GraphFollower(_two_node_graph(ChatAgentMem(pool=pool))).successors
    assert edges["writer"] == ["critic"] and edges["critic"] == ["writer"] and edges["__start__"] == ["writer"]


# --------------------------------------------------------------------------- rewrites
def test_a_summarization_rewrite_is_warned_about_once(pool: MemoryPool, caplog: pytest.LogCaptureFixture) -> None:
    _rewrites._warned.clear()
    model = ChatAgentMem(pool=pool, agent_id="rewritten", max_tokens=2)
    history: list[BaseMessage] = [SystemMessage("s"), HumanMessage("one"), AIMessage("a"), HumanMessage("two")]
    model.invoke(history)
    model.invoke([*history, AIMessage("b"), HumanMessage("three")])  # an extension: silent
    summary = HumanMessage(f"{_rewrites.SUMMARY_PREFIX}\n\nthey said one and two", additional_kwargs={"lc_source": "summarization"})
    with caplog.at_level(logging.WARNING, logger="agentmem_langchain._rewrites"):
        model.invoke([SystemMessage("s"), summary, HumanMessage("four")])
        model.invoke([SystemMessage("s"), summary.model_copy(update={"content": summary.content + "!"}), HumanMessage("five")])
    warnings = [r for r in caplog.records if "SummarizationMiddleware" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "agent_budget_tokens" in warnings[0].getMessage()


def test_rewrite_watch_tells_extensions_from_rewrites(pool: MemoryPool) -> None:
    w = _rewrites.RewriteWatch()
    a, b, c = ({"role": "user", "content": x} for x in "abc")
    assert not w.check(pool, "x", [], [a])
    assert not w.check(pool, "x", [], [a, b])
    assert not w.check(pool, "x", [], [a, b])  # the same prompt again
    assert w.check(pool, "x", [], [a, c])


@pytest.mark.parametrize("module", [_identity, _hints, _profile])
def test_docstring_examples(module: Any) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_hints_reach_the_pool(pool: MemoryPool) -> None:
    """The real hints API (no recorder): expectations are counted, a tool-calling agent is held."""
    before = pool.stats()["hints"]
    model = ChatAgentMem(pool=pool)
    app = _two_node_graph(model)
    model.follow(app)
    app.invoke({"messages": [HumanMessage("A poem.")], "turns": 0}, {"configurable": {"thread_id": "real-hints"}})
    after = pool.stats()["hints"]
    assert after["expected"] > before["expected"], (before, after)
    caller = ChatAgentMem(pool=pool, agent_id="real-hold", max_tokens=8)
    assert caller.bind_tools([ping], tool_choice="ping").invoke("Ping.").tool_calls
    assert "real-hold" in pool.stats()["hints"]["held"]
    caller.invoke("pong", max_tokens=1)
    assert "real-hold" not in pool.stats()["hints"]["held"]  # the next call ended the hold


def test_token_counts_with_a_native_tool_template(tiny_qwen2_path: Any) -> None:
    """Qwen2.5's own template shows the tools (hermes): the count includes that prompt too."""
    with MemoryPool(str(tiny_qwen2_path), n_ctx=2048, resident_agents=1, n_threads=1) as qpool:
        model = ChatAgentMem(pool=qpool, agent_id="qwen-count", max_tokens=1)
        msgs = [SystemMessage("You count."), HumanMessage("one two three")]
        got = model.bind_tools([lookup], tool_choice="none").invoke(msgs).usage_metadata["input_tokens"]
        assert model.get_num_tokens_from_messages(msgs, tools=[lookup]) == got
