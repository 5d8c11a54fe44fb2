"""Workflow hints: which agents run next, and which must stay resident through a tool call.

A framework often knows what the pool can only guess: a round-robin team's next
speaker, a selector's candidates, a graph's next nodes, an agent whose reply was a
tool call and that runs again as soon as the tool returns. `Hints` keeps what it
was told:

* **expected order** (`expect`): a list, first = runs next; an item is an agent
  id or a list of alternatives (a branch: a supervisor routes to one of its
  workers). An agent's *steps-to-next-use* is its item's position + 1, `math.inf`
  when it is not listed; within a branch the alternative called longest ago (or
  never) ranks soonest — a supervisor working through its workers and a selector
  giving each speaker a turn both rotate — by a fraction of a step
  (`i + 1 + rank / len(branch)`), so it is kept and the one just called is given
  up first. Each scope (`expect(..., scope=)`: a graph's thread, a team) keeps its
  own order; an agent counts its soonest use. A call of a listed agent removes it
  from the list (the others move up); the alternatives it was chosen over move to the end. When a list
  exists, the sequence to give up is the one whose next use is furthest away
  (KVFlow's steps-to-execution rule, arXiv 2507.07400); without one, the learned
  predictor decides as before.
* **holds** (`hold`): an agent kept in its live sequence until a deadline or its
  next call, whichever comes first (Continuum/CacheTTL, arXiv 2511.02230). A held
  agent is never given up while another candidate is not held. The default TTL
  comes from the agent's reload cost (`reload_ttl`).

`HintMethods` is the public face (`MemoryPool.expect`, `hold`, `unhold`); the
hit counters appear in `MemoryPool.stats()["hints"]`. `PoolConfig(hints=False)`
validates hints and ignores them (the no-hints side of a comparison).

>>> h = Hints(clock=lambda: 0.0)
>>> h.expect(["b", "c"])
>>> h.steps("b"), h.steps("c"), h.steps("a")
(1.0, 2.0, inf)
>>> h.arrive("b", resident=True, has_state=True)
>>> h.steps("c"), h.stats()["hits"]
(1.0, 1)
>>> h.expect([["w1", "w2", "w3"], "boss"])   # a branch, then the supervisor
>>> h.arrive("w2", resident=False, has_state=True)
>>> h.stats()["order"], h.steps("boss"), h.steps("w1")
(['boss', ['w1', 'w3']], 1.0, 2.0)
>>> h.arrive("w1", resident=True, has_state=True)    # not expected here: only its last call is noted
>>> h.expect([["w1", "w2", "w3"]])                    # w3 never ran, w2 ran before w1
>>> [h.steps(w) for w in ("w3", "w2", "w1")]
[1.0, 1.3333333333333333, 1.6666666666666665]
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, Sequence

import agentmem.validation as check
from agentmem.errors import ConfigError
from agentmem.pool.results import ChatResult

if TYPE_CHECKING:
    from agentmem.policy.placement import AgentInfo
    from agentmem.pool.state import AgentState, PoolCore
    from agentmem.tools.formats import ToolFormat

__all__ = [
    "HOLD_MAX_S",
    "HOLD_MIN_S",
    "HOLD_SCALE",
    "MAX_EXPECTED",
    "MAX_SCOPES",
    "MAX_TTL_S",
    "HintMethods",
    "Hints",
    "check_expected",
    "reload_ttl",
]

logger = logging.getLogger(__name__)

#: Most agent ids one `expect` call may list.
MAX_EXPECTED = 1024
#: Most scopes (graph threads, teams) with an expected order of their own; the oldest goes first.
MAX_SCOPES = 1024
#: Longest TTL a caller may give `hold` (seconds).
MAX_TTL_S = 3600.0
#: A default hold lasts `HOLD_SCALE` x the agent's estimated reload time ...
HOLD_SCALE = 100.0
#: ... but at least this long (seconds): a tool round trip is rarely shorter ...
HOLD_MIN_S = 1.0
#: ... and at most this long (seconds): an idle sequence costs the other agents.
HOLD_MAX_S = 60.0
# priors until the pool has measured its own rates (seconds per live token)
_RESTORE_S_PER_TOKEN = 2e-5
_PREFILL_S_PER_TOKEN = 2e-3
_EWMA = 0.3


def reload_ttl(n_live: int, restore_s_per_token: float, *, in_ram: bool = True,
               prefill_s_per_token: float = _PREFILL_S_PER_TOKEN) -> float:
    """The default hold of an agent with `n_live` live tokens (seconds).

    The rule: `clamp(HOLD_SCALE * reload_s, HOLD_MIN_S, HOLD_MAX_S)`, where
    `reload_s` is what bringing the agent back would cost if it lost its sequence
    now: a restore of its parked state (`n_live * restore_s_per_token`) when parked
    states stay in RAM, else a re-prefill (`n_live * prefill_s_per_token`). Holding
    an idle sequence much longer than a hundred reloads would cost the agents
    waiting for it more than the hold saves.

    >>> reload_ttl(1000, 2e-5)           # 20 ms to restore -> held 2 s
    2.0
    >>> reload_ttl(10, 2e-5)             # a tiny agent: the floor
    1.0
    >>> reload_ttl(4000, 2e-5, in_ram=False)   # would re-prefill 8 s: the cap
    60.0
    """
    per_token = restore_s_per_token if in_ram else prefill_s_per_token
    return min(HOLD_MAX_S, max(HOLD_MIN_S, HOLD_SCALE * max(0, n_live) * per_token))


class Hints:
    """The expected order, the holds and their counters (the caller holds the pool lock).

    Args:
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # the expected orders, one per scope (a graph thread, a team): one list of alternatives per step
        self.orders: dict[str, list[list[str]]] = {}
        self.scope = ""  # the scope told last (its order is what `upcoming` and `order` read)
        self.last_call: dict[str, int] = {}  # agent -> number of its latest call (ranks a branch's alternatives)
        self._calls = 0
        self._steps: dict[str, float] | None = None  # agent -> steps, rebuilt after a change (placement reads it often)
        self.holds: dict[str, float] = {}  # agent -> deadline (clock seconds)
        self.restore_s_per_token = _RESTORE_S_PER_TOKEN
        self.prefill_s_per_token = _PREFILL_S_PER_TOKEN
        self.counters: dict[str, int] = {
            "expected": 0, "hits": 0, "misses": 0, "holds": 0, "hold_hits": 0, "hold_expired": 0,
            "hold_released": 0,
        }

    # ------------------------------------------------------------------ order
    @property
    def active(self) -> bool:
        """True while an expected order exists (the placement then uses steps-to-next-use)."""
        return bool(self.orders)

    @property
    def groups(self) -> list[list[str]]:
        """The expected order of the scope told last (one list of alternatives per step)."""
        return self.orders.get(self.scope, [])

    @property
    def order(self) -> list[str]:
        """The expected agents of the scope told last, flattened (alternatives in the order given)."""
        return [x for g in self.groups for x in g]

    def expect(self, items: Sequence[str | Sequence[str]], *, scope: str = "") -> None:
        """Replace `scope`'s expected order: each item an agent id or a list of alternatives (a branch).

        Duplicates keep their first place; an empty branch is dropped. Each scope (a
        graph's thread, a team) keeps its own order; the oldest is forgotten past
        `MAX_SCOPES`.
        """
        seen: set[str] = set()
        groups: list[list[str]] = []
        for item in items:
            g = [x for x in dict.fromkeys([item] if isinstance(item, str) else item) if x not in seen]
            seen.update(g)
            if g:
                groups.append(g)
        self._steps = None
        self.orders.pop(scope, None)  # re-inserted last: the most recently told scope
        if groups:
            self.orders[scope] = groups
        self.scope = scope
        while len(self.orders) > MAX_SCOPES:
            del self.orders[next(iter(self.orders))]

    def steps(self, agent_id: str) -> float:
        """Calls until `agent_id` runs by the expected orders (1 = next); `math.inf` if not listed.

        Alternatives of one branch share their step, ranked within it by their last
        call (longest ago first): `i + 1 + rank / len(branch)`, below the next step.
        Under several scopes: the soonest of them.
        """
        if self._steps is None:
            index: dict[str, float] = {}
            for groups in self.orders.values():
                for i, g in enumerate(groups):
                    ranked = sorted(range(len(g)), key=lambda j: (self.last_call.get(g[j], 0), j))
                    for rank, j in enumerate(ranked):
                        index[g[j]] = min(index.get(g[j], math.inf), i + 1 + rank / len(g))
            self._steps = index
        return self._steps.get(agent_id, math.inf)

    def step_index(self, agent_id: str) -> int | None:
        """The position of `agent_id`'s item in the expected orders (0 = next; the soonest), or None."""
        at = [i for groups in self.orders.values() for i, g in enumerate(groups) if agent_id in g]
        return min(at) if at else None

    def next_step(self) -> set[str]:
        """The agents of every scope's first step: those the next call may be for."""
        return {x for groups in self.orders.values() if groups for x in groups[0]}

    def forget(self, agent_id: str) -> None:
        """Drop what is known of a deleted agent (its last call, its hold)."""
        self._steps = None
        self.last_call.pop(agent_id, None)
        self.holds.pop(agent_id, None)

    def info(self, core: PoolCore, a: AgentState) -> AgentInfo:
        """`core.info(a)` with `a`'s steps-to-next-use and hold: what the placement policy ranks."""
        return dataclasses.replace(core.info(a), steps=self.steps(a.id), held=self.held(a.id))

    def upcoming(self, n: int) -> list[str]:
        """The first `n` expected agents that are certain: leading single agents, up to the first branch."""
        out: list[str] = []
        for g in self.groups:
            if len(g) > 1 or len(out) >= n:
                break
            out.append(g[0])
        return out

    # ------------------------------------------------------------------ holds
    def hold(self, agent_id: str, ttl_s: float) -> None:
        """Keep `agent_id` resident for `ttl_s` seconds (or until its next call).

        Holding a held agent again moves its deadline and is not counted as a new hold.
        """
        if not self.held(agent_id):
            self.counters["holds"] += 1
        self.holds[agent_id] = self.clock() + ttl_s

    def unhold(self, agent_id: str) -> bool:
        """End `agent_id`'s hold; False when it had none."""
        if self.holds.pop(agent_id, None) is None:
            return False
        self.counters["hold_released"] += 1
        return True

    def held(self, agent_id: str) -> bool:
        """True while `agent_id` is held (an expired hold is dropped and counted here)."""
        deadline = self.holds.get(agent_id)
        if deadline is None:
            return False
        if self.clock() < deadline:
            return True
        del self.holds[agent_id]
        self.counters["hold_expired"] += 1
        logger.debug("hold of agent %r expired", agent_id)
        return False

    def default_ttl(self, a: AgentState, *, in_ram: bool = True) -> float:
        """`reload_ttl` of agent `a` with the rates this pool measured."""
        return reload_ttl(a.ledger.n_live, self.restore_s_per_token, in_ram=in_ram,
                          prefill_s_per_token=self.prefill_s_per_token)

    # ------------------------------------------------------------------ calls
    def arrive(self, agent_id: str, *, resident: bool, has_state: bool) -> None:
        """A call of `agent_id` starts: count the hint's hit or miss, end its hold, move the order on.

        Only calls of agents that had something kept are counted (`has_state`): a
        first call cannot find anything resident, whatever the hints said.
        """
        self._calls += 1
        self.last_call[agent_id] = self._calls
        self._steps = None
        listed = False
        for scope, groups in list(self.orders.items()):
            at = next((i for i, g in enumerate(groups) if agent_id in g), None)
            if at is None:
                continue
            listed = True
            # the branch is decided: its other alternatives may still run, but only after
            # everything else that is expected
            rest = [x for x in groups.pop(at) if x != agent_id]
            if rest:
                groups.append(rest)
            if not groups:
                del self.orders[scope]
        if listed and has_state:
            self.counters["expected"] += 1
            self.counters["hits" if resident else "misses"] += 1
        if self.holds.pop(agent_id, None) is not None and has_state:
            self.counters["hold_hits"] += resident

    def learn(self, result: ChatResult) -> None:
        """Update the measured restore and prefill rates from a finished call."""
        t, u = result.timings, result.usage
        if result.kv == "restored" and t.restore_s > 0 and u.cached_tokens:
            self.restore_s_per_token += _EWMA * (t.restore_s / u.cached_tokens - self.restore_s_per_token)
        new = u.prompt_tokens - u.cached_tokens
        if t.prefill_s > 0 and new >= 16:
            self.prefill_s_per_token += _EWMA * (t.prefill_s / new - self.prefill_s_per_token)

    def stats(self) -> dict[str, Any]:
        """`MemoryPool.stats()["hints"]`: counters, the hit rate, the current order and holds."""
        now = self.clock()
        c = self.counters
        return {
            **c,
            "hit_rate": c["hits"] / c["expected"] if c["expected"] else 0.0,
            "order": [g[0] if len(g) == 1 else list(g) for g in self.groups],
            "scopes": len(self.orders),
            "held": sorted(a for a, d in self.holds.items() if d > now),
            "restore_ms_per_1k_tokens": 1e6 * self.restore_s_per_token,
        }


