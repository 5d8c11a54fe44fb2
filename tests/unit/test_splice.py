"""Recall as KV on the tiny synthetic models: a span's cells captured, shifted, spliced, healed.

The bookkeeping (`agentmem.engine.splice`): a spliced span leaves the target sequence
holding every position once and the scratch sequence empty; the shift is exact where the
span's cells saw the same prefix at other positions; healing every token equals a text
prefill; a rejected blob leaves the target as it was; a cache that cannot shift (Gemma's
sliding window without ``swa_full``) does not qualify. The policy and the recaller
(`agentmem.recall.as_kv`): splice only where the policy says it pays, text otherwise, counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel  # noqa: E402
from agentmem.engine.splice import SpanKV, capture_span, splice_span, splice_supported  # noqa: E402
from agentmem.errors import ConfigError, EngineError  # noqa: E402
from agentmem.recall.as_kv import KVRecaller, SplicePolicy  # noqa: E402

import numpy as np  # noqa: E402

ORIG, LIVE, SCRATCH = 0, 1, 2
TEXT = "the quick brown fox jumps over the lazy dog and then the cat sat on the mat while birds sang " * 3


@pytest.fixture
def ctx(tiny_model_path: Path) -> Iterator[LlamaContext]:
    with LlamaModel(tiny_model_path) as model:
        with LlamaContext(model, ContextParams(n_ctx=512, n_seq_max=3, n_threads=1)) as c:
            yield c


def _tokens(ctx: LlamaContext, n: int, skip: int = 0) -> list[int]:
    toks = ctx.model.tokenize(TEXT)[skip : skip + n]
    assert len(toks) == n
    return toks


def _text_logits(ctx: LlamaContext, prefix: list[int], span: list[int], tail: list[int]) -> np.ndarray:
    ctx.decode_run(LIVE, prefix, 0)
    out = ctx.logits(ctx.decode_run(LIVE, span + tail, len(prefix)))
    ctx.seq_rm(LIVE)
    return out


def test_shift_is_exact_when_the_span_saw_the_same_prefix(ctx: LlamaContext) -> None:
    """The span computed 37 positions later after the same prefix, shifted back: the same logits as a prefill."""
    prefix, span, tail = _tokens(ctx, 12), _tokens(ctx, 20, 12), _tokens(ctx, 3, 32)
    ref = _text_logits(ctx, prefix, span, tail)
    ctx.decode_run(ORIG, prefix + span, 37)
    kv = capture_span(ctx, seq=ORIG, p0=37 + len(prefix), p1=37 + len(prefix) + len(span), tokens=span,
                      scratch=SCRATCH)
    ctx.seq_rm(ORIG)
    ctx.decode_run(LIVE, prefix, 0)
    assert splice_span(ctx, kv, seq=LIVE, pos0=len(prefix), heal=0, scratch=SCRATCH) == -1
    got = ctx.logits(ctx.decode_run(LIVE, tail, len(prefix) + len(span)))
    np.testing.assert_allclose(got, ref, atol=2e-2 * float(np.abs(ref).max()))
    assert int(got.argmax()) == int(ref.argmax())


@pytest.mark.parametrize("heal", [0, 3, 20])
def test_splice_bookkeeping(ctx: LlamaContext, heal: int) -> None:
    """Every position of the target once, in order; the scratch empty; the source untouched."""
    prefix, span = _tokens(ctx, 9), _tokens(ctx, 20, 9)
    ctx.decode_run(ORIG, _tokens(ctx, 5, 40) + span, 0)
    kv = capture_span(ctx, seq=ORIG, p0=5, p1=25, tokens=span, scratch=SCRATCH)
    assert (kv.pos0, kv.n) == (5, 20)
    assert (ctx.seq_pos_min(ORIG), ctx.seq_pos_max(ORIG)) == (0, 24)
    ctx.decode_run(LIVE, prefix, 0)
    idx = splice_span(ctx, kv, seq=LIVE, pos0=9, heal=heal, scratch=SCRATCH)
    assert (idx >= 0) == (heal > 0)
    assert (ctx.seq_pos_min(LIVE), ctx.seq_pos_max(LIVE)) == (0, 28)
    assert ctx.seq_pos_max(SCRATCH) == -1
    ctx.decode_run(LIVE, [span[0]], 29)  # the sequence continues where the span ends


def test_healing_every_token_is_a_prefill(ctx: LlamaContext) -> None:
    """heal == the span's length: the cells are all recomputed, the logits are a text prefill's."""
    prefix, span, tail = _tokens(ctx, 7), _tokens(ctx, 10, 20), _tokens(ctx, 2, 40)
    ref = _text_logits(ctx, prefix, span, tail)
    ctx.decode_run(ORIG, _tokens(ctx, 4) + span, 0)
    kv = capture_span(ctx, seq=ORIG, p0=4, p1=14, tokens=span, scratch=SCRATCH)
    ctx.decode_run(LIVE, prefix, 0)
    splice_span(ctx, kv, seq=LIVE, pos0=7, heal=10, scratch=SCRATCH)
    got = ctx.logits(ctx.decode_run(LIVE, tail, 17))
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-3 * float(np.abs(ref).max()))


def test_rejected_blob_leaves_the_target(ctx: LlamaContext) -> None:
    """A blob llama.cpp rejects raises `EngineError` and the target keeps its cells (heal tokens undone)."""
    ctx.decode_run(LIVE, _tokens(ctx, 6), 0)
    bad = SpanKV(blob=np.zeros(16, dtype=np.uint8), pos0=0, tokens=tuple(_tokens(ctx, 8)))
    with pytest.raises(EngineError):
        splice_span(ctx, bad, seq=LIVE, pos0=6, heal=2, scratch=SCRATCH)
    assert (ctx.seq_pos_min(LIVE), ctx.seq_pos_max(LIVE)) == (0, 5)
    assert ctx.seq_pos_max(SCRATCH) == -1


def test_bad_arguments(ctx: LlamaContext) -> None:
    span = _tokens(ctx, 4)
    ctx.decode_run(ORIG, span, 0)
    with pytest.raises(ConfigError):
        capture_span(ctx, seq=ORIG, p0=0, p1=3, tokens=span, scratch=SCRATCH)
    with pytest.raises(ConfigError):
        capture_span(ctx, seq=ORIG, p0=0, p1=4, tokens=span, scratch=ORIG)
    with pytest.raises(EngineError):  # the source does not hold those positions
        capture_span(ctx, seq=ORIG, p0=2, p1=6, tokens=span, scratch=SCRATCH)
    assert ctx.seq_pos_max(SCRATCH) == -1
    kv = capture_span(ctx, seq=ORIG, p0=0, p1=4, tokens=span, scratch=SCRATCH)
    with pytest.raises(ConfigError):
        splice_span(ctx, kv, seq=LIVE, pos0=0, heal=-1, scratch=SCRATCH)
    ctx.decode_run(SCRATCH, span, 0)
    with pytest.raises(EngineError):  # the scratch sequence is busy
        splice_span(ctx, kv, seq=LIVE, pos0=0, heal=0, scratch=SCRATCH)


def test_sliding_window_without_swa_full_does_not_qualify(tiny_gemma3_path: Path) -> None:
    """Gemma's sliding-window layers cannot shift unless the cache keeps them whole (`swa_full`)."""
    with LlamaModel(tiny_gemma3_path) as model:
        for swa_full in (False, True):
            with LlamaContext(model, ContextParams(n_ctx=256, n_seq_max=3, n_threads=1, swa_full=swa_full)) as c:
                assert splice_supported(c) is swa_full
                if not swa_full:
                    c.decode_run(ORIG, [1, 2, 3], 0)
                    with pytest.raises(EngineError):
                        capture_span(c, seq=ORIG, p0=0, p1=3, tokens=[1, 2, 3], scratch=SCRATCH)


