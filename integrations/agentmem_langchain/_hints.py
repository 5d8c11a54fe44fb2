"""Workflow hints from LangChain and LangGraph to the pool: who runs next, who waits for a tool.

* **Tool calls** — a reply that ends in a tool call means its agent is called again as
  soon as the tool returns: the agent is held resident (`MemoryPool.hold`, TTL from its
  reload cost); the pool ends the hold when the agent's next call starts.
* **Graph edges** — after `model.follow(graph)`, a reply to node `n` tells the pool which
  agents run next (`MemoryPool.expect`, nearest first): the model-calling nodes reachable
  from `n` along the compiled graph's edges, in breadth-first order, one item per hop —
  the nodes of one hop are alternatives (a branch), `n` itself included when the edges
  lead back to it. Which nodes call a model is learned as they do, so tool nodes and
  plain functions are stepped over.

Pools without the hints API (an older agentmem) are left alone; a hint never fails a call
(errors are logged at DEBUG).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from typing import Any, Callable, Mapping

import agentmem.validation as check
from agentmem import AgentMemError, MemoryPool

from ._identity import node_path, thread_of, with_node

__all__ = ["GraphFollower", "follower_for", "hold_after_reply"]

logger = logging.getLogger(__name__)

#: Expected agents sent with one hint at most (the pool cannot prefetch more than it has sequences for).
MAX_EXPECTED = 8
_START, _END = "__start__", "__end__"

def _hint(pool: MemoryPool, name: str, *args: Any, **kwargs: Any) -> bool:
    """Call `pool.<name>(...)` if the pool has it; `True` when it was sent."""
    method = getattr(pool, name, None)
    if method is None:
        return False
    try:
        method(*args, **kwargs)
    except (AgentMemError, ValueError) as exc:
        logger.debug("pool.%s%r ignored: %s", name, args, exc)
        return False
    return True


def hold_after_reply(pool: MemoryPool, agent_id: str, ends_in_tool_call: bool) -> None:
    """Hold `agent_id` resident when its reply ended in a tool call (TTL from its reload cost)."""
    if ends_in_tool_call:
        _hint(pool, "hold", agent_id, ttl_s=None)


def thread_scope(config: Mapping[str, Any]) -> str | None:
    """The hint scope of a run: its LangGraph `thread_id` (each thread keeps its own expected
    order on the pool), or None (the pool's default scope) without a usable one."""
    thread = thread_of(config)
    if thread is None:
        return None
    try:
        return check.agent_id(thread, field="thread_id")
    except AgentMemError:
        return None


class GraphFollower:
    """The edges of one compiled LangGraph graph, and which of its nodes call a model.

    Args:
        graph: a compiled graph (anything with `get_graph()`, as `StateGraph.compile()`
            returns), or a `{node: [successor, ...]}` mapping.

    >>> f = GraphFollower({"__start__": ["boss"], "boss": ["a", "b"], "a": ["tools"], "tools": ["boss"], "b": ["boss"]})
    >>> f.saw("boss", "t/boss", auto=True); f.saw("b", "t/b", auto=True); f.saw("a", "t/a", auto=True)
    >>> f.next_nodes("a")
    ['boss', 'a', 'b']
    """

    def __init__(self, graph: Any) -> None:
        self.successors: dict[str, list[str]] = _edges(graph)
        self._agents: dict[str, tuple[str, bool]] = {}  # node -> (last agent id, resolved automatically)
        self._lock = threading.Lock()

    def saw(self, node: str, agent_id: str, *, auto: bool) -> None:
        """Node `node` called a model as `agent_id` (`auto`: the id came from the run config)."""
        with self._lock:
            self._agents[node] = (agent_id, auto)

    def next_nodes(self, node: str) -> list[str]:
        """Model-calling nodes reachable from `node`, nearest first (`node` itself excluded)."""
        return [n for n, _ in self.next_levels(node)]

    def next_levels(self, node: str) -> list[tuple[str, int]]:
        """`(node, hops)` of the model-calling nodes reachable from `node`, nearest first.

        `hops` counts model-calling nodes on the way (tool nodes and plain functions are
        stepped over): the nodes of hop 1 are the candidates for the very next model call.

        >>> f = GraphFollower({"boss": ["a", "b"], "a": ["tools"], "tools": ["boss"], "b": ["boss"]})
        >>> f.saw("boss", "t/boss", auto=True); f.saw("b", "t/b", auto=True); f.saw("a", "t/a", auto=True)
        >>> f.next_levels("boss")
        [('a', 1), ('b', 1), ('boss', 2)]
        >>> f.next_levels("a")
        [('boss', 1), ('a', 2), ('b', 2)]
        """
        with self._lock:
            agents = dict(self._agents)
        # 0-1 breadth-first search: entering a model-calling node costs a hop, any other node nothing
        dist: dict[str, int] = {}
        order: dict[str, int] = {}  # first discovery, for a stable order within a hop
        queue: deque[tuple[str, int]] = deque()

        def reach(n: str, before: int) -> None:
            d = before + (n in agents)
            if d < dist.get(n, d + 1):
                dist[n] = d
                order.setdefault(n, len(order))
                if n in agents:
                    queue.append((n, d))
                else:
                    queue.appendleft((n, d))

        for n in self.successors.get(node, []):
            reach(n, 0)
        while queue:
            n, d = queue.popleft()
            if d > dist[n]:
                continue  # reached again with fewer hops
            for m in self.successors.get(n, []):
                reach(m, d)
        found = sorted((n for n in dist if n in agents), key=lambda n: (dist[n], order[n]))
        return [(n, dist[n]) for n in found[:MAX_EXPECTED]]

    def expected(self, config: Mapping[str, Any], resolve: Callable[[Mapping[str, Any]], str]) -> list[list[str]]:
        """Agent ids to expect after a call with run config `config`, one list per hop (empty outside this graph).

        The nodes of one hop are alternatives (a branch) for the pool: they share a step.
        """
        meta = config.get("metadata") or {}
        node = meta.get("langgraph_node") if isinstance(meta, Mapping) else None
        if not isinstance(node, str) or node not in self.successors:
            return []
        with self._lock:
            agents = dict(self._agents)
        levels: dict[int, list[str]] = {}
        seen: set[str] = set()
        for n, hops in self.next_levels(node):
            agent, auto = agents[n]
            if auto:  # the same rule, for this call's thread
                try:
                    agent = resolve(with_node(config, n))
                except AgentMemError:
                    continue
            if agent not in seen:
                seen.add(agent)
                levels.setdefault(hops, []).append(agent)
        return [levels[h] for h in sorted(levels)]

    def expect(self, pool: MemoryPool, agent_id: str, config: Mapping[str, Any], resolve: Callable[[Mapping[str, Any]], str], *, auto: bool) -> None:
        """Record the node of a finished call and tell `pool` which agents run after it.

        Each hop is sent as one item: a single agent, or a branch of alternatives (a
        supervisor routing to one of several workers). The pool prefetches only up to
        the first branch: restoring a guess costs a sequence the right worker may need;
        the order still ranks who to give up first.
        """
        meta = config.get("metadata") or {}
        node = meta.get("langgraph_node") if isinstance(meta, Mapping) else None
        if not isinstance(node, str) or node not in self.successors or node_path(config) is None:
            return
        self.saw(node, agent_id, auto=auto)
        levels = self.expected(config, resolve)
        if levels:
            _hint(pool, "expect", [g[0] if len(g) == 1 else g for g in levels], soon=True, scope=thread_scope(config))


_followers: weakref.WeakKeyDictionary[Any, GraphFollower] = weakref.WeakKeyDictionary()
_followers_guard = threading.Lock()


def follower_for(graph: Any) -> GraphFollower:
    """The `GraphFollower` of `graph`, shared by every model that follows it."""
    if isinstance(graph, Mapping) or not hasattr(graph, "get_graph"):
        return GraphFollower(graph)  # a mapping (not shared), or the TypeError naming what is expected
    with _followers_guard:
        f = _followers.get(graph)
        if f is None:
            f = _followers[graph] = GraphFollower(graph)
        return f


def _edges(graph: Any) -> dict[str, list[str]]:
    """`{node: [successors]}` of a compiled graph, direct edges before conditional ones."""
    if isinstance(graph, Mapping):
        return {str(k): [str(x) for x in v if x != _END] for k, v in graph.items()}
    get_graph = getattr(graph, "get_graph", None)
    if get_graph is None:
        raise TypeError(
            f"follow() needs a compiled LangGraph graph (StateGraph(...).compile()) or a {{node: [successors]}} dict, "
            f"got {type(graph).__name__}"
        )
    drawn = get_graph()
    direct: dict[str, list[str]] = {}
    branch: dict[str, list[str]] = {}
    for e in drawn.edges:
        if e.target == _END:
            continue
        bucket = branch if e.conditional else direct
        bucket.setdefault(e.source, [])
        if e.target not in bucket[e.source]:
            bucket[e.source].append(e.target)
    out: dict[str, list[str]] = {}
    for node in drawn.nodes:
        if node in (_END,):
            continue
        succ = [*direct.get(node, []), *(t for t in branch.get(node, []) if t not in direct.get(node, []))]
        out[node] = succ
    return out