def _tool_names(tools: Sequence[Mapping[str, Any]] | None) -> list[str]:
    names = []
    for t in tools or ():
        fn = t.get("function") if isinstance(t.get("function"), Mapping) else t
        if isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def check_expected(agent_ids: Sequence[str | Sequence[str]], *, soon: bool, scope: str | None) -> list[str | list[str]]:
    """`expect`'s arguments checked: the order as a list of ids and lists of ids (see `HintMethods.expect`).

    Raises:
        ConfigError: a malformed agent id or scope, a non-list, too many ids, or a non-bool `soon`.
    """
    if isinstance(agent_ids, (str, bytes)) or not isinstance(agent_ids, Sequence):
        raise ConfigError(f"agent_ids must be a list of agent ids, got {type(agent_ids).__name__}")
    items: list[str | list[str]] = []
    n = 0
    for i, item in enumerate(agent_ids):
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence):
            items.append(check.agent_id(item, field=f"agent_ids[{i}]"))
            n += 1
        else:
            items.append([check.agent_id(x, field=f"agent_ids[{i}][]") for x in item])
            n += len(item)
        if n > MAX_EXPECTED:
            raise ConfigError(f"agent_ids may list at most {MAX_EXPECTED} agents, got more")
    if not isinstance(soon, bool):
        raise ConfigError(f"soon must be a bool, got {soon!r}")
    if scope is not None:
        check.agent_id(scope, field="scope")
    return items


