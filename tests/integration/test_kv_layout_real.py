"""Both KV layouts on the real models: the same greedy replies (up to late rounding drift) through parks, restores and a shared brief."""

from __future__ import annotations

import pytest

from agentmem import MemoryPool
from tests.fixtures.kv_probe import within_unified_drift

pytestmark = pytest.mark.integration

BRIEF = {"role": "system", "content": "You review pull requests for a payments service. " * 24}


def test_unified_and_per_sequence_streams_give_identical_greedy_replies(default_model_path):
    out: dict[str, list[list[int]]] = {}
    for layout in ("unified", "per_sequence"):
        with MemoryPool(default_model_path, n_ctx=4096, resident_agents=2, n_threads=1, prefetch=False,
                        batch_decode=False, kv_layout=layout) as p:
            hist = {a: [BRIEF] for a in ("planner", "coder", "tester")}
            got = []
            for k in range(2):
                for a in hist:
                    msgs = hist[a] + [{"role": "user", "content": f"Round {k}: what should the {a} check first?"}]
                    r = p.chat(a, msgs, max_tokens=8)
                    got.append(r.tokens)
                    # the same next prompt in both layouts, whatever was generated (a reply that
                    # drifted must not change the prompts the comparison continues with)
                    hist[a] = msgs + [{"role": "assistant", "content": f"The {a} checks item {k} first."}]
            t = p.stats()["totals"]
            assert t["kv_layout"] == layout and t["restores"] > 0 and t["shared_prefix_hits"] > 0, t
            out[layout] = got
    # Not bitwise: a unified cache attends over every occupied cell (other sequences' masked),
    # so llama.cpp's CPU attention reduces over more cells and rounds differently, while a
    # per-sequence stream computes exactly what the agent alone would (benchmarks/isolation.py).
    # A wrong cache diverges at once; drift shows late. (This asserted "all but one reply
    # equal", which held or not by chance: issue #36.)
    pairs = list(zip(out["per_sequence"], out["unified"]))
    assert all(within_unified_drift(q, u) for q, u in pairs), out
