"""Which agents hold the context's sequences, who gets the next one, and making room.

`Residency` hands out sequences: agents waiting for one are served by priority,
then arrival; when none is free an idle resident agent is parked (through the
callable it was given, so this module needs nothing above it); which one is the
placement policy's `release_order`, told the workflow's hints (steps-to-next-use,
holds). `fit` is the one
retry-when-full loop of the pool: try, and while llama.cpp has no free cells,
park an idle agent and try again.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Callable

from agentmem.pool import residence
from agentmem.pool.hints import MAX_EXPECTED, Hints
from agentmem.pool.state import AgentState, PoolCore

if TYPE_CHECKING:
    from agentmem.pool.sequence import Sequences

__all__ = ["Residency"]

logger = logging.getLogger(__name__)


class Residency:
    """Sequences of the shared context and the agents that hold them (lock held throughout).

    Args:
        core: the pool's shared state.
        seqs: opens the door to a sequence (`AgentSeq`) for the agent it is assigned to.
        park: parks an idle resident agent (releasing its sequence); raises
            `AgentMemError` when it cannot.
        hints: the workflow's hints (expected order, holds); none by default.
    """

    def __init__(self, core: PoolCore, seqs: Sequences, park: Callable[[AgentState], None],
                 hints: Hints | None = None) -> None:
        self.core = core
        self.seqs = seqs
        self._park = park
        self.hints = hints or Hints()
        n = core.config.resident_agents
        self.free: list[int] = list(range(n - 1, -1, -1))
        self.waiters: dict[str, tuple[int, int]] = {}  # agent -> (priority, -arrival)
        self._ticket = 0

    def _victim(self, keep: AgentState, *, with_cells: bool, prefetch: bool = False) -> AgentState | None:
        """The idle resident agent the placement policy would park first (never `keep`).

        For a prefetch of `keep` only an agent that is not held and, under hints, is
        expected later than `keep` qualifies (a prefetch never delays a sooner call).
        """
        core, hints = self.core, self.hints
        idle = [
            x for x in core.agents.values()
            if x.seq is not None and not x.held and x is not keep and (x.ledger.n_live or not with_cells)
        ]
        if not idle:
            return None
        infos = [hints.info(core, x) for x in idle]
        first = core.placement.release_order(infos)[0]
        if prefetch:
            mine = hints.steps(keep.id)
            if mine == math.inf and hints.held(keep.id):
                mine = float(MAX_EXPECTED + 1)  # held but not listed: may displace only agents not expected
            if first.held or (hints.active and first.steps <= mine):
                return None
        return core.agents[first.id]

    def acquire(self, a: AgentState, *, prefetch: bool = False) -> str:
        """Give `a` a sequence: `"reused"` (it had one), `"assigned"`, or `"busy"` (prefetch only).

        A prefetch never waits and yields to calls waiting for a sequence.
        """
        if a.seq is not None:
            return "reused"
        if prefetch and self.waiters:
            return "busy"  # calls waiting for a sequence come first
        core = self.core
        # Agents waiting for a sequence are served by priority (then arrival): only the
        # first in that order may take a free sequence or park an idle agent.
        self._ticket += 1
        self.waiters[a.id] = (a.priority, -self._ticket)
        try:
            while True:
                if self.waiters[a.id] == max(self.waiters.values()):
                    if self.free:
                        break
                    victim = self._victim(a, with_cells=False, prefetch=prefetch)
                    if victim is not None:
                        if victim.prefetched:
                            core.totals["prefetch_wasted"] += 1
                            victim.prefetched = False
                        self._park(victim)
                        break
                if prefetch:
                    return "busy"
                logger.debug("agent %r waits for a free sequence", a.id)
                core.totals["seq_waits"] += 1
                core.cond.wait()
        finally:
            del self.waiters[a.id]
            core.cond.notify_all()
        residence.seat(a, self.seqs.open(a, self.free.pop(), fit=lambda attempt: self.fit(a, attempt)))
        return "assigned"

    def release(self, a: AgentState) -> None:
        """Return `a`'s sequence (already emptied by the caller: `AgentSeq.clear`) to the free list."""
        self.free.append(residence.unseat(a))
        self.core.cond.notify_all()

    def make_room(self, keep: AgentState) -> bool:
        """Park one idle resident agent (not `keep`) to free KV cells; False when none is idle."""
        victim = self._victim(keep, with_cells=True)
        if victim is None:
            return False
        self._park(victim)
        return True

    def fit(self, keep: AgentState, attempt: Callable[[], bool]) -> bool:
        """Run `attempt` until it succeeds, parking idle agents (never `keep`) between tries.

        `attempt` returns False when llama.cpp found no free cells. Returns False
        when it still fails and no idle agent is left to park.
        """
        while not attempt():
            if not self.make_room(keep):
                return False
        return True