def test_policy_decides_by_length_and_support() -> None:
    policy = SplicePolicy(min_tokens=128, max_tokens=512, heal=4)
    assert policy.decide(n_tokens=127, supported=True) is None
    assert policy.decide(n_tokens=128, supported=True) == 4
    assert policy.decide(n_tokens=512, supported=True) == 4
    assert policy.decide(n_tokens=513, supported=True) is None
    assert policy.decide(n_tokens=256, supported=False) is None
    assert SplicePolicy(min_tokens=8, heal=16).decide(n_tokens=8, supported=True) == 8  # never beyond the span
    with pytest.raises(ConfigError, match="min_tokens"):
        SplicePolicy(min_tokens=0)
    with pytest.raises(ConfigError, match="max_tokens"):
        SplicePolicy(min_tokens=64, max_tokens=32)
    with pytest.raises(ConfigError, match="heal"):
        SplicePolicy(heal=-1)


def test_recaller_splices_where_it_pays_and_prefills_elsewhere(ctx: LlamaContext) -> None:
    """Long span with its KV: spliced; short span, or none kept: text; both counted; the cells as a prefill's."""
    rec = KVRecaller(ctx, policy=SplicePolicy(min_tokens=16, heal=2), scratch=SCRATCH)
    long_span, short = _tokens(ctx, 20, 10), _tokens(ctx, 8, 40)
    ctx.decode_run(ORIG, _tokens(ctx, 3) + long_span + short, 0)
    kv_long = capture_span(ctx, seq=ORIG, p0=3, p1=23, tokens=long_span, scratch=SCRATCH)
    kv_short = capture_span(ctx, seq=ORIG, p0=23, p1=31, tokens=short, scratch=SCRATCH)
    ctx.decode_run(LIVE, _tokens(ctx, 5), 0)
    assert rec.insert(seq=LIVE, pos0=5, tokens=long_span, kv=kv_long) == "spliced"
    assert rec.insert(seq=LIVE, pos0=25, tokens=short, kv=kv_short) == "prefilled"
    assert rec.insert(seq=LIVE, pos0=33, tokens=long_span, kv=None) == "prefilled"
    assert (ctx.seq_pos_min(LIVE), ctx.seq_pos_max(LIVE)) == (0, 52)
    assert rec.counters == {"spliced": 1, "prefilled": 2, "spliced_tokens": 20, "prefilled_tokens": 28,
                            "splice_failed": 0}
    with pytest.raises(ConfigError, match="tokens"):
        rec.insert(seq=LIVE, pos0=53, tokens=short, kv=kv_long)


