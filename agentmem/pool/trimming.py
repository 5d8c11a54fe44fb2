"""Trimming an agent to its token budget: the eviction policy picks, this module removes.

`Trimmer.evict` asks the agent's eviction strategy which token ranges to drop,
has the agent's sequence drop them (`AgentSeq.evict`: the cells removed, each kept
segment shifted once, the ledger marked) and writes the evicted text as recall
rows with their vectors (searchable by meaning and by keyword through `MemoryPool.recall`),
and — with `PoolConfig.recall_kv` — the cells of the spans worth splicing back
(`agentmem.pool.kvcapture`), copied out before the sequence drops them.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from agentmem.engine.chat_format import REGIONS
from agentmem.policy.view import LedgerView
from agentmem.pool.kvcapture import SpanCapture
from agentmem.pool.state import AgentState, PoolCore

__all__ = ["Trimmer"]

logger = logging.getLogger(__name__)


class Trimmer:
    """Runs the eviction policy on resident agents (lock held)."""

    def __init__(self, core: PoolCore, span_kv: SpanCapture) -> None:
        self.core = core
        self.span_kv = span_kv  # recall as KV: captures evicted spans' cells (does nothing where it is off)

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
        assert a.kv is not None, f"{a.id=}"
        captured = self.span_kv.capture(a, ranges)  # recall_kv: the cells worth keeping, before they go
        hist = a.kv.evict(ranges)
        ids, rows = self._archive_text(a, hist)
        if captured:
            self.span_kv.store(a, ids, rows, captured)
        a.counters["evictions"] += 1
        a.counters["evicted_tokens"] += int(hist.size)
        core.totals["evictions"] += 1
        core.totals["evicted_tokens"] += int(hist.size)
        dt = time.perf_counter() - t0
        logger.debug("agent %r: evicted %d tokens in %d ranges (%.2f ms)", a.id, hist.size, len(ranges), 1e3 * dt)
        return dt

    def _archive_text(self, a: AgentState, hist: np.ndarray) -> tuple[list[int], list[tuple[int, int, str, str]]]:
        """Evicted text to the recall store, one row per contiguous run of one message; the rows' ids and the rows."""
        led = a.ledger
        regs = led.regions
        rows = []
        for run in led.message_runs(hist):
            text = self.core.model.detokenize(led.tokens[run].tolist())
            rows.append((int(run[0]), int(run[-1]) + 1, REGIONS[regs[run[0]]], text))
        ids = self.core.recall.add(a.id, rows) if rows else []  # with their vectors, in one transaction
        counts = np.bincount(regs[hist], minlength=len(REGIONS))
        for i, c in enumerate(counts):
            if c:
                a.evicted_regions[REGIONS[i]] = a.evicted_regions.get(REGIONS[i], 0) + int(c)
        return ids, rows
