"""Trimming an agent to its token budget: the eviction policy picks, this module removes.

`Trimmer.evict` asks the agent's eviction strategy which token ranges to drop,
removes them from the sequence (`seq_rm`), shifts each kept segment once
(`seq_add`), marks them evicted in the ledger and writes the evicted text as
recall rows (full-text searchable through `MemoryPool.recall`).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from agentmem.engine.chat_format import REGIONS
from agentmem.policy.view import LedgerView
from agentmem.pool.blocks import BlockRefs
from agentmem.pool.sharing import Sharing
from agentmem.pool.state import AgentState, PoolCore

__all__ = ["Trimmer"]

logger = logging.getLogger(__name__)


class Trimmer:
    """Runs the eviction policy on resident agents (lock held)."""

    def __init__(self, core: PoolCore, blocks: BlockRefs, sharing: Sharing) -> None:
        self.core = core
        self.blocks = blocks
        self.sharing = sharing

    def view(self, a: AgentState) -> LedgerView:
        """What the eviction policy sees of `a`'s live tokens."""
        led = a.ledger
        return LedgerView.from_ledger(
            led.tokens, led.regions, led.pinned, led.messages, led.live, n_messages=a.n_messages
        )

    def evict(self, a: AgentState, target: int) -> float:
        """Evict `a` down to `target` live tokens with its policy; returns seconds spent."""
        core = self.core
        t0 = time.perf_counter()
        policy = core.eviction_policy(a.eviction or core.config.eviction)
        ranges = policy.select(self.view(a), target=target, block=core.config.eviction_block)
        if not ranges:
            return time.perf_counter() - t0
        assert a.seq is not None, f"{a.id=}"
        self.blocks.leave_below(a, ranges[0][0])
        if ranges[0][0] < a.shared_upto:
            # shifting cells other sequences share would move them for those too
            self.sharing.privatize(a)
        self._remove(a.seq, ranges)
        hist = a.ledger.evict_live(ranges)
        self._archive_text(a, hist)
        a.counters["evictions"] += 1
        a.counters["evicted_tokens"] += int(hist.size)
        core.totals["evictions"] += 1
        core.totals["evicted_tokens"] += int(hist.size)
        dt = time.perf_counter() - t0
        logger.debug("agent %r: evicted %d tokens in %d ranges (%.2f ms)", a.id, hist.size, len(ranges), 1e3 * dt)
        return dt

    def _remove(self, seq: int, ranges: list[tuple[int, int]]) -> None:
        """Remove every range, then shift each kept segment once by what was removed before it.

        Every cell moves once (one `seq_add` per range, each shifting everything
        after it, costs O(ranges x cells) in llama.cpp's position maps: 0.6 ms per
        call at 2k).
        """
        ctx = self.core.ctx
        for s, e in ranges:
            ctx.seq_rm(seq, s, e)
        removed = 0
        for k, (s, e) in enumerate(ranges):
            removed += e - s
            nxt = ranges[k + 1][0] if k + 1 < len(ranges) else -1
            if nxt == -1 or nxt > e:
                ctx.seq_add(seq, e, nxt, -removed)

    def _archive_text(self, a: AgentState, hist: np.ndarray) -> None:
        """Evicted text to the recall store, one row per contiguous run of one message."""
        led = a.ledger
        msg_of = led.messages[hist]
        cuts = np.flatnonzero((np.diff(hist) != 1) | (np.diff(msg_of) != 0)) + 1
        regs = led.regions
        rows = []
        for run in np.split(hist, cuts):
            if run.size:
                text = self.core.model.detokenize(led.tokens[run].tolist())
                rows.append((int(run[0]), int(run[-1]) + 1, REGIONS[regs[run[0]]], text))
        if rows:
            self.core.recall_store.add_evicted_spans(a.id, rows)
        counts = np.bincount(regs[hist], minlength=len(REGIONS))
        for i, c in enumerate(counts):
            if c:
                a.evicted_regions[REGIONS[i]] = a.evicted_regions.get(REGIONS[i], 0) + int(c)
