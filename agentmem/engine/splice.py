"""A span's KV cells taken out of one sequence and spliced into another at a new position.

Recall as KV (issue #34): a span of text whose cells were computed earlier — in the same
agent's conversation before it was evicted, at other positions and after another prefix —
comes back as cells instead of being prefilled again. Two calls:

* `capture_span(ctx, seq=, p0=, p1=, scratch=)` — the cells of `seq` at positions `[p0, p1)`
  as a state blob (`SpanKV`): tagged for an empty scratch sequence (`seq_cp`), copied out,
  untagged. Nothing of `seq` changes.
* `splice_span(ctx, span, seq=, pos0=, heal=, scratch=)` — the blob loaded into the scratch
  sequence (cells outside the span dropped: `SpanKV.narrow` names a part of a captured
  span), its positions shifted to `pos0` (`seq_add`: llama.cpp re-rotates the keys, RoPE
  being relative), tagged for `seq`, untagged from the scratch — all but the first `heal`
  cells, which are decoded again after the new prefix (first: llama.cpp wants a batch to
  start right after a sequence's last cell), healing the seam as EPIC
  (Hu et al. 2024, "Epic: efficient position-independent context caching") does. The cells
  after the first `heal` keep the attention they had over the *old* prefix: the quality
  cost `benchmarks/recall_kv.py` measures.

It needs a cache that can shift positions and keeps every cell (no sliding-window layers,
or `swa_full`) and one unified KV cache (`kv_unified`: a `seq_cp` across streams
copies whole streams); `splice_supported` says whether a context qualifies. Of the bundled
models, Qwen2.5-Coder-0.5B-Instruct qualifies on every cache; Gemma 3 (sliding window on
15 of 18 layers) only with `swa_full=True`. Elsewhere recall re-prefills the text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentmem.engine.context import LlamaContext
from agentmem.errors import ConfigError, EngineError

__all__ = ["SpanKV", "capture_span", "splice_span", "splice_supported"]


@dataclass(frozen=True, slots=True)
class SpanKV:
    """A span's KV cells, as a one-sequence state blob of the context that captured them.

    Attributes:
        blob: the state blob (cells, positions, per-layer K/V rows in the cache dtype).
        pos0: the position of the span's first cell in the blob.
        tokens: the span's token ids, one per cell (a state blob keeps no tokens).
    """

    blob: np.ndarray
    pos0: int
    tokens: tuple[int, ...]

    @property
    def n(self) -> int:
        """Cells in the span."""
        return len(self.tokens)

    def narrow(self, lo: int, hi: int) -> SpanKV:
        """The part `[lo, hi)` of the span (same blob; `splice_span` drops the blob's other cells).

        Raises:
            ConfigError: not a non-empty part of the span.
        """
        if not 0 <= lo < hi <= self.n:
            raise ConfigError(f"need 0 <= lo < hi <= {self.n}, got [{lo}, {hi})")
        return SpanKV(blob=self.blob, pos0=self.pos0 + lo, tokens=self.tokens[lo:hi])


def splice_supported(ctx: LlamaContext) -> bool:
    """True when `ctx` can take a span's cells at a new position.

    It must shift positions, keep every cell of a sliding-window model's window layers
    (`swa_full`: otherwise they hold only the last window and a captured span lacks the rest —
    llama.cpp may still report `can_shift` when its window cache is as large as the context),
    have one unified cache and a second sequence to pass the cells through.
    """
    whole = ctx.model.n_swa == 0 or ctx.params.swa_full
    return bool(ctx.can_shift and whole and ctx.params.kv_unified and ctx.params.n_seq_max >= 2)


def _check(ctx: LlamaContext, seq: int, scratch: int) -> None:
    if not splice_supported(ctx):
        raise EngineError("this context cannot splice KV (needs can_shift, kv_unified and two sequences)")
    if seq == scratch:
        raise ConfigError(f"scratch must be another sequence than seq={seq}")
    if ctx.seq_pos_max(scratch) >= 0:
        raise EngineError(f"scratch sequence {scratch} is not empty")


def capture_span(ctx: LlamaContext, *, seq: int, p0: int, p1: int, tokens: list[int] | tuple[int, ...],
                 scratch: int) -> SpanKV:
    """The cells of `seq` at positions `[p0, p1)` (the span of `tokens`), through the empty sequence `scratch`.

    Raises:
        ConfigError: `tokens` is not one token per position, or `scratch == seq`.
        EngineError: the context cannot splice, `scratch` is not empty, or `seq` lacks those cells.
    """
    if p1 - p0 != len(tokens) or p0 < 0 or p1 <= p0:
        raise ConfigError(f"tokens must be one per position of [{p0}, {p1}), got {len(tokens)}")
    with ctx.lock:
        _check(ctx, seq, scratch)
        ctx.seq_cp(seq, scratch, p0, p1)
        try:
            lo, hi = ctx.seq_pos_min(scratch), ctx.seq_pos_max(scratch)
            if (lo, hi) != (p0, p1 - 1):
                raise EngineError(f"sequence {seq} holds positions [{lo}, {hi}] of the span [{p0}, {p1 - 1}]")
            blob = ctx.state_get(scratch)
        finally:
            ctx.seq_rm(scratch)
    return SpanKV(blob=blob, pos0=p0, tokens=tuple(int(t) for t in tokens))


def splice_span(ctx: LlamaContext, span: SpanKV, *, seq: int, pos0: int, heal: int, scratch: int) -> int:
    """Put `span`'s cells into `seq` at positions `pos0...` and recompute the first `heal` of them.

    `seq` must end just before `pos0` (the span continues it). Returns the batch index of
    the last healed token's logits, or -1 when nothing was decoded (`heal == 0`): the caller
    decodes what follows the span at `pos0 + span.n` before sampling.

    Raises:
        ConfigError: a negative `heal`, or `scratch == seq`.
        EngineError: the context cannot splice, `scratch` is not empty, llama.cpp rejected
            the blob (no room, another layout) — `seq` is then as it was.
    """
    if heal < 0:
        raise ConfigError(f"heal must be >= 0, got {heal}")
    heal = min(heal, span.n)
    with ctx.lock:
        _check(ctx, seq, scratch)
        idx = -1
        if heal:  # decoded first: llama.cpp wants a sequence's batch to start right after its last cell
            idx = ctx.decode_run(seq, span.tokens[:heal], pos0)
        if heal == span.n:
            return idx
        if ctx.state_set(scratch, span.blob) == 0:
            if heal:
                ctx.seq_rm(seq, pos0, -1)
            raise EngineError(f"the span's KV blob ({span.blob.nbytes} bytes) was rejected")
        try:
            ctx.seq_rm(scratch, 0, span.pos0 + heal)  # the healed cells, and any of the blob before the span
            ctx.seq_rm(scratch, span.pos0 + span.n, -1)  # any after it (`SpanKV.narrow`)
            if pos0 != span.pos0:
                ctx.seq_add(scratch, span.pos0, -1, pos0 - span.pos0)
            ctx.seq_cp(scratch, seq, pos0 + heal, pos0 + span.n)
        finally:
            ctx.seq_rm(scratch)
        return idx
