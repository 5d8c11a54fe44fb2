"""A pool on either archive backend (tiny synthetic models): `archive_path` (SQLite) or `archive_url` (PostgreSQL).

Issue #17 item 1: park to COLD, close, reopen in a new pool from the same archive and
restore with cached tokens; the PostgreSQL runs use the real server of
`tests/fixtures/postgres.py`.
"""

from __future__ import annotations

from typing import Any

import pytest

import time

from agentmem import ConfigError, MemoryPool
from agentmem.archive import open_archive
from agentmem.errors import LeaseLostError

OPTS = dict(n_ctx=1024, resident_agents=2, n_batch=64, prefetch=False)


def _archive(target: str) -> dict[str, Any]:
    return {"archive_url": target} if target.startswith("postgresql://") else {"archive_path": target}


def conv(*turns: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


def test_restart_resumes_from_either_archive_without_prefill(tiny_model_path, archive_target: str) -> None:
    follow = conv("tell me about cats", "ok", "more please")
    with MemoryPool(tiny_model_path, cold_codec="f16", **_archive(archive_target), **OPTS) as p:
        p.chat("a", conv("tell me about cats"), max_tokens=6)
        p.chat("b", conv("dogs"), max_tokens=6)
        p.park("a", "cold")
        ref_tokens = p.tokens("a")
    with open_archive(archive_target, readonly=True) as arc:
        assert {r.agent_id: r.tier for r in arc.list_agents()} == {"a": "cold", "b": "cold"}
    with MemoryPool(tiny_model_path, cold_codec="f16", **_archive(archive_target), **OPTS) as p:
        st = p.stats()
        assert st["agents"]["a"]["tier"] == "cold" and st["totals"]["resumed_agents"] == 2
        assert p.tokens("a") == ref_tokens
        r = p.chat("a", follow, max_tokens=6)
        assert r.kv == "restored" and r.usage.cached_tokens > 0
        assert p.stats()["tiers"]["cold"]["hits"] == 1
    with MemoryPool(tiny_model_path, **OPTS) as p:  # never restarted
        p.chat("a", conv("tell me about cats"), max_tokens=6)
        assert p.chat("a", follow, max_tokens=6).text == r.text


def test_sliding_window_checkpoints_and_shared_blocks_survive_either_archive(tiny_gemma3_path, archive_target: str) -> None:
    """The SWA checkpoint and a shared block's counted references go through the backend too."""
    brief = [{"role": "system", "content": "You are on a team that writes a parser. Be brief and exact. " * 4}]
    asks = ("plan the work", "write the code")
    opts = {**OPTS, "resident_agents": 3, **_archive(archive_target)}
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        p.share("brief", brief)
        for i, ask in enumerate(asks):
            p.chat(f"w{i}", brief + conv(ask), max_tokens=1)
        p.chat("solo", conv("tell me about the weather in paris today please"), max_tokens=12)
        for a in ("w0", "w1", "share:brief", "solo"):
            p.park(a, "cold")
        blocks = p.stats()["shared"]["blocks"]
        assert len(blocks) == 1 and next(iter(blocks.values()))["archive_refs"] == 3
    with open_archive(archive_target, readonly=True) as arc:
        assert [b.refcount for b in arc.list_shared_blocks()] == [3]
        assert set(arc.state_blocks()) == {"w0", "w1", "share:brief"}
        assert "solo" in arc.checkpoint_prompt_ends()
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        again = p.chat("w0", brief + conv(asks[0], "a reply", "go on"), max_tokens=2)
        assert again.kv == "restored" and again.usage.cached_tokens > 0
        solo = p.chat("solo", conv("tell me about the weather in paris today please", "another reply", "and tomorrow?"),
                      max_tokens=2)  # diverges inside the window: rolls back to the archived checkpoint
        assert solo.kv == "restored" and solo.usage.cached_tokens > 0
        for a in ("w0", "w1", "share:brief", "solo"):
            p.forget(a)
    with open_archive(archive_target, readonly=True) as arc:
        assert arc.list_shared_blocks() == [] and arc.state_blocks() == {}


def test_a_pool_that_lost_the_lease_cannot_store_the_agent(tiny_model_path, archive_target: str) -> None:
    """`set_default_fence` fences the pool's own writes (its persister passes no `fence=`)."""
    with MemoryPool(tiny_model_path, **_archive(archive_target), **OPTS) as p:
        arc = p.engine()._core.archive
        lease = arc.acquire_lease("a", owner="replica-a", ttl_s=0.2)
        arc.set_default_fence(lease)
        r = p.chat("a", conv("tell me about cats"), max_tokens=4)
        p.commit("a")  # current: stored
        committed = arc.get_ledger("a").n_tokens
        p.chat("a", conv("tell me about cats", r.text, "and dogs?"), max_tokens=4)
        time.sleep(0.3)
        arc.acquire_lease("a", owner="replica-b", ttl_s=30)  # another replica takes over
        with pytest.raises(LeaseLostError):
            p.park("a", "cold")
        with pytest.raises(LeaseLostError):
            p.commit("a")
        assert p.stats()["agents"]["a"]["tier"] == "hot"  # kept in RAM, nothing written
        assert len(p.tokens("a")) > committed
    # closing could not save it either (logged): the archive holds what was committed under the lease
    with open_archive(archive_target, readonly=True) as arc:
        assert arc.get_ledger("a").n_tokens == committed
        assert [e.kind for e in arc.lease_log("a")] == ["acquire", "takeover"]


def test_archive_path_and_url_are_exclusive_and_the_url_stays_secret() -> None:
    with pytest.raises(ConfigError, match="not both"):
        MemoryPool(archive_path="a.db", archive_url="postgresql://u:pw@h/db")
    with pytest.raises(ConfigError, match="postgresql:// URL"):
        MemoryPool(archive_url="mysql://u:pw@h/db")
    from agentmem.config import PoolConfig

    cfg = PoolConfig(archive_url="postgresql://u:hunter2@h/db")
    assert "hunter2" not in repr(cfg) and PoolConfig.from_dict(cfg.to_dict()) == cfg