def test_a_narrowed_span_splices_only_its_part_and_matches_its_prefill(ctx: LlamaContext) -> None:
    """`SpanKV.narrow`: cells of the blob outside the part are dropped; the part, after the same prefix, is exact."""
    prefix, span, tail = _tokens(ctx, 12), _tokens(ctx, 20, 12), _tokens(ctx, 3, 32)
    ctx.decode_run(ORIG, prefix + span, 0)
    whole = capture_span(ctx, seq=ORIG, p0=6, p1=32, tokens=(prefix + span)[6:], scratch=SCRATCH)
    ctx.seq_rm(ORIG)
    part = whole.narrow(6, 26)  # the span's 20 tokens, without the 6 of the prefix the blob also holds
    assert part.tokens == tuple(span) and part.pos0 == 12
    ref = _text_logits(ctx, prefix, span, tail)
    ctx.decode_run(LIVE, prefix, 0)
    splice_span(ctx, part, seq=LIVE, pos0=len(prefix), heal=0, scratch=SCRATCH)
    assert (ctx.seq_pos_min(LIVE), ctx.seq_pos_max(LIVE)) == (0, 31) and ctx.seq_pos_max(SCRATCH) == -1
    got = ctx.logits(ctx.decode_run(LIVE, tail, len(prefix) + len(span)))
    np.testing.assert_allclose(got, ref, atol=2e-2 * float(np.abs(ref).max()))
    with pytest.raises(ConfigError, match="lo < hi"):
        whole.narrow(5, 5)
