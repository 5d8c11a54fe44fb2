"""Moving an agent's KV state between tiers: park, restore, demote, drop — one method each.

`Mover` decides where a state goes; the agent's sequence (`AgentSeq`,
`agentmem.pool.sequence`) takes it out or puts it in. `make_resident` is the one
way a call gets its agent a sequence with its state loaded; it returns a small
`Placement` and falls back to a re-prefill when a stored state is unusable. A
restore of a state cut at a shared block links the block's cells from a live
member when it can (no copy).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from agentmem.errors import AgentMemError, FingerprintMismatch, StateError
from agentmem.memory.parking import ParkedState
from agentmem.pool import residence
from agentmem.pool.blocks import BlockRefs
from agentmem.pool.persist import Persister
from agentmem.pool.residency import Residency
from agentmem.pool.sequence import Sequences
from agentmem.pool.state import AgentState, PoolCore

__all__ = ["Mover", "Placement"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Placement:
    """How `Mover.make_resident` found an agent.

    Attributes:
        how: `"reused"` (it was resident), `"restored"` (its parked state was
            loaded), `"fresh"` (nothing usable was stored: the call prefills), or
            `"busy"` (a prefetch found no sequence it may take).
        source: the name of the tier a restore came from, else `None`.
    """

    how: str
    source: str | None = None


class Mover:
    """Transitions of agents' states between HOT and the tiers of the chain (lock held).

    Every change of an agent's place goes through `agentmem.pool.residence`;
    which tier is which is the chain's (`core.tiers`): parks go into its first
    tier unless told otherwise, a durable tier (the archive) is written through
    the `Persister` with the agent's ledger.
    """

    def __init__(self, core: PoolCore, residency: Residency, blocks: BlockRefs, persist: Persister) -> None:
        self.core = core
        self.residency = residency
        self.blocks = blocks
        self.persist = persist
        self.seqs: Sequences = residency.seqs

    # ------------------------------------------------------------------ the door
    def make_resident(self, a: AgentState, *, prefetch: bool = False) -> Placement:
        """Give `a` a sequence and load its parked state into it.

        A failed restore empties the sequence and drops the stored state: the
        caller re-prefills from the messages (`how="fresh"`).
        """
        with residence.pinned(a):  # on its way up: a park this causes must not give `a`'s own state up (a prefetch)
            got = self.residency.acquire(a, prefetch=prefetch)
        if got != "assigned":
            return Placement(got)
        if a.tier not in self.core.tiers:
            return Placement("fresh")
        src = a.tier
        try:
            self.restore(a)
        except AgentMemError as exc:
            self._restore_failed(a, src, exc)
            return Placement("fresh")
        core = self.core
        core.tier_hits[src] += 1
        a.counters["restores"] += 1
        core.totals["restores"] += 1
        return Placement("restored", src)

    def _restore_failed(self, a: AgentState, src: str, exc: AgentMemError) -> None:
        core = self.core
        assert a.kv is not None
        logger.warning("restore of agent %r from %s failed (%s); falling back to re-prefill", a.id, src, exc)
        a.kv.clear()
        lost = a.ledger.n_live
        self.drop(a)
        a.counters["restore_failures"] += 1
        core.totals["restore_failures"] += 1
        if isinstance(exc, FingerprintMismatch) and lost:
            logger.warning("agent %r: re-prefilling %d tokens from the stored ledger", a.id, lost)

    # ------------------------------------------------------------------ transitions
    def move(self, a: AgentState, dst: str) -> None:
        """Park a resident `a` into `dst`, or demote its parked state to `dst`."""
        if a.seq is not None:
            self.park(a, dst)
        else:
            self.demote(a, dst)

    def park(self, a: AgentState, dst: str | None = None) -> None:
        """Take resident `a`'s state out of its sequence into tier `dst` (the chain's first by default).

        Its sequence is emptied and returned to the free list.
        """
        core = self.core
        assert a.kv is not None, f"{a.id=}"
        dst = core.tiers.first.name if dst is None else dst
        codec = self._codec(a, dst)
        if a.ledger.n_live:
            self._store(a, dst, a.kv.checkpointed(self.capture(a, codec), keep_cells=False))
        else:
            self.blocks.leave(a)
        a.kv.clear()
        self.residency.release(a)
        a.counters["parks"] += 1
        core.totals["parks"] += 1

    def restore(self, a: AgentState) -> None:
        """Load `a`'s parked state into its (assigned, empty) sequence.

        Raises:
            StateError: the stored state is missing or unusable (the caller falls
                back to re-prefill).
        """
        core = self.core
        assert a.kv is not None, f"{a.id=}"
        src = core.tiers.get(a.tier)
        stored = src.get(a.id) if src is not None else None
        if src is None or stored is None:
            raise StateError(f"no stored state for agent {a.id!r} in tier {a.tier!r}")
        # a rejected blob: a wrong layout, or not enough free cells even after parking idle agents
        if not (stored.block is not None and self._restore_linked(a, stored)) and not a.kv.load(
                self.blocks.joined(stored), stored):
            raise StateError("llama_state_seq_set_data rejected the blob")
        if not src.durable:  # a durable tier keeps its copy (the archive's row stays valid until the next write)
            src.delete(a.id)
        residence.emptied(a)

    def demote(self, a: AgentState, dst: str) -> None:
        """Move parked `a`'s state from its tier to `dst`, transcoding to `dst`'s codec."""
        core = self.core
        src = core.tiers.get(a.tier)
        codec = self._codec(a, dst)
        stored = src.get(a.id) if src is not None else None
        if src is None or stored is None:
            raise StateError(f"no stored state for agent {a.id!r} in tier {a.tier!r}")
        if stored.codec != codec:  # transcode through f16 (a cut state stays cut)
            blob = core.codec(stored.codec).decode(stored) if stored.codec != "f16" else stored.data
            stored = dataclasses.replace(
                core.codec(codec).encode(blob, n_tokens=stored.n_tokens),
                block=stored.block, order=stored.order, window_ckpt=stored.window_ckpt, window_order=stored.window_order,
            )
        self._store(a, dst, stored)
        if not src.durable:
            src.delete(a.id)
        a.counters["demotions"] += 1
        core.totals["demotions"] += 1

    def drop(self, a: AgentState) -> None:
        """Forget `a`'s stored state (its ledger is cleared: the next call prefills)."""
        for t in self.core.tiers.values():
            t.delete(a.id)
        residence.emptied(a)
        a.ledger.clear()
        self.blocks.leave(a)
        self.core.totals["drops"] += 1

    def _codec(self, a: AgentState, tier: str) -> str:
        """The codec `a`'s state gets in `tier` (the tier's, which follows the placement policy)."""
        core = self.core
        return core.tiers[tier].codec_for(core.info(a), core.placement.codec_for)

    def _store(self, a: AgentState, tier: str, state: ParkedState) -> None:
        t = self.core.tiers[tier]
        if t.durable:  # with the ledger, in one transaction
            self.persist.write(a, state)
        else:
            t.put(a.id, state)
        residence.parked_in(a, t.name, state.codec)
        if t.durable:
            b = self.blocks.of(a)
            if b is not None:
                self.blocks.trim(b, archived=a)  # its sequence, if any, is released next

    # ------------------------------------------------------------------ blobs
    def capture(self, a: AgentState, codec: str) -> ParkedState:
        """`a`'s live state, encoded with `codec`; only its private cells when it has a block."""
        core = self.core
        assert a.kv is not None, f"{a.id=}"
        blob, order = self.blocks.split(a, a.kv.capture())
        state = core.codec(codec).encode(blob, n_tokens=a.ledger.n_live)
        if order is None:
            self.blocks.leave(a)
            return state
        return dataclasses.replace(state, block=a.block, order=order)

    def _restore_linked(self, a: AgentState, stored: ParkedState) -> bool:
        """Restore a cut state with its block's cells *shared* from a live member (`AgentSeq.link`).

        No join, no copy of the prefix: the live cache keeps it once. False when no
        member can lend its cells (the caller restores the joined blob instead).
        """
        core = self.core
        assert a.kv is not None and stored.block is not None and stored.order is not None
        b = core.blocks.get(stored.block)
        if b is None or b.data is None or not core.ctx.params.kv_unified:
            return False  # (per-sequence streams: a seq_cp would copy whole streams)
        live = [x.kv for x in (core.agents.get(r) for r in b.refs if r != a.id)
                if x is not None and x.kv is not None and x.block == b.id]
        if not live:
            return False
        m = self.seqs.nearest(live)
        private = core.codec(stored.codec).decode(stored) if stored.codec != "f16" else stored.data
        with residence.pinned(m.agent):  # making room must not park the member whose cells are linked
            if not a.kv.link(m, b.n_tokens, stored, private):
                return False
        core.totals["linked_restores"] += 1
        return True

    # ------------------------------------------------------------------ whole agents
    def forget(self, a: AgentState) -> None:
        """Drop everything kept for idle `a`: sequence, parked states, archive rows, block, record."""
        core = self.core
        fenced = self.persist.fenced(a.id) if core.archive is not None else {}  # before anything is dropped
        self.discard(a)
        durable = core.tiers.durable
        if durable is not None:
            durable.delete(a.id)
        if core.archive is not None:
            core.archive.delete_agent(a.id, **fenced)

    def discard(self, a: AgentState) -> None:
        """Drop the local copy of idle `a` (sequence, volatile tiers' state, block, record); its archive rows stay.

        Cluster mode: another replica may have served `a` since, so the copy here
        may be stale; `Persister.load` reads it back as the archive holds it.
        """
        core = self.core
        if a.kv is not None:
            a.kv.clear()
            self.residency.release(a)
        for t in core.tiers.volatile:
            t.delete(a.id)
        self.blocks.leave(a)
        core.prefixes.remove(a.id)
        core.lines.drop(a.id)
        core.predictor.forget(a.id)
        del core.agents[a.id]

    def save_all(self, *, final: bool) -> dict[str, str]:
        """Ledgers and states to the archive; with `final` (closing) resident agents are parked there.

        Parking (unlike a live snapshot) also keeps a Gemma 3 agent's sliding-window
        checkpoint, so after a restart it can still roll back its last reply; a
        snapshot of an agent that stays resident keeps one too (`snapshot`).
        Each agent is stored on its own: one that cannot be stored is logged and
        skipped, the others are written. Returns `{agent id: reason}` of those skipped.
        """
        core = self.core
        failed: dict[str, str] = {}
        with core.lock:
            for a in list(core.agents.values()):
                if a.held:
                    continue
                try:
                    self.save(a, final=final)
                except AgentMemError as exc:
                    logger.error("could not store agent %r in the archive: %s", a.id, exc)
                    failed[a.id] = str(exc)
        return failed

    def save(self, a: AgentState, *, final: bool = False, state: bool = True) -> None:
        """One agent's ledger and state to the archive (with `final`, a resident agent is parked there).

        With `state=False` only the ledger is written and a stored state it no longer
        matches is dropped (lazy durability: the state follows when `a` is parked).
        """
        core = self.core
        durable = core.tiers.durable
        assert durable is not None, "saving needs an archive"
        if not state:
            self.persist.write(a, None, drop_state=a.tier != durable.name)
            return
        if final and a.seq is not None and a.ledger.n_live:
            try:
                self.park(a, durable.name)
                return
            except AgentMemError as exc:
                logger.warning("could not park %r in the archive (%s); saving a snapshot", a.id, exc)
        state = None
        if a.seq is not None and a.ledger.n_live:
            state = self.snapshot(a, self._codec(a, durable.name))
        elif a.tier in core.tiers and not core.tiers[a.tier].durable:
            state = core.tiers[a.tier].get(a.id)
        self.persist.write(a, state)

    def snapshot(self, a: AgentState, codec: str) -> ParkedState:
        """`capture` of a resident agent that stays resident, with its sliding-window checkpoint.

        Taking the checkpoint drops the reply's cells, so the sequence is reloaded
        from the full state afterwards (`AgentSeq.checkpointed`: its cells are then private to it).
        """
        assert a.kv is not None, f"{a.id=}"
        return a.kv.checkpointed(self.capture(a, codec), keep_cells=True)
