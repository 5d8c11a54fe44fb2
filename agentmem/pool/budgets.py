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
from agentmem.pool.state import PoolCore

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
        park does not push it over the budget mid-call.
        """
        core = self.core
        cfg = core.config
        for tier, budget in (("warm", cfg.warm_budget_bytes), ("cold", cfg.cold_budget_bytes)):
            if not budget or tier not in core.tiers:
                continue
            high, low = cfg.watermark_high * budget, cfg.watermark_low * budget
            if tier == "warm" and not urgent_only:
                room = self.next_park_bytes()
                high, low = min(high, budget - room), min(low, budget - room)
            if self.tier_bytes(tier) <= (budget if urgent_only else high):
                continue
            t = core.tiers[tier]
            members = [core.agents[x] for x in t.agents() if x in core.agents and core.agents[x].tier == tier]
            order = core.placement.release_order([self.hints.info(core, x) for x in members if not x.busy])
            for info in order:
                if self.tier_bytes(tier) <= (cfg.watermark_low * budget if urgent_only else low):
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

    def next_park_bytes(self) -> int:
        """f16 bytes of the largest idle resident state: what the next switch may park."""
        core = self.core
        sizes = [
            core.ctx.state_size(x.seq) for x in core.agents.values() if x.seq is not None and not x.busy and x.ledger.n_live
        ]
        return max(sizes, default=0)
