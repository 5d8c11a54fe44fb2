"""Gemma 3's sliding window on the real model: a restored agent keeps the re-sent part of its reply.

Gemma 3 270M keeps 512 positions in 15 of its 18 layers. A parked state holds those
layers only for the last window before its end; its checkpoint holds them as of the
prompt end. A call that re-sends the reply cut short (2+ tokens before the KV's end) used
to roll back to the prompt end; now the checkpoint and the reply's live cells give the
window at the cut. These tests check the KV it continues from against a never-parked
agent (byte for byte, and the same greedy reply) and against a fresh prefill of the same
tokens (the same argmax, logits and next-token KL within the measured drift, the first
greedy tokens equal).
"""

from __future__ import annotations

import numpy as np
import pytest

from agentmem import MemoryPool
from tests.fixtures.kv_probe import UNIFIED_MAX_KL, after_reconcile, first_logits, next_token_kl, within_unified_drift

pytestmark = pytest.mark.integration

WORDS = "river stone lantern market orchard signal harbor ledger garden copper thunder meadow".split()
NOTES = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(700))  # ~700 tokens: longer than the window
FIRST = [{"role": "system", "content": f"You are agent 0. Your notes: {NOTES}"},
         {"role": "user", "content": "Question 1: which word comes first in your notes?"}]
OPTS = dict(n_ctx=4096, resident_agents=1, n_threads=1, prefetch=False, min_share_tokens=0, batch_decode=False)


def test_a_restored_gemma_agent_continues_from_the_kv_of_a_fresh_prefill(gemma_model_path):
    # Gemma only: the sliding window is what is under test
    with MemoryPool(gemma_model_path, **OPTS) as p:
        r1 = p.chat("a", FIRST, max_tokens=12)
        assert len(r1.tokens) == 12, (r1.finish_reason, r1.text)
        cut = p.engine().model.detokenize(r1.tokens[:7])  # the app re-sends the reply's first 7 tokens
        follow = FIRST + [{"role": "assistant", "content": cut}, {"role": "user", "content": "Question 2: and the last word?"}]
        p.chat("b", [{"role": "user", "content": "hello"}], max_tokens=2)  # parks a (one live sequence)
        with after_reconcile(p) as seen, first_logits(p) as logits:
            r2 = p.chat("a", follow, max_tokens=16)
        assert r2.kv == "restored"
    with MemoryPool(gemma_model_path, **OPTS) as p:  # never parked
        p.chat("a", FIRST, max_tokens=12)
        with after_reconcile(p) as seen_never, first_logits(p) as logits_never:
            never = p.chat("a", follow, max_tokens=16)
    with MemoryPool(gemma_model_path, **OPTS) as p:  # one fresh prefill of the same tokens
        with first_logits(p) as logits_fresh:
            fresh = p.chat("a", follow, max_tokens=16)
        assert fresh.usage.cached_tokens == 0
    kept_reply = r2.usage.cached_tokens - r1.usage.prompt_tokens
    assert kept_reply >= 5, (r2.usage.cached_tokens, r1.usage.prompt_tokens)  # was 0: rolled back to the prompt end
    assert r2.usage.cached_tokens == never.usage.cached_tokens
    (n_keep, rows), (_, rows_never) = seen[0], seen_never[0]
    window = range(n_keep - 512 + 1, n_keep)
    assert all(rows[q] == rows_never[q] for q in window)  # the cells a never-parked agent continues from
    assert max(rows) == n_keep - 1
    # the restored agent continues bit for bit like the never-parked one (same cells, same slots, same calls)
    np.testing.assert_array_equal(logits[0], logits_never[0])
    assert r2.tokens == never.tokens, (r2.text, never.text)
    # A fresh prefill decodes the reply's tokens in one batch, generation one at a time:
    # llama.cpp's CPU kernels round those differently, by about as much as any reuse does,
    # so the greedy replies may part after a few tokens at a near-tie (regression, issue #36:
    # `r2.tokens == fresh.tokens` was asserted and parted at token 9-16 by chance).
    assert within_unified_drift(fresh.tokens, r2.tokens), (fresh.text, r2.text)
    assert next_token_kl(logits_fresh[0], logits[0]) < UNIFIED_MAX_KL
    diff = float(np.abs(logits[0] - logits_fresh[0]).max())
    assert int(np.argmax(logits[0])) == int(np.argmax(logits_fresh[0]))
    assert diff < 0.05 * float(np.ptp(logits_fresh[0])), diff
