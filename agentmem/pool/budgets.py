"""Byte budgets of the tiers, applied down the chain with watermarks (hysteresis).

The placement policy owns the order (who is demoted first; a tier may order its
own states: `Tier.release_order`); `Budgets` owns the bytes: it walks the tier
chain fastest first, measures each tier (shared blocks counted where they are
kept) and demotes its states into the tier below — the last tier drops them —
until it is back under its low watermark.
"""

from __future__ import annotations

import logging

from agentmem.errors import AgentMemError
from agentmem.memory.tiers import Tier
from agentmem.pool.hints import Hints
from agentmem.pool.mover import Mover
from agentmem.pool.state import AgentState, PoolCore

__all__ = ["Budgets"]

logger = logging.getLogger(__name__)


class Budgets:
    """Keeps every tier within its `budget_bytes` (`warm_budget_bytes`, `cold_budget_bytes`; lock held).

    Args:
        core: the pool's shared state.
        mover: moves states between tiers.
        hints: the workflow's hints: under an expected order the state demoted (or
            dropped) first is the one whose next use is furthest away, held agents
            last — the rule that gives up live sequences, applied one tier down.
    """

    def __init__(self, core: PoolCore, mover: Mover, hints: Hints | None = None) -> None:
        self.core = core
        self.mover = mover
        self.hints = hints or Hints()

    def rebalance(self, *, urgent_only: bool = False) -> None:
        """Apply the byte budget of every tier, fastest first, with hysteresis.

        With `urgent_only` (on a call's critical path) only a tier above its
        budget itself is rebalanced; crossing the high watermark is handled after
        the call, so demotion I/O does not delay a reply. Off the call path, the
        first tier (WARM, where parks go) also keeps room for the largest state a switch could park next, so that
        park does not push it over the budget mid-call. Under an expected order the
        state parked next is known (`next_out`): room is kept for it only when the
        next call needs a sequence, and made only from states whose next use is
        further away than its own — when it is the one needed last, nothing sooner
        is given up for it (its park, over the budget, demotes it first).
        """
        for t in self.core.tiers.values():
            if t.budget_bytes:
                self._fit(t, urgent_only=urgent_only)

    def _fit(self, t: Tier, *, urgent_only: bool) -> None:
        """Bring tier `t` under its budget: its states leave in release order, into the tier below or dropped."""
        core = self.core
        cfg = core.config
        budget = t.budget_bytes
        high, low = cfg.watermark_high * budget, cfg.watermark_low * budget
        parks_here = t is core.tiers.first and not urgent_only
        out = self.next_out() if parks_here and self.hints.active else None
        if parks_here:
            if self.hints.active:  # the next park is known: room for it, or none needed
                room = core.ctx.state_size(out.seq) if out is not None and out.seq is not None else 0
            else:
                room = self.next_park_bytes()
            high, low = min(high, budget - room), min(low, budget - room)
        members = [core.agents[x] for x in t.agents() if x in core.agents and core.agents[x].tier == t.name]
        # a held agent's state is on its way up (its call is restoring it): not counted
        leaving = sum(t.nbytes(x.id) for x in members if x.held)

        def used() -> int:
            return self.tier_bytes(t) - leaving

        if used() <= (budget if urgent_only else high):
            return
        infos = [self.hints.info(core, x) for x in members if not x.held]
        if out is not None:
            infos.append(self.hints.info(core, out))
        below = core.tiers.below(t)
        for info in t.release_order(infos, core.placement.release_order):
            if out is not None and info.id == out.id:
                break  # the rest is needed sooner than the state the room is for
            if used() <= (cfg.watermark_low * budget if urgent_only else low):
                break
            x = core.agents[info.id]
            if below is not None:
                try:
                    self.mover.demote(x, below.name)
                    continue
                except AgentMemError as exc:
                    logger.warning("demotion of %r to %s failed (%s); dropping its state", x.id, below.name, exc)
            logger.info("%s budget exceeded: dropping the state of %r (it will re-prefill)", t.name, x.id)
            self.mover.drop(x)

    def tier_bytes(self, t: Tier) -> int:
        """Bytes tier `t` holds, shared blocks included where they are kept (RAM / the archive)."""
        return t.total_bytes() + t.shared_bytes(self.core.blocks)

    def next_out(self) -> AgentState | None:
        """Under an expected order: the idle resident agent the next call would park, or None.

        None when the next step's agents (of every scope) are all resident (the next
        call parks nobody); else the first idle resident agent (with cells) in release
        order, the next step's own agents excepted.
        """
        core, hints = self.core, self.hints
        first = hints.next_step()
        if all(x in core.agents and core.agents[x].seq is not None for x in first):
            return None
        idle = [x for x in core.agents.values()
                if x.seq is not None and not x.held and x.ledger.n_live and x.id not in first]
        if not idle:
            return None
        out = core.placement.release_order([hints.info(core, x) for x in idle])[0]
        return core.agents[out.id]

    def next_park_bytes(self) -> int:
        """f16 bytes of the largest idle resident state: what the next switch may park."""
        core = self.core
        sizes = [
            core.ctx.state_size(x.seq) for x in core.agents.values()
            if x.seq is not None and not x.held and x.ledger.n_live
        ]
        return max(sizes, default=0)
