"""`ClusterPool` on the tiny model: re-reading one agent from the archive, ledger-only commits, refused fences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentmem import MemoryPool
from agentmem.cluster import ClusterPool
from agentmem.errors import ConfigError, LeaseLostError


def cluster_pool(path: Path, archive: Path) -> ClusterPool:
    return ClusterPool(path, n_ctx=1024, resident_agents=2, n_threads=1, archive_path=str(archive), cold_codec="f16")


def msgs(n: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": "You are terse."}]
    for i in range(n):
        out += [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
    return out + [{"role": "user", "content": "next"}]


def test_a_replica_needs_an_archive(tiny_model_path: Path) -> None:
    with pytest.raises(ConfigError, match="archive"):
        ClusterPool(tiny_model_path, n_ctx=512, resident_agents=1, n_threads=1)


def test_reload_drops_the_local_copy_and_reads_what_the_archive_holds_now(tiny_model_path: Path, tmp_path: Path) -> None:
    with cluster_pool(tiny_model_path, tmp_path / "a.db") as pool:
        pool.chat("x", msgs(2), max_tokens=4)
        assert pool.commit("x")
        mine = pool.history_tokens("x")
        assert pool.tier_of("x") == "hot"
        # "another replica" served x meanwhile: its ledger in the archive is now shorter and has no state
        arc = pool.archive
        with arc.transaction():
            arc.put_ledger("x", np.asarray(mine[:7], np.int32), [(0, 7, "system", 0)])
            arc.delete_state("x")
        assert pool.reload("x") is True
        assert pool.tier_of("x") == "empty" and pool.history_tokens("x") == [], "no state: the next call prefills"
        r = pool.chat("x", msgs(2), max_tokens=4)
        assert r.usage.cached_tokens == 0, "nothing stale was reused"
        assert pool.reload("unknown") is False and "unknown" not in pool.agents()


def test_reload_of_a_committed_agent_restores_its_kv_from_the_archive(tiny_model_path: Path, tmp_path: Path) -> None:
    with cluster_pool(tiny_model_path, tmp_path / "a.db") as pool:
        first = pool.chat("x", msgs(2), max_tokens=4)
        assert pool.commit("x")
        assert pool.reload("x") is True and pool.tier_of("x") == "cold"
        again = pool.chat("x", [*msgs(2)[:-1], {"role": "user", "content": "next"},
                                {"role": "assistant", "content": first.text}, {"role": "user", "content": "more"}],
                          max_tokens=4)
        assert again.kv == "restored" and again.usage.cached_tokens >= first.usage.prompt_tokens - 8


def test_commit_ledger_stores_the_ledger_and_drops_the_state_it_no_longer_matches(tiny_model_path: Path,
                                                                                   tmp_path: Path) -> None:
    with cluster_pool(tiny_model_path, tmp_path / "a.db") as pool:
        pool.chat("x", msgs(1), max_tokens=4)
        pool.commit("x")
        assert pool.archive.get_state_info("x") is not None
        pool.chat("x", msgs(2), max_tokens=4)
        assert pool.commit_ledger("x")
        assert pool.archive.get_state_info("x") is None
        assert pool.archive.get_ledger("x").n_tokens == len(pool.tokens("x"))


def test_a_refused_fence_writes_nothing(tiny_model_path: Path, tmp_path: Path) -> None:
    with cluster_pool(tiny_model_path, tmp_path / "a.db") as pool:
        pool.chat("x", msgs(1), max_tokens=4)
        pool.commit("x")
        before = pool.archive.get_ledger("x").n_tokens

        def fence(agent_id: str) -> object:
            raise LeaseLostError(f"not ours: {agent_id}")

        pool.set_fence(fence)
        pool.chat("x", msgs(2), max_tokens=4)
        with pytest.raises(LeaseLostError):
            pool.commit("x")
        with pytest.raises(LeaseLostError):
            pool.forget("x")
        assert pool.archive.get_ledger("x").n_tokens == before and "x" in pool.agents()
        pool.set_fence(None)


def test_a_plain_pool_is_unchanged(tiny_model_path: Path, tmp_path: Path) -> None:
    """Regression guard: the pool without a fence writes as before (no `fence` argument reaches the archive)."""
    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=1, n_threads=1, archive_path=str(tmp_path / "b.db")) as p:
        p.chat("x", msgs(1), max_tokens=3)
        assert p.commit("x")
        p.forget("x")
        assert p.agents() == []
