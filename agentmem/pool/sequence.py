"""The one door to each resident agent's KV: `AgentSeq`, and `Sequences`, which opens them.

An `AgentSeq` exists while an agent holds a sequence of the shared context (it is
opened when `Residency` assigns one and dropped when the sequence is released). It
is the only code besides the decoder's decode calls (`agentmem.pool.decoder`) that
changes or captures the KV of that sequence, and it changes the cells and the
agent's ledger together: cut, evict, load. Its verbs, as llama.cpp's server slot
has `prompt_save` / `prompt_load` / `prompt_clear`:

* `can_cut(n)` / `cut(n)` — keep the first `n` history tokens (rolling back to the
  sliding-window checkpoint when the window no longer reaches the cut);
* `evict(ranges)` — drop live ranges and shift what follows (privatizing shared cells first);
* `capture()` / `checkpointed(state)` — the state blob, and a parked state with its
  sliding-window checkpoint;
* `load(blob)` / `link(member, ...)` / `copy_from(other, n)` / `load_prefix(...)` —
  fill the sequence from a blob, a live member's shared cells, another agent's cells;
* `privatize()` / `clear()`.

It owns the sequence id, what only lives while the agent is resident (the sliding-window
checkpoint of a restored state, whether its window cells may have a gap, how far
its cells may be shared with other sequences) and keeps the agent's block reference
in step with its cells. The sliding-window rules (`agentmem.pool.window`) are its
private strategy, chosen once by `Sequences` (as vLLM's `SlidingWindowManager` is
its KV cache manager's): nothing else in the pool asks whether the model has a window.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from agentmem.errors import AgentMemError, StateError
from agentmem.pool.window import NoWindow

if TYPE_CHECKING:
    from agentmem.engine.context import LlamaContext
    from agentmem.memory.ledger import Ledger
    from agentmem.memory.parking import ParkedState

__all__ = ["AgentSeq", "Fit", "Sequences"]

logger = logging.getLogger(__name__)

Fit = Callable[[Callable[[], bool]], bool]
"""The make-room loop an `AgentSeq` is given (`Residency.fit` for its agent): runs an
attempt that returns False when llama.cpp has no free cells, parking idle agents between tries."""


class Agent(Protocol):
    """What the door reads of the agent record (`agentmem.pool.state.AgentState`) it serves."""

    id: str
    ledger: Ledger
    prompt_end: tuple[int, int]


class Blocks(Protocol):
    """What the door needs of the block refs (`agentmem.pool.blocks.BlockRefs`): a cut below a block leaves it."""

    def leave_below(self, a: Any, n_live: int) -> None: ...

    def leave(self, a: Any) -> None: ...


class Sequences:
    """The pool's side of the door: the context, the window rules (chosen once), the block refs.

    Args:
        ctx: the shared llama.cpp context.
        blocks: agents' references to shared blocks (a cut below a block leaves it).
        totals: the pool's counters (`privatized`).
        window: the sliding-window rules, chosen once for the model (`agentmem.pool.window.window_rules`).
    """

    def __init__(self, ctx: LlamaContext, blocks: Blocks, totals: dict[str, int], *, window: NoWindow) -> None:
        self.ctx = ctx
        self.blocks = blocks
        self.totals = totals
        self._window = window

    def open(self, a: Agent, seq: int, fit: Fit) -> AgentSeq:
        """The door to sequence `seq` (empty, just assigned to `a`); `fit` makes room for its loads."""
        return AgentSeq(self, a, seq, fit)

    def parked_can_cut(self, n_live: int, n: int) -> bool:
        """True when a state blob of `n_live` tokens (parked, or copied whole) can be cut back to its first `n`."""
        return self._window.parked_can_cut(n_live, n)

    def nearest(self, members: Sequence[AgentSeq]) -> AgentSeq:
        """Of the live sequences holding a block's cells, the one a linked restore should share."""
        return members[self._window.widest([m.id for m in members])]


