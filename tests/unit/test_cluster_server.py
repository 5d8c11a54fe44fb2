"""`agentmem serve` in cluster mode on the tiny model: leases around calls, stale copies re-read, 503s to retry.

One real replica (uvicorn in a thread, a `ClusterPool` over a SQLite archive) and a
second owner acting through the same archive: it takes leases and writes agents
the way another replica would. The two-process failover over PostgreSQL and nginx
is tests/integration/test_failover.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

import httpx  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.cluster import ClusterPool, LeaseKeeper, Replica  # noqa: E402
from agentmem.cluster.audit import lease_intervals, overlaps  # noqa: E402
from agentmem.errors import ConfigError  # noqa: E402
from agentmem.server import ServerSettings, create_app  # noqa: E402
from agentmem.server.cli import build  # noqa: E402
from agentmem.cli import build_parser  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

TTL = 3.0


@pytest.fixture
def replica(tiny_model_path: Path, tmp_path: Path) -> Any:
    served = MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=2, n_threads=1,
                        archive_path=str(tmp_path / "shared.db"), cold_codec="f16", open_engine=ClusterPool)
    pool = served.engine()  # the replica's engine: its lease store, fence and reloads
    keeper = LeaseKeeper(pool.archive, owner="r0", ttl_s=TTL, wait_s=0.5)
    rep = Replica(pool, keeper, durability="call")
    settings = ServerSettings(model_name="tiny", default_max_tokens=8, cluster=True, durability="call",
                              replica_id="r0", lease_ttl_s=TTL)
    app = create_app(served, settings=settings, replica=rep, own_pool=True)
    with ServerThread(app) as srv:
        srv.pool, srv.keeper = pool, keeper
        srv.other = LeaseKeeper(pool.archive, owner="r1", ttl_s=TTL, wait_s=0.2)
        yield srv


def chat(srv: Any, agent: str, text: str, history: list[dict[str, str]] | None = None) -> httpx.Response:
    msgs = [{"role": "system", "content": "You are terse."}, *(history or []), {"role": "user", "content": text}]
    return httpx.post(f"{srv.base_url}/v1/chat/completions", headers={"X-Agent-Id": agent},
                      json={"model": "tiny", "messages": msgs, "max_tokens": 8}, timeout=60)


def test_a_call_holds_the_lease_and_commits_under_it(replica: Any) -> None:
    r = chat(replica, "x", "hello")
    assert r.status_code == 200, r.text
    assert replica.keeper.held() == ["x"]
    lease = replica.pool.archive.current_lease("x")
    assert lease.owner == "r0"
    assert replica.pool.archive.get_state_info("x") is not None, "durability call: the state is in the archive"
    with pytest.raises(Exception, match="leased by 'r0'"):
        replica.other.claim("x")


def test_an_agent_held_elsewhere_gets_a_retryable_503(replica: Any) -> None:
    replica.other.claim("y")
    r = chat(replica, "y", "hello")
    assert r.status_code == 503 and r.json()["error"]["code"] == "agent_elsewhere"
    assert 1 <= int(r.headers["retry-after"]) <= TTL + 1
    streamed = httpx.post(f"{replica.base_url}/v1/chat/completions", headers={"X-Agent-Id": "y"}, timeout=60,
                          json={"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert streamed.status_code == 503, "refused before the first token: a plain HTTP error, not an SSE one"


def test_a_copy_served_elsewhere_meanwhile_is_dropped_and_re_read(replica: Any) -> None:
    first = chat(replica, "z", "hello")
    assert first.status_code == 200
    replica.keeper.release("z")  # as after idle_s without calls
    # the other replica serves z: it writes a shorter ledger and no state, under its lease
    other, arc = replica.other, replica.pool.archive
    assert other.claim("z") is True
    fence = other.fence("z")
    with arc.transaction():
        arc.put_ledger("z", np.asarray(replica.pool.history_tokens("z")[:5], np.int32), [(0, 5, "system", 0)],
                       fence=fence)
        arc.delete_state("z", fence=fence)
    other.done("z")
    other.release("z")
    again = chat(replica, "z", "hello")
    assert again.status_code == 200
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "the stale local KV was not used"
    assert replica.keeper.counts["stale_reloads"] == 2  # the first call, and this one


def test_a_lost_lease_refuses_the_commit_and_drops_the_local_copy(replica: Any) -> None:
    assert chat(replica, "w", "hello").status_code == 200
    arc = replica.pool.archive
    arc.release_lease(replica.keeper.fence("w"))  # behind the keeper's back: it still thinks it holds w
    replica.other.claim("w")
    before = arc.get_ledger("w").n_tokens
    r = chat(replica, "w", "again")
    assert r.status_code == 503 and r.json()["error"]["code"] == "lease_lost", r.text
    assert arc.get_ledger("w").n_tokens == before, "nothing was written under the lost lease"
    log = arc.lease_log("w")
    assert overlaps(lease_intervals(log, ttl_s=TTL)) == []


def test_cluster_flags(tmp_path: Path) -> None:
    def parse(*flags: str) -> Any:
        return build_parser().parse_args(["serve", *flags])

    with pytest.raises(ConfigError, match="one archive"):
        build(parse("--archive", str(tmp_path / "a.db"), "--archive-url", "postgresql://x/y"))
    with pytest.raises(ConfigError, match="lazy needs cluster"):
        ServerSettings(durability="lazy")
    with pytest.raises(ConfigError, match="call or lazy in cluster"):
        ServerSettings(cluster=True, durability="exit")
    with pytest.raises(ConfigError, match="lease_ttl_s"):
        ServerSettings(cluster=True, durability="call", lease_ttl_s=0)
    s = ServerSettings(cluster=True, durability="lazy", replica_id="r7", lease_ttl_s=5)
    assert ServerSettings.from_dict(s.to_dict()) == s


def test_lazy_durability_commits_the_ledger_per_call_and_the_state_at_idle_release(tiny_model_path: Path,
                                                                                   tmp_path: Path) -> None:
    import time

    served = MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=2, n_threads=1,
                        archive_path=str(tmp_path / "lazy.db"), cold_codec="f16", open_engine=ClusterPool)
    pool = served.engine()
    keeper = LeaseKeeper(pool.archive, owner="r0", ttl_s=TTL, idle_s=0.3)
    settings = ServerSettings(model_name="tiny", cluster=True, durability="lazy", replica_id="r0", lease_ttl_s=TTL)
    app = create_app(served, settings=settings, replica=Replica(pool, keeper, durability="lazy"), own_pool=True)
    with ServerThread(app) as srv:
        srv.pool = pool
        assert chat(srv, "x", "one").status_code == 200
        assert chat(srv, "x", "two").status_code == 200
        arc = pool.archive
        assert arc.get_ledger("x").n_tokens == len(pool.tokens("x")), "the ledger is committed after every call"
        assert arc.get_state_info("x") is None, "no KV state per call"
        time.sleep(0.4)
        keeper.tick()
        assert arc.get_state_info("x") is not None, "the state reached the archive before the lease went"
        assert arc.current_lease("x") is None and keeper.held() == []
