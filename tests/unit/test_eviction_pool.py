"""Eviction inside the pool (tiny model): budgets, KV/ledger agreement, reuse, recall, pins."""

from __future__ import annotations

import pytest

from agentmem import ContextOverflowError, MemoryPool
from agentmem.policy.eviction import POLICIES


def long_conv(n_turns: int, *, pin_first: bool = False) -> list[dict]:
    msgs = [{"role": "system", "content": "you are a careful assistant and the vault code is 4821", "pin": pin_first}]
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"turn {i}: the weather today is fine and the river {i} is calm"})
        msgs.append({"role": "assistant", "content": f"noted item {i} about the river and the weather"})
    msgs.append({"role": "user", "content": "what is the vault code?"})
    return msgs


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_budget_respected_and_kv_matches_ledger(tiny_model_path, policy):
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False,
                    agent_budget_tokens=256, eviction=policy) as p:
        msgs = long_conv(20)
        r = p.chat("a", msgs, max_tokens=4)
        st = p.stats()["agents"]["a"]
        assert st["evictions"] >= 1 and st["evicted_tokens"] > 0
        assert st["live_tokens"] <= 256
        assert st["tokens"] == r.usage.prompt_tokens + r.usage.completion_tokens - (r.finish_reason == "length")
        seq = p._core.agents["a"].seq
        # positions stay contiguous: the KV ends exactly at the ledger's live count
        assert p.ctx.seq_pos_max(seq) == st["live_tokens"] - 1
        assert p.ctx.seq_pos_min(seq) == 0
        # the whole history is still matched: the next turn reuses it (no re-decode of evicted spans)
        msgs2 = msgs + [{"role": "assistant", "content": r.text}, {"role": "user", "content": "thanks"}]
        r2 = p.chat("a", msgs2, max_tokens=4)
        assert r2.kv == "reused" and r2.usage.cached_tokens >= r.usage.prompt_tokens


def test_pinned_messages_are_never_evicted(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False,
                    agent_budget_tokens=200, eviction="sliding_window") as p:
        p.chat("a", long_conv(20, pin_first=True), max_tokens=2)
        led = p._core.agents["a"].ledger
        assert led.live[led.pinned].all() and led.pinned.any()


def test_recall_returns_evicted_text(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False,
                    agent_budget_tokens=200, eviction="streaming_llm") as p:
        p.chat("a", long_conv(20), max_tokens=2)
        hits = p.recall("a", "river 3 calm", k=3)
        assert hits and any("3 is calm" in h.text for h in hits)
        assert p.stats()["totals"]["recall_hits"] == 1


def test_without_budget_overflow_raises_with_budget_it_trims(tiny_model_path):
    msgs = long_conv(60)
    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=1, n_batch=64, prefetch=False) as p:
        with pytest.raises(ContextOverflowError):
            p.chat("a", msgs, max_tokens=2)
    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=1, n_batch=64, prefetch=False,
                    agent_budget_tokens=300) as p:
        r = p.chat("a", msgs, max_tokens=2)
        assert r.usage.prompt_tokens > 512 and p.stats()["agents"]["a"]["live_tokens"] <= 300


def test_per_agent_budget_and_restore_after_eviction(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False) as p:
        p.set_budget("a", 200, eviction="region_decay")
        msgs = long_conv(15)
        p.chat("a", msgs, max_tokens=2)
        p.chat("b", [{"role": "user", "content": "hi"}], max_tokens=2)  # parks a (evicted state)
        r = p.chat("a", msgs + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}], max_tokens=2)
        assert r.kv == "restored" and p.stats()["agents"]["b"]["evictions"] == 0