class _Prefetching(Protocol):
    """What the hint methods need of the pool's prefetcher (`agentmem.pool.prefetch.Prefetcher`)."""

    def prefetch(self, agent_ids: Sequence[str]) -> Any: ...


class HintMethods:
    """`MemoryPool`'s hint methods (mixed into the facade; see the module docstring).

    The facade provides `_core`, `_hints`, `_prefetcher` and `_check_open`.
    """

    _core: PoolCore
    _hints: Hints
    _prefetcher: _Prefetching

    _check_open: Callable[[], None]  # the facade's method

    def expect(self, agent_ids: Sequence[str | Sequence[str]], *, soon: bool = True, scope: str | None = None) -> None:
        """Tell the pool which agents run next, in order (first = next call).

        The list replaces the previous one of the same `scope`: independent workflows
        on one pool (a graph's threads, several teams) each keep their own order, and an
        agent's next use is the soonest any of them expects. While it is not empty, the sequence given
        up when another agent needs one — and the parked state demoted first under
        `warm_budget_bytes` — is that of the agent whose next use is furthest away
        (an agent not listed: furthest of all); each call of a listed agent takes it
        off the list. An item may be a list of alternatives (a branch: a supervisor
        routes to one of its workers); they share one step, and once one of them is
        called the others move to the end. With `soon`, the first listed agents that
        are parked are restored in the background (as far as free sequences allow
        without giving up one of an agent expected sooner), up to the first branch:
        a guess is not prefetched.

        Agent ids the pool does not know yet are accepted (an agent is created by
        its first call); they simply cannot be restored ahead.

        Args:
            agent_ids: distinct agent ids or lists of them, next first (at most
                `MAX_EXPECTED` ids in all).
            soon: prefetch the first ones now.
            scope: the workflow this order belongs to (an id, like a LangGraph
                `thread_id`); `None`: the pool's default scope.

        Raises:
            ConfigError: a malformed agent id or scope, a non-list, too many ids, or a non-bool `soon`.

        >>> pool.expect(["coder", ["researcher", "writer"], "supervisor"])  # doctest: +SKIP
        """
        self._check_open()
        items = check_expected(agent_ids, soon=soon, scope=scope)
        core = self._core
        if not core.config.hints:
            return
        with core.lock:
            self._hints.expect(items, scope=scope or "")
            first = self._hints.upcoming(core.config.resident_agents)
        if soon:
            self._prefetcher.prefetch(first)

    def hold(self, agent_id: str, *, ttl_s: float | None = None) -> None:
        """Keep `agent_id` in its live sequence until `ttl_s` passes or its next call starts.

        A held agent is not parked to make room while any other candidate is not
        held. A parked agent is restored in the background first. Call it when the
        agent's reply was a tool call: it runs again as soon as the tool returns.
        `MemoryPool.chat(..., tools=...)` does this itself for a reply that is a call.

        Args:
            agent_id: a known agent.
            ttl_s: seconds, `0 < ttl_s <= MAX_TTL_S`; `None`: `reload_ttl` of the
                agent (`HOLD_SCALE` x its estimated reload time, within
                `[HOLD_MIN_S, HOLD_MAX_S]`).

        Raises:
            ConfigError: a malformed agent id or TTL.
            UnknownAgentError: the pool does not know the agent.
        """
        self._check_open()
        check.agent_id(agent_id)
        if ttl_s is not None:
            ttl_s = check.finite_float(ttl_s, field="ttl_s", lo=0.0, lo_open=True, hi=MAX_TTL_S)
        core = self._core
        if not core.config.hints:
            return
        with core.lock:
            a = core.agent(agent_id)
            self._hints.hold(agent_id, ttl_s if ttl_s is not None else self._hints.default_ttl(a))
            parked = a.seq is None
        if parked:
            self._prefetcher.prefetch([agent_id])

    def unhold(self, agent_id: str) -> None:
        """End `agent_id`'s hold (no-op when it has none or the agent is unknown).

        Raises:
            ConfigError: a malformed agent id.
        """
        self._check_open()
        check.agent_id(agent_id)
        with self._core.lock:
            self._hints.unhold(agent_id)

    def _tracked(
        self, agent_id: str, run: Iterator[str | ChatResult], tools: Sequence[Mapping[str, Any]] | None,
        fmt: ToolFormat | None,
    ) -> Iterator[str | ChatResult]:
        """`run` (one call's stream), counting its hint hit and holding the agent after a tool call."""
        core, hints = self._core, self._hints
        with core.lock:
            a = core.agents.get(agent_id)
            hints.arrive(agent_id, resident=a is not None and a.seq is not None,
                         has_state=a is not None and (a.seq is not None or a.tier in core.tiers))
        names = _tool_names(tools) if core.config.hints else []
        try:
            for item in run:
                if isinstance(item, ChatResult):
                    # before the turn's housekeeping runs (it resumes after this yield):
                    # a prefetch it starts must already see the hold
                    with core.lock:
                        hints.learn(item)
                        a = core.agents.get(agent_id)
                        if names and fmt is not None and a is not None and fmt.find(item.text, names) is not None:
                            hints.hold(agent_id, hints.default_ttl(a))
                yield item
        finally:
            close = getattr(run, "close", None)
            if close is not None:
                close()
