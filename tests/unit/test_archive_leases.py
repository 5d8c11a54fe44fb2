"""Contract tests of agent leases and fencing, over SQLite and PostgreSQL (`arc`, tests/fixtures/archives.py).

Issue #17 item 2: an agent is served by one replica at a time through a lease row
(owner, fencing token, expiry); a replica that lost its lease can no longer commit
that agent's writes, because the token is checked in the same transaction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from agentmem.archive import ArchiveBase, Lease, LeaseEvent
from agentmem.errors import ArchiveError, ConfigError, LeaseError, LeaseHeldError, LeaseLostError

FP = {"model": "m"}
TTL = 30.0
SHORT = 0.25  # a lease that lapses within the test


def _expired(arc: ArchiveBase, agent_id: str, owner: str) -> Lease:
    lease = arc.acquire_lease(agent_id, owner=owner, ttl_s=SHORT)
    time.sleep(SHORT + 0.1)
    assert arc.current_lease(agent_id) is None
    return lease


def test_acquire_renew_release_and_tokens_only_grow(arc: ArchiveBase) -> None:
    first = arc.acquire_lease("coder", owner="a", ttl_s=TTL)
    assert (first.agent_id, first.owner, first.token) == ("coder", "a", 1)
    assert arc.current_lease("coder") == first
    again = arc.acquire_lease("coder", owner="a", ttl_s=TTL)  # the holder asking again renews
    assert again.token == 1 and again.expires_at >= first.expires_at
    with pytest.raises(LeaseHeldError) as info:
        arc.acquire_lease("coder", owner="b", ttl_s=TTL)
    err = info.value
    assert (err.agent_id, err.owner) == ("coder", "a") and 0 < err.expires_in_s <= TTL
    assert isinstance(err, LeaseError) and isinstance(err, ArchiveError)
    renewed = arc.renew_lease(again, ttl_s=TTL)
    assert renewed.token == 1 and renewed.expires_at >= again.expires_at
    arc.release_lease(renewed)
    arc.release_lease(renewed)  # idempotent
    assert arc.current_lease("coder") is None
    second = arc.acquire_lease("coder", owner="b", ttl_s=TTL)
    assert second.token == 2  # never reused after a release
    assert arc.acquire_lease("other", owner="b", ttl_s=TTL).token == 1  # per agent
    log = arc.lease_log("coder")
    assert [(e.owner, e.token, e.kind) for e in log] == [
        ("a", 1, "acquire"), ("a", 1, "renew"), ("a", 1, "renew"), ("a", 1, "release"), ("b", 2, "acquire"),
    ]
    assert all(isinstance(e, LeaseEvent) for e in log) and [e.at for e in log] == sorted(e.at for e in log)


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced_out(arc: ArchiveBase) -> None:
    old = _expired(arc, "coder", "a")
    new = arc.acquire_lease("coder", owner="b", ttl_s=TTL)
    assert new.token == old.token + 1
    assert arc.lease_log("coder")[-1].kind == "takeover"
    with pytest.raises(LeaseLostError, match="token 2 is held by 'b'"):
        arc.renew_lease(old, ttl_s=TTL)
    with pytest.raises(LeaseLostError, match="nothing was written"):
        arc.put_ledger("coder", [1, 2, 3], [], fence=old)
    assert arc.get_ledger("coder") is None
    arc.release_lease(old)  # no error, and the new holder keeps the lease
    assert arc.current_lease("coder") == new
    arc.put_ledger("coder", [1, 2, 3], [], fence=new)
    assert arc.get_ledger("coder").n_tokens == 3


def test_an_expired_lease_nobody_took_is_still_current(arc: ArchiveBase) -> None:
    """Fencing checks the token, not the clock: until another owner takes over, the holder may write."""
    old = _expired(arc, "coder", "a")
    arc.put_agent("coder", fence=old)
    renewed = arc.renew_lease(old, ttl_s=TTL)
    assert renewed.token == old.token and arc.current_lease("coder") == renewed


def test_the_same_owner_after_expiry_gets_a_new_token(arc: ArchiveBase) -> None:
    old = _expired(arc, "coder", "a")
    new = arc.acquire_lease("coder", owner="a", ttl_s=TTL)
    assert new.token == old.token + 1 and arc.lease_log("coder")[-1].kind == "acquire"


def test_tokens_survive_deleting_the_agent(arc: ArchiveBase) -> None:
    lease = arc.acquire_lease("coder", owner="a", ttl_s=TTL)
    arc.put_ledger("coder", [1], [], fence=lease)
    assert arc.delete_agent("coder", fence=lease)
    arc.release_lease(lease)
    assert arc.acquire_lease("coder", owner="b", ttl_s=TTL).token == lease.token + 1


def _fenced_writes() -> list[tuple[str, Callable[[ArchiveBase, Lease], object]]]:
    toks = np.arange(3, dtype=np.int32)
    return [
        ("put_agent", lambda a, f: a.put_agent("coder", priority=5, fence=f)),
        ("put_ledger", lambda a, f: a.put_ledger("coder", toks, [(0, 3, "user", 0)], fence=f)),
        ("delete_ledger", lambda a, f: a.delete_ledger("coder", fence=f)),
        ("put_state", lambda a, f: a.put_state("coder", b"new", codec="f16", n_tokens=3, fingerprint=FP, fence=f)),
        ("put_state+block", lambda a, f: a.put_state("coder", b"new", codec="f16", n_tokens=3, fingerprint=FP,
                                                     block_id="blk", layout=b"\0" * 4, fence=f)),
        ("delete_state", lambda a, f: a.delete_state("coder", fence=f)),
        ("put_checkpoint", lambda a, f: a.put_checkpoint("coder", b"ck", prompt_end=(3, 3), fence=f)),
        ("log_event", lambda a, f: a.log_event("coder", "park", fence=f, to="cold")),
        ("add_evicted_span", lambda a, f: a.add_evicted_span("coder", 0, 3, "user", "zebra", fence=f)),
        ("add_evicted_spans", lambda a, f: a.add_evicted_spans("coder", [(0, 3, "user", "zebra")], fence=f)),
        ("incref_shared_block", lambda a, f: a.incref_shared_block("blk", fence=f)),
        ("decref_shared_block", lambda a, f: a.decref_shared_block("blk", fence=f)),
        ("delete_agent", lambda a, f: a.delete_agent("coder", fence=f)),
    ]


def _snapshot(arc: ArchiveBase) -> tuple[object, ...]:
    led = arc.get_ledger("coder")
    return (
        arc.list_agents(), None if led is None else led.tokens.tolist(), arc.get_state_info("coder"),
        arc.get_checkpoint("coder"), arc.events("coder"), arc.list_evicted("coder"), arc.list_shared_blocks(),
    )


_WRITES = _fenced_writes()


@pytest.mark.parametrize(("name", "write"), _WRITES, ids=[n for n, _ in _WRITES])
def test_every_agent_write_with_a_stale_fence_writes_nothing(arc: ArchiveBase, name: str, write) -> None:
    arc.put_shared_block("blk", b"kv", n_tokens=1, fingerprint=FP)
    arc.incref_shared_block("blk")
    arc.put_ledger("coder", [9], [])
    arc.put_state("coder", b"old", codec="f16", n_tokens=1, fingerprint=FP)
    arc.put_checkpoint("coder", b"ck0", prompt_end=(1, 1))
    stale = _expired(arc, "coder", "a")
    current = arc.acquire_lease("coder", owner="b", ttl_s=TTL)
    before = _snapshot(arc)
    with pytest.raises(LeaseLostError, match=f"cannot {name.split('+')[0]}"):
        write(arc, stale)
    assert _snapshot(arc) == before
    write(arc, current)  # the current holder's write goes through
    assert _snapshot(arc) != before


def test_a_fenced_transaction_commits_only_while_current(arc: ArchiveBase) -> None:
    stale = _expired(arc, "coder", "a")
    with arc.transaction(fence=stale):  # still current: nobody took over
        arc.put_ledger("coder", [1], [], fence=stale)
    current = arc.acquire_lease("coder", owner="b", ttl_s=TTL)
    with pytest.raises(LeaseLostError), arc.transaction(fence=stale):
        arc.put_ledger("coder", [1, 2], [])
    assert arc.get_ledger("coder").n_tokens == 1
    with arc.transaction(fence=current):
        arc.put_ledger("coder", [1, 2], [], fence=current)
        arc.put_state("coder", b"kv", codec="f16", n_tokens=2, fingerprint=FP, fence=current)
    assert arc.get_state_info("coder").n_tokens == 2


def test_a_fence_for_another_agent_or_not_a_lease_is_refused(arc: ArchiveBase) -> None:
    lease = arc.acquire_lease("coder", owner="a", ttl_s=TTL)
    with pytest.raises(ConfigError, match="lease of agent 'coder', not of 'planner'"):
        arc.put_ledger("planner", [1], [], fence=lease)
    with pytest.raises(ConfigError, match="fence must be a Lease"):
        arc.put_ledger("coder", [1], [], fence=("coder", 1))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="pool-wide"):
        arc.log_event(None, "pool_start", fence=lease)
    assert arc.get_ledger("planner") is None and arc.events() == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"owner": "", "ttl_s": 1}, "owner"), ({"owner": 3, "ttl_s": 1}, "owner"), ({"owner": "a", "ttl_s": 0}, "ttl_s"),
     ({"owner": "a", "ttl_s": -1}, "ttl_s"), ({"owner": "a", "ttl_s": float("nan")}, "ttl_s"),
     ({"owner": "a", "ttl_s": True}, "ttl_s"), ({"owner": "a\ud800", "ttl_s": 1}, "owner")],
)
def test_bad_lease_arguments_are_typed_errors(arc: ArchiveBase, kwargs, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        arc.acquire_lease("coder", **kwargs)
    assert arc.lease_log() == [] and arc.current_lease("coder") is None


def test_lease_log_filters_and_limits(arc: ArchiveBase) -> None:
    for agent in ("a", "b", "a"):
        arc.acquire_lease(agent, owner="r1", ttl_s=TTL)
    assert [(e.agent_id, e.kind) for e in arc.lease_log()] == [("a", "acquire"), ("b", "acquire"), ("a", "renew")]
    assert [(e.agent_id, e.kind) for e in arc.lease_log(limit=2)] == [("b", "acquire"), ("a", "renew")]
    assert [e.kind for e in arc.lease_log("a", limit=1)] == ["renew"]
    assert arc.lease_log("nobody") == []
    assert arc.stats().tables["lease_log"].rows == 3 and arc.stats().tables["leases"].rows == 2


def test_threads_racing_for_one_agent_on_one_archive_get_one_winner(arc: ArchiveBase) -> None:
    n = 6
    barrier = threading.Barrier(n)
    won: list[Lease] = []
    held: list[LeaseHeldError] = []

    def race(i: int) -> None:
        barrier.wait()
        try:
            won.append(arc.acquire_lease("coder", owner=f"r{i}", ttl_s=TTL))
        except LeaseHeldError as exc:
            held.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(held) == n - 1, f"{won=}, {held=}"
    assert {e.owner for e in held} == {won[0].owner} and won[0].token == 1


def test_a_default_fence_covers_writes_that_name_none(arc: ArchiveBase) -> None:
    """For code that writes an agent without passing `fence=` (the pool's persister)."""
    old = _expired(arc, "coder", "a")
    arc.set_default_fence(old)
    arc.put_ledger("coder", [1], [])  # still current: nobody took over
    arc.put_ledger("planner", [1], [])  # other agents are not fenced
    new = arc.acquire_lease("coder", owner="b", ttl_s=TTL)
    with pytest.raises(LeaseLostError):
        arc.put_ledger("coder", [1, 2], [])
    with pytest.raises(LeaseLostError), arc.transaction():
        arc.put_state("coder", b"kv", codec="f16", n_tokens=1, fingerprint=FP)
    assert arc.get_ledger("coder").n_tokens == 1 and arc.get_state_info("coder") is None
    arc.put_ledger("coder", [1, 2], [], fence=new)  # an explicit fence wins over the default
    assert arc.clear_default_fence("coder") == old and arc.clear_default_fence("coder") is None
    arc.put_ledger("coder", [1, 2, 3], [])
    assert arc.get_ledger("coder").n_tokens == 3
