"""Byte budgets of the WARM and COLD tiers, applied with watermarks (hysteresis).

The placement policy owns the order (who is demoted first); `Budgets` owns the
bytes: it measures each tier (shared blocks counted where they are kept) and
demotes or drops states until a tier is back under its low watermark.
"""

from __future__ import annotations

import logging

from agentmem.errors import AgentMemError
from agentmem.pool.hints import Hints
from agentmem.pool.mover import Mover
from agentmem.pool.state import AgentState, PoolCore

__all__ = ["Budgets"]

logger = logging.getLogger(__name__)


class Budgets:
    """Keeps WARM and COLD within `warm_budget_bytes` / `cold_budget_bytes` (lock held).

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
        """Apply the byte budgets of WARM and COLD with hysteresis.

        With `urgent_only` (on a call's critical path) only a tier above its
        budget itself is rebalanced; crossing the high watermark is handled after
        the call, so demotion I/O does not delay a reply. Off the call path, WARM
        also keeps room for the largest state a switch could park next, so that
        park does not push it over the budget mid-call. Under an expected order the
        state parked next is known (`next_out`): room is kept for it only when the
        next call needs a sequence, and made only from states whose next use is
        further away than its own — when it is the one needed last, nothing sooner
        is given up for it (its park, over the budget, demotes it first).
        """
        core = self.core
        cfg = core.config
        for tier, budget in (("warm", cfg.warm_budget_bytes), ("cold", cfg.cold_budget_bytes)):
            if not budget or tier not in core.tiers:
                continue
            high, low = cfg.watermark_high * budget, cfg.watermark_low * budget
            out = self.next_out() if tier == "warm" and not urgent_only and self.hints.active else None
            if tier == "warm" and not urgent_only:
                if self.hints.active:  # the next park is known: room for it, or none needed
                    room = core.ctx.state_size(out.seq) if out is not None and out.seq is not None else 0
                else:
                    room = self.next_park_bytes()
                high, low = min(high, budget - room), min(low, budget - room)
            t = core.tiers[tier]
            members = [core.agents[x] for x in t.agents() if x in core.agents and core.agents[x].tier == tier]
            # a busy agent's state is on its way up (its call is restoring it): not counted
            leaving = sum(t.nbytes(x.id) for x in members if x.busy)

            def used() -> int:
                return self.tier_bytes(tier) - leaving

            if used() <= (budget if urgent_only else high):
                continue
            infos = [self.hints.info(core, x) for x in members if not x.busy]
            if out is not None:
                infos.append(self.hints.info(core, out))
            for info in core.placement.release_order(infos):
                if out is not None and info.id == out.id:
                    break  # the rest is needed sooner than the state the room is for
                if used() <= (cfg.watermark_low * budget if urgent_only else low):
                    break
                x = core.agents[info.id]
                if tier == "warm" and "cold" in core.tiers:
                    try:
                        self.mover.demote(x, "cold")
                        continue
                    except AgentMemError as exc:
                        logger.warning("demotion of %r to cold failed (%s); dropping its state", x.id, exc)
                logger.info("%s budget exceeded: dropping the state of %r (it will re-prefill)", tier, x.id)
                self.mover.drop(x)

    def tier_bytes(self, tier: str) -> int:
        """Bytes a tier holds, shared blocks included where they are kept (RAM / the archive)."""
        core = self.core
        n = core.tiers[tier].total_bytes()
        if tier == "warm":
            return n + core.blocks.ram_bytes()
        assert core.archive is not None
        return n + sum(b.n_bytes for b in core.archive.list_shared_blocks())

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
                if x.seq is not None and not x.busy and x.ledger.n_live and x.id not in first]
        if not idle:
            return None
        out = core.placement.release_order([hints.info(core, x) for x in idle])[0]
        return core.agents[out.id]

    def next_park_bytes(self) -> int:
        """f16 bytes of the largest idle resident state: what the next switch may park."""
        core = self.core
        sizes = [
            core.ctx.state_size(x.seq) for x in core.agents.values() if x.seq is not None and not x.busy and x.ledger.n_live
        ]
        return max(sizes, default=0)
