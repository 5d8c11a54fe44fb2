"""Every sliding-window rule of the pool in one object, chosen once per model: the door's private strategy.

Gemma 3 keeps only the last `n_swa` positions in its sliding-window layers
(llama.cpp reuses the cells below them). That decides whether a sequence can be
cut back to a prefix, whether a parked state can be cut, whether a live member
still holds what a linked restore needs, and it is why a parked agent keeps a
*checkpoint* of those layers as of its last prompt's end. `SlidingWindow`
implements those rules; `NoWindow` is its no-op twin for models without a window,
so the pool never asks "does this model have a window?" itself.

Only the door to a sequence's KV (`agentmem.pool.sequence`) holds these rules (as
vLLM's `SlidingWindowManager` is its KV cache manager's): they speak of sequence
ids and positions, never of agent records.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from agentmem.errors import AgentMemError
from agentmem.codec import join_state, parse_state, split_state

if TYPE_CHECKING:
    from agentmem.engine.context import LlamaContext

__all__ = ["NoWindow", "SlidingWindow", "window_rules"]

logger = logging.getLogger(__name__)


class NoWindow:
    """The rules for a model without sliding-window layers: every cut is possible."""

    active = False

    def reaches(self, seq: int, n_live: int, *, exact: bool = False) -> bool:
        """True when sequence `seq` still holds the window needed to continue after `n_live` tokens.

        `exact`: the sequence's window cells may have a gap (a shared block's, then a private window), so every
        position of the window is checked, not only the lowest one held.
        """
        return True

    def parked_can_cut(self, n_live: int, n: int) -> bool:
        """True when a parked state of `n_live` tokens can be cut back to its first `n`."""
        return True

    def widest(self, seqs: Sequence[int]) -> int:
        """Of the sequences holding a shared block's cells, the index of the one a linked restore should share."""
        return 0

    def checkpoint(self, seq: int, n_live: int, pe_live: int, *, gap: bool) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The checkpoint to park with sequence `seq` (`n_live` cells, its last prompt ending at `pe_live`).

        `gap`: its window cells may have a gap (see `reaches`). `None`: none needed (nothing
        is changed); otherwise the cells from `pe_live` on are dropped from `seq`.
        """
        return None

    def window_at(self, seq: int, ckpt: Any, pe_live: int, n_live: int, end: int) -> np.ndarray | None:
        """The sliding-window layers sequence `seq` needs to continue after `n_live` live tokens.

        Built from the checkpoint (the layers as of the prompt end `pe_live`) and the cells
        `seq` still holds from the prompt end up to `n_live`, so a restored agent keeps the
        reply tokens the app re-sent. `n_live` lies between `pe_live` and the live end `end`;
        `seq` must still hold its restored state. `None`: those cells are not all there (a
        reply longer than the window); roll back to the prompt end instead.
        """
        return ckpt

    def restore_checkpoint(self, seq: int, blob: np.ndarray, n_live: int) -> bool:
        """Load a `window_at` blob into `seq` (cut back to `n_live`); True when it covers the window."""
        return True

    def linked_complete(self, seq: int, order: np.ndarray, private: np.ndarray) -> bool:
        """True when a linked restore left every sliding-window cell the parked state had."""
        return True


class SlidingWindow(NoWindow):
    """The rules for a model whose sliding-window layers keep the last `n_swa` positions."""

    active = True

    def __init__(self, ctx: LlamaContext, n_swa: int) -> None:
        assert n_swa > 0, f"{n_swa=}"
        self.ctx = ctx
        self.n_swa = n_swa

    def _floor(self, n_live: int) -> int:
        """The lowest sliding-window position continuing after `n_live` tokens needs."""
        return max(0, n_live - self.n_swa + 1)

    def _holds(self, positions: np.ndarray, n_live: int) -> bool:
        """True when `positions` include every position of the window before `n_live`."""
        return bool(np.isin(np.arange(self._floor(n_live), n_live), positions).all())

    def reaches(self, seq: int, n_live: int, *, exact: bool = False) -> bool:
        if n_live == 0:
            return True
        pos_min = self.ctx.seq_pos_min(seq)  # -1: the sequence holds no cells, which reaches nothing
        if not 0 <= pos_min <= self._floor(n_live):
            return False
        # A gap (a shared block's cells from 0, then a restored private window) would pass
        # the lowest-position test while the window before `n_live` is missing.
        return not exact or self._holds(parse_state(self.ctx.swa_state_get(seq)).positions, n_live)

    def parked_can_cut(self, n_live: int, n: int) -> bool:
        # a parked state keeps only the last window of the sliding-window layers
        # (positions from n_live - n_swa): it can be cut back only within that
        return max(0, n_live - self.n_swa) <= self._floor(n)

    def widest(self, seqs: Sequence[int]) -> int:
        # the member whose sliding-window cells reach back furthest covers the most
        return min(range(len(seqs)), key=lambda i: self.ctx.seq_pos_min(seqs[i]))

    def checkpoint(self, seq: int, n_live: int, pe_live: int, *, gap: bool) -> tuple[np.ndarray, np.ndarray | None] | None:
        # The blob keeps the sliding-window layers only for the window before its end.
        # The app usually re-sends the reply slightly differently (trimmed, edited), so
        # keep those layers as of the prompt's end too: with the reply's cells the blob
        # has, a restore can then be cut anywhere after the prompt end (`window_at`)
        # instead of re-prefilling. (Not needed when the whole history fits the
        # window.) It is stored cut against the parked state's own window: only the
        # reply's cells are extra. Counted in the state's bytes. Drops the reply cells.
        if not (self.n_swa < n_live and 0 < pe_live < n_live - 1):
            return None
        if not self.reaches(seq, pe_live, exact=gap):
            return None  # the window's cells before the prompt end are gone: nothing to roll back to
        now = self.ctx.swa_state_get(seq)
        self.ctx.seq_rm(seq, pe_live, -1)
        ck = self.ctx.swa_state_get(seq)
        try:  # keep only the cells the parked state itself lacks (about the reply's)
            cut = split_state(ck, now, pe_live, partial=True)
        except AgentMemError:
            cut = None
        return (cut[0], cut[1]) if cut else (ck, None)

    def window_at(self, seq: int, ckpt: Any, pe_live: int, n_live: int, end: int) -> np.ndarray | None:
        # A checkpoint holds the window before the prompt end (positions below
        # pe_live); the restored blob holds the last window before the reply's end.
        # Their union, cut at n_live, is exactly what the sequence held when it was
        # live: the checkpoint's cells (stored cut: only those the parked state
        # lacks, the rest named by position) and the live cells [pe_live, n_live).
        # The bytes are the ones llama.cpp computed; no cell is approximated.
        assert pe_live <= n_live <= end, f"{pe_live=}, {n_live=}, {end=}"
        live = self.ctx.swa_state_get(seq)
        reply = np.arange(pe_live, n_live, dtype=np.int32)
        if isinstance(ckpt, tuple):
            private, order = ckpt
            n_sec = int(order[0])
            lens = order[1 : 1 + n_sec]
            secs = np.split(order[1 + n_sec :], np.cumsum(lens)[:-1]) if n_sec else []
        else:
            private = ckpt
            secs = [np.full(s.n_cells, -1, np.int32) for s in parse_state(private).sections]
        if reply.size:
            live_layout = parse_state(live)
            if any(not np.isin(reply, s.positions).all() for s in live_layout.sections[len(live_layout.sections) - len(secs):]):
                return None  # the live window no longer holds the whole reply
        # every section of a sliding-window-only blob is a windowed cache: each gets the reply's cells
        secs = [np.concatenate([s.astype(np.int32), reply]) for s in secs]
        if not secs:
            return None
        order = np.concatenate([np.array([len(secs)], np.int32), np.array([len(s) for s in secs], np.int32), *secs])
        return join_state(live, private, order)

    def restore_checkpoint(self, seq: int, blob: np.ndarray, n_live: int) -> bool:
        # usable only when its window ends exactly where the ledger was cut (a blob built for
        # another cut would leave the window's cells short of, or past, the ledger)
        return (self.ctx.swa_state_set(seq, blob) != 0 and self.ctx.seq_pos_max(seq) == n_live - 1
                and self._holds(parse_state(blob).positions, n_live))

    def linked_complete(self, seq: int, order: np.ndarray, private: np.ndarray) -> bool:
        n_sec = int(order[0])
        if n_sec < 2:
            return True
        # every sliding-window position the parked state had must be there
        lens = order[1 : 1 + n_sec]
        src = order[1 + n_sec :][int(lens[:-1].sum()) :]
        need = np.concatenate([src[src >= 0], parse_state(private).sections[-1].positions])
        have = parse_state(self.ctx.swa_state_get(seq)).positions
        return bool(np.isin(need, have).all())


def window_rules(ctx: LlamaContext, n_swa: int) -> NoWindow:
    """`SlidingWindow` for a model with a window (`n_swa > 0`), else `NoWindow`."""
    return SlidingWindow(ctx, n_swa) if n_swa > 0 else NoWindow()
