"""Shared prefixes, handoff and batched decoding on the tiny synthetic model."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from agentmem import AgentMemError, ConfigError, MemoryPool
from agentmem.memory.ledger import Ledger
from agentmem.memory.shared import HandoffCard, longest_shared_prefix, token_checksum

BRIEF = "the team must ship the release on friday and every change needs a review " * 4


def team(user: str) -> list[dict]:
    return [{"role": "system", "content": BRIEF}, {"role": "user", "content": user}]


@pytest.fixture()
def pool(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=4, n_batch=64, prefetch=False, batch_decode=False) as p:
        yield p


def test_longest_shared_prefix_skips_evicted_tokens():
    a = Ledger()
    a.extend(list(range(10)), region="system")
    a.evict_live([(5, 7)])
    n = longest_shared_prefix(np.arange(10), [("a", a)])
    assert n == ("a", 5)


def test_new_agent_shares_a_live_prefix_and_matches_prefill(pool, tiny_model_path):
    pool.chat("planner", team("plan the work"), max_tokens=4)
    r = pool.chat("coder", team("write the code"), max_tokens=6)
    assert r.kv == "shared" and r.usage.cached_tokens >= 32
    st = pool.stats()["totals"]
    assert st["shared_prefix_hits"] == 1
    assert st["hot_cells_bytes"] < st["hot_bytes"]  # shared cells counted once
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=4, n_batch=64, prefetch=False, min_share_tokens=0) as p:
        alone = p.chat("coder", team("write the code"), max_tokens=6)
        assert alone.kv == "prefilled"
    assert r.tokens == alone.tokens


def test_declared_share_used_when_parked(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False) as p:
        n = p.share("brief", [{"role": "system", "content": BRIEF}])
        assert n > 32
        p.chat("x", [{"role": "user", "content": "unrelated"}], max_tokens=2)  # parks the share
        assert p.stats()["agents"]["share:brief"]["tier"] == "warm"
        assert p.stats()["agents"]["share:brief"]["share"] is True
        r = p.chat("coder", team("write the code"), max_tokens=4)
        assert r.kv == "shared" and r.usage.cached_tokens >= 32


def test_handoff_copy_on_write(pool):
    msgs = team("design the api")
    pool.chat("src", msgs, max_tokens=4)
    before = pool.tokens("src")
    card = pool.handoff("src", "dst")
    unified = pool.engine().ctx.params.kv_unified  # (per-sequence streams: `pytest --kv-layout per_sequence`)
    assert isinstance(card, HandoffCard) and card.mode == ("shared" if unified else "copied") and card.seq_no == 1
    assert card.n_tokens == len(before) and card.verify(np.asarray(pool.history_tokens("dst")))
    if unified:
        # both now reference one shared block of the handed cells: parked, they keep it once
        assert card.block is not None and card.block_tokens == card.n_live and card.private_tokens == 0
        st = pool.stats()
        assert st["agents"]["src"]["block"] == st["agents"]["dst"]["block"] == card.block
        assert st["shared"]["blocks"][card.block]["refs"] == 2
    else:  # a copy: no cells (and no block) shared
        assert card.block is None and pool.stats()["agents"]["dst"]["block"] is None
    r = pool.chat("dst", msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "now the db"}], max_tokens=4)
    assert r.kv == "reused" and r.usage.cached_tokens > 0
    assert pool.tokens("src") == before  # the source is unaffected by the destination's divergence
    assert pool.chat("src", msgs, max_tokens=4).usage.cached_tokens == len(pool.renderer.render(msgs).tokens) - 1


def test_handoff_from_parked_source_and_errors(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False) as p:
        p.chat("src", team("design"), max_tokens=3)
        card = p.handoff("src", "dst", upto=20)  # src is parked to make room for dst
        assert card.mode in ("shared", "copied", "restored") and card.n_tokens == 20
        assert p.history_tokens("dst") == p.history_tokens("src")[:20]
        with pytest.raises(ConfigError, match="upto"):
            p.handoff("src", "other", upto=10_000)
        with pytest.raises(ConfigError, match="two different"):
            p.handoff("src", "src")
        with pytest.raises(AgentMemError, match="unknown agent"):
            p.handoff("ghost", "dst")
    assert token_checksum(np.arange(3)) == token_checksum(np.arange(3, dtype=np.int64))


async def test_batched_decoding_groups_agents(tiny_model_path):
    # n_threads=2: with one llama.cpp thread the tiny model decodes so fast that the first agent
    # can finish all its steps before the others reach the batch (the default thread count
    # drops to 1 on a busy machine)
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=4, n_batch=64, prefetch=False, n_threads=2) as p:
        p.batch_wait_s = 0.05  # generous on a loaded CI box
        msgs = {f"a{i}": [{"role": "user", "content": f"story number {i}"}] for i in range(4)}
        res = await asyncio.gather(*(p.achat(a, m, max_tokens=12) for a, m in msgs.items()))
        t = p.stats()["totals"]
        assert t["max_batch"] >= 2 and t["batched_tokens"] > t["batched_steps"]
        for r in res:
            assert p.tokens(r.agent_id)[: len(p.renderer.render(msgs[r.agent_id]).tokens)] == p.renderer.render(msgs[r.agent_id]).tokens


async def test_a_batch_leader_is_woken_when_the_last_agent_joins(tiny_model_path):
    """Regression: an agent joining the decode batch never woke the waiting leader, so every
    step of concurrent agents waited the whole `batch_wait_s` (4 agents x 12 tokens took 24 s
    at `batch_wait_s=2`; the default 2 ms was lost on every step)."""
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=5, n_batch=64, prefetch=False, n_threads=1) as p:
        p.batch_wait_s = 2.0
        msgs = {f"a{i}": [{"role": "user", "content": f"story number {i}"}] for i in range(4)}
        for a, m in msgs.items():
            p.chat(a, m, max_tokens=1)
        t0 = time.perf_counter()
        res = await asyncio.gather(*(p.achat(a, m, max_tokens=12) for a, m in msgs.items()))
        took = time.perf_counter() - t0
    assert all(len(r.tokens) == 12 for r in res), [len(r.tokens) for r in res]
    assert took < 8.0, f"{took=:.1f}s: the leader waited out batch_wait_s on most steps"
