"""Agents' references to shared KV blocks: join, leave, where a block's bytes are kept.

A block is a shared prefix's cells stored once (`BlockStore` owns the bytes and
reference counts). `BlockRefs` ties agents to blocks, drops a block's RAM copy
once only archived members need it, reads it back from the archive, and cuts an
agent's state at its block (`split`) and joins a parked state with it again (`joined`).
"""

from __future__ import annotations

import logging

import numpy as np

from agentmem.errors import AgentMemError, StateError
from agentmem.codec import join_state, split_state
from agentmem.memory.parking import ParkedState
from agentmem.memory.shared import KVBlock
from agentmem.pool.state import AgentState, PoolCore

__all__ = ["BlockRefs"]

logger = logging.getLogger(__name__)


class BlockRefs:
    """Membership of agents in shared blocks (lock held)."""

    def __init__(self, core: PoolCore) -> None:
        self.core = core

    def of(self, a: AgentState) -> KVBlock | None:
        """The block `a` references, if any."""
        return self.core.blocks.get(a.block) if a.block else None

    def join(self, a: AgentState, b: KVBlock) -> None:
        """`a` references `b` (leaving its previous block)."""
        if a.block == b.id:
            return
        self.leave(a)
        self.core.blocks.acquire(b.id, a.id)
        a.block = b.id

    def leave(self, a: AgentState) -> None:
        """`a` stops referencing its block (its stored states must no longer need it)."""
        if a.block is None:
            return
        bid, a.block = a.block, None
        if self.core.blocks.release(bid, a.id):
            self.core.totals["blocks_freed"] += 1
            logger.debug("shared block %s freed (no agent references it)", bid)
        else:
            b = self.core.blocks.get(bid)
            if b is not None:
                self.trim(b)

    def leave_below(self, a: AgentState, n_live: int) -> None:
        """`a` leaves its block when its cells no longer cover the block (kept < block tokens)."""
        if a.block is not None:
            b = self.core.blocks.get(a.block)
            if b is None or n_live < b.n_tokens:
                self.leave(a)

    def trim(self, b: KVBlock, *, archived: AgentState | None = None) -> None:
        """Drop the RAM copy of a block when only archived agents (and `archived`) need it."""
        core = self.core
        durable = core.tiers.durable
        if b.data is None or core.archive is None or durable is None:
            return
        for x in b.refs:
            m = core.agents.get(x)
            if m is not None and m is not archived and (m.seq is not None or m.tier != durable.name):
                return
        if core.archive.has_shared_block(b.id):
            b.data = None

    def data(self, b: KVBlock) -> np.ndarray:
        """The block's f16 cells, read back from the archive when RAM no longer holds them."""
        if b.data is None:
            archive = self.core.archive
            got = archive.get_shared_block(b.id) if archive is not None else None  # CodecError if corrupt
            if got is None:
                raise StateError(f"shared block {b.id!r} is neither in RAM nor in the archive")
            b.data = np.frombuffer(got.blob, dtype=np.uint8)
        return b.data

    def archive(self, b: KVBlock) -> None:
        """Store the block in the archive (once)."""
        archive = self.core.archive
        assert archive is not None
        if not archive.has_shared_block(b.id):
            archive.put_shared_block(b.id, self.data(b), n_tokens=b.n_tokens, fingerprint=self.core.fingerprint)

    def new(self, a: AgentState) -> KVBlock:
        """A block of all of `a`'s cells (`a` resident, its ledger all live)."""
        core = self.core
        assert a.kv is not None, f"{a.id=}"
        b = core.blocks.create(a.ledger.tokens[: a.ledger.n_live], a.kv.capture())
        core.totals["blocks_created"] += 1
        logger.debug("shared block %s: %d tokens, %.1f MiB", b.id, b.n_tokens, b.nbytes / 2**20)
        return b

    def split(self, a: AgentState, blob: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """`a`'s blob without its block's cells (+ order), or the blob whole when it cannot be cut."""
        b = self.of(a)
        if b is None:
            return blob, None
        try:
            cut = split_state(blob, self.data(b), b.n_tokens)
        except AgentMemError as exc:
            logger.debug("agent %r: cannot cut its state at block %s (%s)", a.id, b.id, exc)
            cut = None
        if cut is None:
            self.core.totals["block_split_misses"] += 1
            return blob, None
        self.core.totals["block_splits"] += 1
        return cut

    def joined(self, stored: ParkedState) -> np.ndarray:
        """The f16 blob of a parked state, joined with its shared block's cells when it was cut at one.

        Raises:
            StateError: the block is gone.
        """
        core = self.core
        blob = core.codec(stored.codec).decode(stored) if stored.codec != "f16" else stored.data
        if stored.block is None:
            return blob
        b = core.blocks.get(stored.block)
        if b is None or stored.order is None:
            raise StateError(f"shared block {stored.block!r} of a parked state is gone")
        return join_state(self.data(b), blob, stored.order)
