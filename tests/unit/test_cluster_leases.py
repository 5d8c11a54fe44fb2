"""`LeaseKeeper` over the in-memory lease store: claims, bounded waits, takeovers, fences, idle release, the audit."""

from __future__ import annotations

import threading

import pytest

from agentmem.cluster import LeaseKeeper, LocalLeaseStore
from agentmem.cluster.audit import lease_intervals, overlaps
from agentmem.errors import ConfigError, LeaseHeldError, LeaseLostError


class Clock:
    """One fake clock for the store and both keepers; `sleep` advances it."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> LocalLeaseStore:
    return LocalLeaseStore(clock=clock)


def keeper(store: LocalLeaseStore, clock: Clock, owner: str, **kw: object) -> LeaseKeeper:
    return LeaseKeeper(store, owner=owner, ttl_s=10, clock=clock, sleep=clock.sleep, **kw)  # type: ignore[arg-type]


def test_first_claim_is_stale_then_the_held_lease_is_reused(store: LocalLeaseStore, clock: Clock) -> None:
    a = keeper(store, clock, "a")
    assert a.claim("x") is True  # nothing local can be trusted yet
    a.done("x")
    assert a.claim("x") is False
    a.done("x")
    assert [e.kind for e in store.lease_log("x")] == ["acquire"], "a held lease is reused without a store call"
    assert a.fence("x").token == 1


def test_a_live_holder_makes_the_other_replica_wait_boundedly_then_fail(store: LocalLeaseStore, clock: Clock) -> None:
    a, b = keeper(store, clock, "a"), keeper(store, clock, "b", wait_s=3)
    a.claim("x")
    t0 = clock()
    with pytest.raises(LeaseHeldError) as err:
        b.claim("x")
    assert err.value.owner == "a" and err.value.expires_in_s > 0
    assert 2.5 <= clock() - t0 <= 3.5, "waits about wait_s, not the whole TTL"
    assert b.counts["waited"] > 0


def test_a_dead_holders_lease_is_taken_over_after_expiry_with_a_new_token(store: LocalLeaseStore, clock: Clock) -> None:
    a, b = keeper(store, clock, "a"), keeper(store, clock, "b")
    a.claim("x")
    a.done("x")
    b.claim("y")  # b had its own agent; x's copy on b does not exist
    # a is killed: nobody renews x; b's claim waits for expiry (< wait_s = ttl + 1)
    assert b.claim("x") is True
    assert b.fence("x").token == 2
    assert store.lease_log("x")[-1].kind == "takeover"
    with pytest.raises(LeaseLostError):
        store.check(a.fence("x"))  # a's old lease is no longer current: its writes are refused


def test_coming_back_after_another_replica_served_the_agent_is_stale(store: LocalLeaseStore, clock: Clock) -> None:
    """The local copy of a replica that held token 1 is stale once token 2 existed, even if 2 was released."""
    a, b = keeper(store, clock, "a", idle_s=1), keeper(store, clock, "b", idle_s=1)
    assert a.claim("x") is True
    a.done("x")
    clock.t += 2
    a.tick()  # idle: released
    assert b.claim("x") is True
    b.done("x")
    b.release("x")
    assert a.claim("x") is True, "token 3 != token 1: a must re-read x from the archive"


def test_same_token_after_an_idle_release_keeps_the_local_copy(store: LocalLeaseStore, clock: Clock) -> None:
    a = keeper(store, clock, "a", idle_s=1)
    a.claim("x")
    a.done("x")
    clock.t += 2
    a.tick()
    assert a.held() == [] and store.lease_log("x")[-1].kind == "release"
    assert a.claim("x") is False, "a new token, but the log shows nobody else held x: the local copy is current"
    assert a.fence("x").token == 2


def test_renewal_keeps_a_used_lease_and_loss_is_noticed(store: LocalLeaseStore, clock: Clock) -> None:
    a, b = keeper(store, clock, "a"), keeper(store, clock, "b")
    a.claim("x")  # a call in progress (no done)
    for _ in range(6):
        clock.t += 3
        a.tick()
    assert store.current_lease("x").owner == "a" and a.counts["renewed"] == 6
    # a stalls (a long pause) mid-call: its lease runs out, b takes over, a's next renewal fails
    clock.t += 11
    b.claim("x")
    a.tick()
    assert "x" not in a.held() and a.counts["lost"] == 1


def test_fence_renews_a_lapsed_lease_and_refuses_after_another_owner(store: LocalLeaseStore, clock: Clock) -> None:
    a, b = keeper(store, clock, "a", idle_s=1), keeper(store, clock, "b")
    with pytest.raises(LeaseLostError):
        a.fence("never-claimed")
    assert store.current_lease("never-claimed") is None, "a refused fence does not keep the lease"
    a.claim("x")
    a.done("x")
    clock.t += 11  # lapsed locally and in the store, nobody took it: renewed at its token
    assert a.fence("x").token == 1 and store.current_lease("x").owner == "a"
    # x idle on a, released; b serves it; a's budget would now demote its stale copy: refused
    clock.t += 2
    a.tick()
    assert b.claim("x") is True
    b.done("x")
    b.release("x")
    with pytest.raises(LeaseLostError, match="served elsewhere"):
        a.fence("x")
    assert store.current_lease("x") is None, "the lease taken to check is given back"
    b.claim("y")
    with pytest.raises(LeaseLostError):
        a.fence("y")  # b holds it


def test_idle_release_stores_lazily_first_and_keeps_the_lease_if_that_fails(store: LocalLeaseStore, clock: Clock) -> None:
    stored: list[str] = []
    fail = {"on": True}

    def before(agent_id: str) -> None:
        if fail["on"]:
            raise OSError("disk full")
        stored.append(agent_id)

    a = keeper(store, clock, "a", idle_s=1, before_release=before)
    a.claim("x")
    a.done("x")
    clock.t += 2
    a.tick()
    assert a.held() == ["x"], "the state could not be stored: keep the lease"
    fail["on"] = False
    a.tick()
    assert stored == ["x"] and a.held() == []


def test_close_releases_every_lease_and_stops_the_thread(store: LocalLeaseStore) -> None:
    a = LeaseKeeper(store, owner="a", ttl_s=1.5)
    a.start()
    for x in ("p", "q"):
        a.claim(x)
    a.close()
    assert a.held() == [] and store.current_lease("p") is None and store.current_lease("q") is None
    assert not any(t.name.startswith("agentmem-leases-a") for t in threading.enumerate())


def test_bad_settings_name_the_field(store: LocalLeaseStore) -> None:
    with pytest.raises(ConfigError, match="replica_id"):
        LeaseKeeper(store, owner="")
    with pytest.raises(ConfigError, match="lease_ttl"):
        LeaseKeeper(store, owner="a", ttl_s=0)


def test_audit_finds_two_owners_at_once_and_accepts_a_clean_handover(store: LocalLeaseStore, clock: Clock) -> None:
    a, b = keeper(store, clock, "a"), keeper(store, clock, "b")
    a.claim("x")
    clock.t += 3
    a.tick()
    b.claim("x")  # waits for a's expiry, then takes over
    intervals = lease_intervals(store.lease_log(), ttl_s=10)
    assert [i.owner for i in intervals] == ["a", "b"]
    assert overlaps(intervals) == []
    # a forged log where b took over while a's lease still ran is caught
    from types import SimpleNamespace as E

    forged = [E(agent_id="x", owner="a", token=1, kind="acquire", at=0.0),
              E(agent_id="x", owner="b", token=2, kind="takeover", at=5.0)]
    assert len(overlaps(lease_intervals(forged, ttl_s=10))) == 1


@pytest.fixture(params=["sqlite", "postgresql"])
def archive(request: pytest.FixtureRequest, tmp_path):  # type: ignore[no-untyped-def]
    """The real archive backends (PostgreSQL from the test fixture)."""
    from agentmem.archive import open_archive

    target = str(tmp_path / "a.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    with open_archive(target) as arc:
        yield arc


def test_the_keeper_over_the_real_archives(archive) -> None:  # type: ignore[no-untyped-def]
    """The same rules hold against the archive's own leases (its clock, its tokens, its log)."""
    a = LeaseKeeper(archive, owner="a", ttl_s=5, idle_s=60)
    b = LeaseKeeper(archive, owner="b", ttl_s=5, wait_s=0.3)
    assert a.claim("x") is True
    with pytest.raises(LeaseHeldError) as err:
        b.claim("x")
    assert err.value.owner == "a"
    a.done("x")
    a.release("x")
    assert b.claim("x") is True
    b.done("x")
    b.release("x")
    with pytest.raises(LeaseLostError, match="served elsewhere"):
        a.fence("x")
    assert a.claim("x") is True, "b served x since: a's copy is stale"
    a.done("x")
    a.close()
    b.close()
    intervals = lease_intervals(archive.lease_log("x"), ttl_s=5)
    # a, b, the lease a took to check its fence (and gave back), a again
    assert [i.owner for i in intervals] == ["a", "b", "a", "a"] and overlaps(intervals) == []