class AgentSeq:
    """One resident agent's sequence: the only code that changes or captures its KV (see the module docstring).

    Attributes:
        id: the llama.cpp sequence id.
        agent: the agent record whose ledger describes the cells.
        shared_upto: cells at positions below this may be tagged for other sequences too
            (`seq_cp`): shifting them would move them for everyone, so `evict` makes them private first.
    """

    __slots__ = ("id", "agent", "shared_upto", "_seqs", "_ctx", "_w", "_fit", "_ckpt", "_gap")

    def __init__(self, seqs: Sequences, agent: Agent, seq: int, fit: Fit) -> None:
        self.id = seq
        self.agent = agent
        self.shared_upto = 0
        self._seqs = seqs
        self._ctx = seqs.ctx
        self._w = seqs._window
        self._fit = fit
        # the sliding-window layers as of the prompt end, from a restored parked state
        # (a tuple ``(private blob, order)`` when stored cut against it); used by the first cut
        self._ckpt: Any = None
        # the window cells may have a gap (a shared block's cells, then a private last
        # window): `reaches` then checks every position, not just the lowest
        self._gap = False

    # ------------------------------------------------------------------ questions
    def _reaches(self, n_live: int) -> bool:
        """True when the window cells needed to continue after `n_live` live tokens are still there."""
        return self._w.reaches(self.id, n_live, exact=self._gap)

    def can_cut(self, n: int) -> bool:
        """True when `cut(n)` keeps all of the first `n` history tokens (no window rule stands in the way)."""
        led = self.agent.ledger
        keep_live = led.live_before(n)
        return keep_live >= led.n_live or self._reaches(keep_live)

    # ------------------------------------------------------------------ cutting
    def cut(self, n: int) -> int:
        """Keep the first `n` history tokens of the agent, cells and ledger; returns how many were kept.

        When the sliding window no longer reaches the cut, the checkpoint of a restored
        state rolls it back (to `n`, or to the last prompt's end when the reply outgrew the
        window); without one everything goes (0: re-prefill). The checkpoint is good for
        this first cut only.
        """
        led = self.agent.ledger
        ckpt, self._ckpt = self._ckpt, None
        if n >= len(led):
            return n
        keep_live = led.live_before(n)
        blob = None
        if 0 < keep_live < led.n_live and not self._reaches(keep_live):
            # A restored state carries only the last window of the sliding-window
            # layers; cutting back below it would leave them without history.
            blob, n = self._rollback(ckpt, n, keep_live)
        keep_live = self._drop_from(n)
        if blob is not None and not self._w.restore_checkpoint(self.id, blob, keep_live):
            logger.debug("agent %r: SWA checkpoint rejected; re-prefilling", self.agent.id)
            self._drop_from(0)
            n = 0
        return n

    def _rollback(self, ckpt: Any, n: int, keep_live: int) -> tuple[np.ndarray | None, int]:
        """The window blob to load after cutting to `n` (or to the prompt end), and the cut; `(None, 0)`: none."""
        a = self.agent
        pe_hist, pe_live = a.prompt_end
        blob = None
        if ckpt is not None and keep_live >= pe_live:
            end = a.ledger.n_live
            try:  # the checkpoint plus the reply's cells up to the cut (built before they change)
                blob = self._w.window_at(self.id, ckpt, pe_live, keep_live, end)
                if blob is None:  # the reply outgrew the window: roll back to the prompt end
                    blob = self._w.window_at(self.id, ckpt, pe_live, pe_live, end)
                    n = pe_hist
            except AgentMemError as exc:
                logger.debug("agent %r: SWA checkpoint unusable (%s)", a.id, exc)
                blob = None
        if blob is None:
            logger.debug("agent %r: SWA cells do not reach %d; re-prefilling", a.id, keep_live)
            return None, 0
        return blob, n

    def _drop_from(self, n: int) -> int:
        """Ledger and cells cut to the first `n` history tokens; the block left if no longer covered."""
        keep_live = self.agent.ledger.truncate(n)
        self._ctx.seq_rm(self.id, keep_live, -1)
        if keep_live == 0:
            self._gap = False
        self._seqs.blocks.leave_below(self.agent, keep_live)
        return keep_live

    def evict(self, ranges: list[tuple[int, int]]) -> np.ndarray:
        """Drop the live position ranges `ranges` (sorted, disjoint) and shift the cells after each; their history indices.

        Every cell moves once (one `seq_add` per range, each shifting everything after
        it, costs O(ranges x cells) in llama.cpp's position maps: 0.6 ms per call at 2k).

        Raises:
            StateError: shared cells had to be made private and there was no room.
        """
        assert ranges, f"{ranges=}"
        self._seqs.blocks.leave_below(self.agent, ranges[0][0])
        if ranges[0][0] < self.shared_upto:
            self.privatize()  # shifting cells other sequences share would move them for those too
        ctx, seq = self._ctx, self.id
        for s, e in ranges:
            ctx.seq_rm(seq, s, e)
        removed = 0
        for k, (s, e) in enumerate(ranges):
            removed += e - s
            nxt = ranges[k + 1][0] if k + 1 < len(ranges) else -1
            if nxt == -1 or nxt > e:
                ctx.seq_add(seq, e, nxt, -removed)
        return self.agent.ledger.evict_live(ranges)

    # ------------------------------------------------------------------ capturing
    def capture(self) -> np.ndarray:
        """The sequence's state blob (every cell, f16 as llama.cpp writes it)."""
        return self._ctx.state_get(self.id)

    def checkpointed(self, state: ParkedState, *, keep_cells: bool) -> ParkedState:
        """`state` (this agent's, just captured) with its sliding-window checkpoint, when one is needed.

        Taking the checkpoint drops the reply's cells: for a park (`keep_cells=False`) the
        sequence is cleared next anyway; otherwise (a snapshot of an agent that stays
        resident) the full state is loaded back, its cells then private to it.

        Raises:
            StateError: the full state could not be loaded back (the agent is then emptied).
        """
        a = self.agent
        if not keep_cells:
            self._ckpt = None
        full = self.capture() if keep_cells and self._w.active else None
        ck = self._w.checkpoint(self.id, a.ledger.n_live, a.prompt_end[1], gap=self._gap)
        if ck is None:
            return state
        if full is not None:
            if not self._fit(lambda: self._ctx.state_set(self.id, full) != 0):
                self._drop_from(0)  # cannot happen (the cells were just freed); never keep a half state
                self._seqs.blocks.leave(a)
                raise StateError(f"agent {a.id!r}: its live state could not be reloaded after the checkpoint")
            self.shared_upto = 0
        return dataclasses.replace(state, window_ckpt=ck[0], window_order=ck[1])

    # ------------------------------------------------------------------ filling
    def _resume(self, parked: ParkedState) -> None:
        """Take over what a restored parked state brings besides its cells."""
        self._gap = parked.block is not None  # the block's cells, then the private window
        self._ckpt = parked.window_ckpt
        if parked.window_ckpt is not None and parked.window_order is not None:
            self._ckpt = (parked.window_ckpt, parked.window_order)  # joined only if used (window.py)

    def _check_end(self) -> None:
        """The cells end where the ledger's live tokens do (after a load)."""
        pos_max = self._ctx.seq_pos_max(self.id)
        n_live = self.agent.ledger.n_live
        if pos_max != n_live - 1:
            raise StateError(f"restored state ends at position {pos_max}, the ledger has {n_live} live tokens")

    def load(self, blob: np.ndarray, parked: ParkedState) -> bool:
        """Load `blob` (the whole state of `parked`) into the empty sequence, making room as needed.

        False: llama.cpp rejected it (a wrong layout, or no free cells even after parking idle agents).

        Raises:
            StateError: the loaded cells do not end where the agent's ledger does (clear it).
        """
        if not self._fit(lambda: self._ctx.state_set(self.id, blob) != 0):
            return False
        self._check_end()
        self._resume(parked)
        return True

    def link(self, member: AgentSeq, n_tokens: int, parked: ParkedState, private: np.ndarray) -> bool:
        """Restore `parked` (cut at a block of `n_tokens`) with the block's cells *shared* from `member`.

        The private cells are loaded, then `seq_cp` tags the member's prefix cells for
        this sequence too: no join, no copy. Sliding-window cells the member no longer
        holds (llama.cpp reuses them once they fall out of its window) would be missing, so
        they are checked; on any shortfall the sequence is emptied and False returned (the
        caller loads the joined blob instead).

        Raises:
            StateError: the linked cells do not end where the agent's ledger does (clear it).
        """
        assert parked.order is not None
        order = parked.order
        n_sec = int(order[0])
        ctx, seq = self._ctx, self.id
        if np.count_nonzero(order[1 + n_sec :] < 0):
            if not self._fit(lambda: ctx.state_set(seq, private) != 0):
                self.clear()
                return False
        else:
            self.clear()
        ctx.seq_cp(member.id, seq, 0, n_tokens)
        self._check_end()
        self._resume(parked)
        self.shared_upto = n_tokens
        if self._w.linked_complete(seq, order, private):
            member.shared_upto = max(member.shared_upto, n_tokens)
            return True
        logger.debug("agent %r: member %r no longer holds the window's cells; joining instead",
                     self.agent.id, member.agent.id)
        ctx.seq_rm(seq)  # (as `clear`)
        self.shared_upto, self._ckpt, self._gap = 0, None, False
        return False

    def copy_from(self, other: AgentSeq, n_live: int) -> str:
        """The first `n_live` cells of live `other` into this empty sequence; `"shared"` or `"copied"`.

        One unified cache: the cells are tagged for both (`seq_cp`, `"shared"`). Per-sequence
        streams: `other`'s blob is loaded and cut (a `seq_cp` between streams copies whole
        streams, llama.cpp aborts on a partial one: `"copied"`).

        Raises:
            StateError: `other`'s window no longer holds those cells, or the blob was rejected.
        """
        if self._ctx.params.kv_unified:
            if n_live > 0 and not other._reaches(n_live):
                raise StateError(
                    f"agent {other.agent.id!r} no longer holds the sliding-window cells before position {n_live}")
            self._ctx.seq_cp(other.id, self.id, 0, n_live)
            self._gap = other._gap
            self.shared_upto = n_live
            other.shared_upto = max(other.shared_upto, n_live)
            return "shared"
        self._take(other.capture(), n_live, other.agent.ledger.n_live, gap=other._gap, source=other.agent.id)
        return "copied"

    def load_prefix(self, blob: np.ndarray, parked: ParkedState, n_live: int, n_all: int, source: str) -> None:
        """The first `n_live` of the `n_all` cells of agent `source`'s parked state (`blob`, joined) into this empty sequence.

        Raises:
            StateError: the blob was rejected, or its window cannot be cut back to `n_live`.
        """
        self._take(blob, n_live, n_all, gap=parked.block is not None, source=source)

    def _take(self, blob: np.ndarray, n_live: int, n_all: int, *, gap: bool, source: str) -> None:
        """Load a blob of `n_all` cells and keep its first `n_live`."""
        if self._ctx.state_set(self.id, blob) == 0:
            raise StateError(f"the state of agent {source!r} could not be loaded for the handoff")
        self._gap = gap
        if n_live < n_all:
            if not self._reaches(n_live):
                self.clear()
                raise StateError(f"agent {source!r} is parked past its sliding window; hand off from it while it is live")
            self._ctx.seq_rm(self.id, n_live, -1)

    def privatize(self) -> None:
        """Give the sequence its own copies of cells it may share with other sequences (before shifting them).

        Raises:
            StateError: no room for the copies, even after parking idle agents.
        """
        blob = self.capture()
        if not self._fit(lambda: self._ctx.state_set(self.id, blob) != 0):
            raise StateError(f"no room to make agent {self.agent.id!r}'s shared cells private")
        self.shared_upto = 0
        self._seqs.totals["privatized"] += 1

    def clear(self) -> None:
        """Empty the sequence (every cell) and forget what came with them; the ledger is the caller's.

        The caller keeps the ledger for a parked state, or resets it.
        """
        self._ctx.seq_rm(self.id)
        self.shared_upto = 0
        self._ckpt = None
        self._gap = False
