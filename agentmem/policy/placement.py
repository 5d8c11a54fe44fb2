"""Placement: which agent's state lives in which tier, and with which codec.

A placement policy is a small strategy object: given the agents of a tier it
returns a *keep score* per agent (low = demote first) and picks the codec a
state gets in a tier. The pool applies byte budgets with high/low watermarks
(hysteresis), so states do not ping-pong between tiers.

* ``lru``  — demote the least recently used; codecs as configured.
* ``lfu``  — demote the least frequently used (ties: the least recent); codecs as configured.
* ``cost`` — the default: keep value per byte from priority, predicted next use,
  use frequency and recency; background agents get compressed codecs.

>>> get_policy("lru").name
'lru'
>>> get_policy("fifo")
Traceback (most recent call last):
...
agentmem.errors.PolicyError: unknown placement policy 'fifo'; valid: cost, lfu, lru
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

from agentmem.errors import PolicyError
from agentmem.memory.tiers import WARM

__all__ = [
    "POLICIES", "PRIORITIES", "AgentInfo", "CostPolicy", "LFUPolicy", "LRUPolicy", "PlacementPolicy", "get_policy",
]

#: priority names -> weight (an int priority is used as is)
PRIORITIES: dict[str, int] = {"background": 0, "normal": 1, "foreground": 3}


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What a placement policy knows of one agent.

    Attributes:
        id: agent id.
        tier: ``hot``, ``warm`` or ``cold``.
        nbytes: bytes of its state in that tier (estimated for hot).
        n_tokens: live tokens.
        priority: weight (see `PRIORITIES`).
        idle_s: seconds since its last call.
        uses: calls so far.
        next_in: predicted calls until its next use (``math.inf`` = unknown).
        steps: calls until its next use by the workflow's hints (``MemoryPool.expect``;
            ``math.inf`` = not expected, or no hints).
        held: kept resident by a hold (``MemoryPool.hold``).
    """

    id: str
    tier: str
    nbytes: int
    n_tokens: int
    priority: int
    idle_s: float
    uses: int
    next_in: float
    steps: float = math.inf
    held: bool = False


class PlacementPolicy(abc.ABC):
    """Strategy: keep scores (low = demote first) and codecs per tier."""

    name = "base"

    def __init__(self, *, warm_codec: str = "f16", cold_codec: str = "q8_0/q4_0") -> None:
        self.warm_codec = warm_codec
        self.cold_codec = cold_codec

    @abc.abstractmethod
    def keep_score(self, agent: AgentInfo) -> float:
        """Higher = more worth keeping in a fast tier."""

    def demotion_order(self, agents: list[AgentInfo]) -> list[AgentInfo]:
        """Agents in the order they should be demoted (first = first out)."""
        return sorted(agents, key=lambda a: (self.keep_score(a), -a.nbytes, a.id))

    def codec_for(self, agent: AgentInfo, tier: str) -> str:
        """Codec of ``agent``'s state in ``tier`` (``warm`` or ``cold``)."""
        return self.warm_codec if tier == WARM else self.cold_codec

    def release_order(self, agents: list[AgentInfo]) -> list[AgentInfo]:
        """Agents in the order they give up their place (first = first out).

        The place is a live sequence (resident agents) or, one tier down, RAM (parked
        states demoted to COLD or dropped under `warm_budget_bytes`).

        Held agents come last. Before them, by the workflow's hints: the furthest next
        use first (KVFlow's steps-to-execution; an agent not expected counts as
        furthest of all); ties — and every agent when there are no hints — in
        `demotion_order` (the learned predictor, frequency, recency, bytes).

        >>> p = get_policy("lru")
        >>> a = [AgentInfo(x, "hot", 0, 0, 1, idle, 1, math.inf, steps, held)
        ...      for x, idle, steps, held in [("a", 9.0, 1.0, False), ("b", 1.0, 3.0, False),
        ...                                   ("c", 5.0, math.inf, True)]]
        >>> [x.id for x in p.release_order(a)]
        ['b', 'a', 'c']
        """
        rank = {x.id: i for i, x in enumerate(self.demotion_order(agents))}
        return sorted(agents, key=lambda x: (x.held, -x.steps, rank[x.id]))


class LRUPolicy(PlacementPolicy):
    """Least recently used goes first."""

    name = "lru"

    def keep_score(self, agent: AgentInfo) -> float:
        return -agent.idle_s


class LFUPolicy(PlacementPolicy):
    """Least frequently used goes first; among equals, the least recently used.

    >>> p = LFUPolicy()
    >>> a = [AgentInfo(x, "warm", 0, 0, 1, idle, uses, math.inf) for x, idle, uses in
    ...      [("a", 1.0, 5), ("b", 9.0, 2), ("c", 1.0, 2)]]
    >>> [x.id for x in p.demotion_order(a)]
    ['b', 'c', 'a']
    """

    name = "lfu"

    def keep_score(self, agent: AgentInfo) -> float:
        return agent.uses + 1.0 / (2.0 + agent.idle_s)  # the fraction (< 1) only breaks ties


class CostPolicy(PlacementPolicy):
    """Value per byte: priority × chance of use soon, over the bytes it holds.

    ``chance of use soon`` combines the predicted distance to the next call
    (from the prefetch predictor), the call frequency and the idle time. A
    foreground agent parks in ``f16`` (exact, fastest restore); background agents
    park with ``background_codec`` even in RAM.
    """

    name = "cost"

    def __init__(self, *, warm_codec: str = "f16", cold_codec: str = "q8_0/q4_0", background_codec: str = "q8_0") -> None:
        super().__init__(warm_codec=warm_codec, cold_codec=cold_codec)
        self.background_codec = background_codec

    def keep_score(self, agent: AgentInfo) -> float:
        soon = 1.0 / (1.0 + agent.next_in) if math.isfinite(agent.next_in) else 0.0
        freq = math.log1p(agent.uses) / (1.0 + agent.idle_s / 60.0)  # idle measured in minutes
        value = (1 + agent.priority) * (soon + freq + 1e-6)
        return value / max(1.0, agent.nbytes / 1e6)

    def codec_for(self, agent: AgentInfo, tier: str) -> str:
        if tier == WARM:
            if agent.priority >= PRIORITIES["foreground"]:
                return "f16"
            if agent.priority <= PRIORITIES["background"]:
                return self.background_codec
            return self.warm_codec
        return self.cold_codec


POLICIES: dict[str, type[PlacementPolicy]] = {"lru": LRUPolicy, "lfu": LFUPolicy, "cost": CostPolicy}


def get_policy(name: str, **params: object) -> PlacementPolicy:
    """A placement policy by name; the error lists the valid names."""
    cls = POLICIES.get(name)
    if cls is None:
        raise PolicyError(f"unknown placement policy {name!r}; valid: {', '.join(sorted(POLICIES))}")
    return cls(**params)  # type: ignore[arg-type]


def priority_weight(priority: int | str) -> int:
    """``"foreground"``/``"normal"``/``"background"`` or an int -> weight."""
    if isinstance(priority, bool) or not isinstance(priority, (int, str)):
        raise PolicyError(f"priority must be an int or one of {sorted(PRIORITIES)}, got {priority!r}")
    if isinstance(priority, str):
        if priority not in PRIORITIES:
            raise PolicyError(f"unknown priority {priority!r}; valid: {', '.join(sorted(PRIORITIES))} or an int")
        return PRIORITIES[priority]
    return priority
