"""Recall as KV on the real instruct model (Qwen2.5-Coder-0.5B-Instruct): a spliced span answers as its text does.

A 256-token span of facts is computed after one prefix, captured, and spliced after
another (shifted ~100 positions, its first 4 tokens healed): the next-token distribution
at the answer's start has the re-prefill's top token and a KL under the bound
`benchmarks/recall_kv.py` measured (its worst case, with margin); without healing, and
with the span left out, the figures are what the benchmark reports too (the span matters).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel
from agentmem.engine.splice import capture_span, splice_supported
from agentmem.recall.as_kv import KVRecaller, SplicePolicy

pytestmark = pytest.mark.integration

ORIG, LIVE, SCRATCH = 0, 1, 2
FACTS = (
    "The shipment left Rotterdam harbor aboard the vessel Nordlys on Tuesday. "
    "My sister Ingrid is allergic to peanuts, so the wedding caterer must avoid them. "
    "The staging database password was rotated and now lives in the Vault path secret/stage/db. "
    "Our quarterly revenue came in at 4.2 million euros, up eleven percent. "
    "The dentist appointment was moved to Thursday at half past three. "
    "I parked the car on level four of the airport garage, row K. "
) * 3
KL_BOUND = 0.1
"""Nats; `benchmarks/recall_kv.py` measured at most 0.03 with 4 tokens healed, at 64 to 1024 tokens."""


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    lp = p.astype(np.float64) - np.logaddexp.reduce(p.astype(np.float64))
    lq = q.astype(np.float64) - np.logaddexp.reduce(q.astype(np.float64))
    return float(np.sum(np.exp(lp) * (lp - lq)))


def _im(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def test_spliced_span_answers_as_its_text(instruct_model_path: Path) -> None:
    with LlamaModel(instruct_model_path) as model, LlamaContext(
            model, ContextParams(n_ctx=2048, n_seq_max=3, n_threads=1)) as ctx:
        assert splice_supported(ctx)
        tok = lambda s: model.tokenize(s, parse_special=True)  # noqa: E731
        span = model.tokenize(FACTS)[:256]
        orig = tok(_im("system", "You are a note keeper.") + "<|im_start|>user\nMy notes:\n")
        prefix = tok(_im("system", "You are a helpful assistant. Answer briefly.")
                     + _im("user", "Could you rewrite that paragraph so it sounds a little less formal?")
                     + _im("assistant", "Sure, here is a more relaxed version of it.")
                     + _im("user", "The weather forecast says it will be sunny for the rest of the week.")
                     + _im("assistant", "Noted.") + "<|im_start|>user\nRecalled from earlier:\n")
        tail = tok("<|im_end|>\n" + _im("user", "What is Ingrid allergic to?") + "<|im_start|>assistant\n")
        p, n = len(prefix), len(span)
        assert p - len(orig) > 50  # the span really moves

        ctx.decode_run(ORIG, orig + span, 0)
        kv = capture_span(ctx, seq=ORIG, p0=len(orig), p1=len(orig) + n, tokens=span, scratch=SCRATCH)
        ctx.seq_rm(ORIG)
        ctx.decode_run(LIVE, prefix, 0)
        ref = ctx.logits(ctx.decode_run(LIVE, span + tail, p))
        ctx.seq_rm(LIVE, p, -1)
        none = ctx.logits(ctx.decode_run(LIVE, tail, p))
        ctx.seq_rm(LIVE, p, -1)

        rec = KVRecaller(ctx, policy=SplicePolicy(min_tokens=64, heal=4), scratch=SCRATCH)
        assert rec.insert(seq=LIVE, pos0=p, tokens=span, kv=kv) == "spliced"
        got = ctx.logits(ctx.decode_run(LIVE, tail, p + n))
        assert int(got.argmax()) == int(ref.argmax())
        assert _kl(ref, got) < KL_BOUND
        assert _kl(ref, got) < _kl(ref, none) / 5  # far closer than leaving the span out
        assert rec.counters["spliced_tokens"] == n
