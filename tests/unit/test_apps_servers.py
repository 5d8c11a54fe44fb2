"""The apps benchmark's server variants: one client per agent, named the way each server documents, and the stream timer.

No model and no server: the clients are real `ChatOpenAI` objects that are never called.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypedDict

import pytest

pytest.importorskip("langchain_openai")
pytest.importorskip("langgraph")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchmarks._apps_servers import Served, ServerBackend  # noqa: E402


def _served(key: str) -> Served:
    proc = SimpleNamespace(base_url="http://127.0.0.1:1", stop=lambda: None)
    return Served(key, key, proc, "qwen")  # type: ignore[arg-type]


@pytest.mark.parametrize(("key", "expect"), [("serve", True), ("llama-server", False)])
def test_each_graph_node_gets_its_own_client(key: str, expect: bool) -> None:
    """`PerNodeChat` hands each node the client of `{thread_id}/{node}`; only agentmem's carries `X-Agent-Id`."""
    from langgraph.graph import END, START, StateGraph

    class S(TypedDict):
        seen: list[Any]

    be = ServerBackend(_served(key), max_tokens=4)

    def node(name: str) -> Any:
        def run(s: S) -> dict[str, Any]:
            # an attribute of the node's own client, read through the shared stand-in
            return {"seen": [*s["seen"], (name, be.model.default_headers, id(be.model._current()))]}

        return run

    g = StateGraph(S)
    g.add_node("planner", node("planner"))
    g.add_node("coder", node("coder"))
    g.add_edge(START, "planner")
    g.add_edge("planner", "coder")
    g.add_edge("coder", END)
    out = g.compile().invoke({"seen": []}, {"configurable": {"thread_id": "t1"}})["seen"]
    assert sorted(be._chats) == ["t1/coder", "t1/planner"], sorted(be._chats)
    (_, h1, c1), (_, h2, c2) = out
    assert c1 != c2
    if expect:
        assert h1 == {"X-Agent-Id": "t1/planner"} and h2 == {"X-Agent-Id": "t1/coder"}, (h1, h2)
    else:
        assert not h1 and not h2, (h1, h2)


def test_metrics_read_the_servers_cached_tokens() -> None:
    from langchain_core.messages import AIMessage

    be = ServerBackend(_served("serve"), max_tokens=4)
    msg = AIMessage("", tool_calls=[{"name": "search", "args": {}, "id": "c1"}],
                    usage_metadata={"input_tokens": 50, "output_tokens": 3, "total_tokens": 53,
                                    "input_token_details": {"cache_read": 40}})
    m = be.metrics(msg)
    assert (m["prompt_tokens"], m["cache_read"], be.tool_calls) == (50, 40, 1), (m, be.tool_calls)


def test_timed_stream_notes_first_content_and_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    """TTFT is the first chunk with content (not the role chunk); the usage chunk is kept."""
    import apps_autogen

    def chunk(content: str | None, usage: Any = None) -> Any:
        choices = [] if content is None else [SimpleNamespace(delta=SimpleNamespace(content=content, tool_calls=None))]
        return SimpleNamespace(choices=choices, usage=usage)

    usage = SimpleNamespace(prompt_tokens=10, completion_tokens=2)
    chunks = [chunk(""), chunk("hi"), chunk(" there"), chunk(None, usage)]

    clock = [0.0]  # the n-th chunk arrives at time n
    monkeypatch.setattr(apps_autogen.time, "perf_counter", lambda: clock[0])

    class Inner:
        def __init__(self) -> None:
            self.it = iter(chunks)

        async def __anext__(self) -> Any:
            clock[0] += 1
            try:
                return next(self.it)
            except StopIteration:
                raise StopAsyncIteration from None

    got: list[Any] = []

    async def drain() -> list[Any]:
        s = apps_autogen._TimedStream(Inner(), 0.0, lambda ttft, u: got.append((ttft, u)))
        return [c async for c in s]

    assert len(asyncio.run(drain())) == 4
    (ttft, u), = got
    assert u is usage and ttft == 2.0, got  # "hi", the second chunk; not the empty role chunk
