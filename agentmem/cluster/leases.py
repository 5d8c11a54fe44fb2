"""`LeaseKeeper`: the agent leases one replica holds — claimed before serving, renewed while used, released when idle.

A replica serves an agent only while it holds the agent's lease in the shared
archive (owner, fencing token, expiry). `claim` takes it (waiting, bounded, while
another replica's lease runs out), `fence` hands the pool the lease its archive
writes must carry, and a background thread renews the leases of agents in use and
releases those idle for `idle_s`. When a claim returns a token that is not the one
this replica last held for that agent, another replica may have served the agent
meanwhile: `claim` says so, and the caller drops its local copy and reads the
agent back from the archive.

>>> from agentmem.cluster.local import LocalLeaseStore
>>> store = LocalLeaseStore()
>>> keeper = LeaseKeeper(store, owner="a", ttl_s=10)
>>> keeper.claim("coder")   # first claim here: no local copy to trust
True
>>> keeper.done("coder"); keeper.claim("coder")   # still ours: the local copy is current
False
>>> keeper.fence("coder").token
1
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from agentmem.errors import ArchiveError, ConfigError, LeaseError, LeaseHeldError, LeaseLostError

__all__ = ["LeaseKeeper", "LeaseStore"]

logger = logging.getLogger(__name__)


class LeaseStore(Protocol):
    """What `LeaseKeeper` needs of the shared archive (`agentmem.archive.Archive` has it)."""

    def acquire_lease(self, agent_id: str, *, owner: str, ttl_s: float) -> Any:
        """A lease for `owner` (a new token unless `owner` holds it); `LeaseHeldError` while another holds it."""

    def renew_lease(self, lease: Any, *, ttl_s: float) -> Any:
        """`lease` extended by `ttl_s`; `LeaseLostError` when it is no longer current."""

    def release_lease(self, lease: Any) -> None:
        """Give `lease` up (a no-op when it is no longer current)."""


@dataclass
class _Held:
    lease: Any
    valid_until: float  # local monotonic clock, with a safety margin
    last_used: float  # the last claim or done
    active: int = 0  # calls between claim and done


class LeaseKeeper:
    """The leases of one replica.

    Args:
        store: the shared archive (or any `LeaseStore`).
        owner: this replica's id (unique among the replicas).
        ttl_s: lease length; renewed every `ttl_s / 3` while the agent is in use.
        wait_s: how long `claim` waits for another replica's lease to run out
            (default `ttl_s + 1`: a killed replica's leases expire within it).
        idle_s: an agent without a call for this long has its lease released
            (default `ttl_s`); its next call claims it again.
        before_release: called with an agent id just before an idle lease is
            released (lazy durability commits the agent's state there).
        clock, sleep: time sources (tests pass fakes).
    """

    def __init__(self, store: LeaseStore, *, owner: str, ttl_s: float = 10.0, wait_s: float | None = None,
                 idle_s: float | None = None, before_release: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if not isinstance(owner, str) or not owner:
            raise ConfigError(f"replica_id must be a non-empty string, got {owner!r}")
        if not isinstance(ttl_s, (int, float)) or ttl_s < 1:
            raise ConfigError(f"lease_ttl must be >= 1 second, got {ttl_s!r}")
        self.store, self.owner, self.ttl_s = store, owner, float(ttl_s)
        self.wait_s = self.ttl_s + 1.0 if wait_s is None else float(wait_s)
        self.idle_s = self.ttl_s if idle_s is None else float(idle_s)
        self.margin_s = min(1.0, self.ttl_s / 10)
        self.before_release = before_release
        self.clock, self.sleep = clock, sleep
        self._held: dict[str, _Held] = {}
        self._last_token: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counts = {"acquired": 0, "renewed": 0, "released": 0, "lost": 0, "waited": 0, "stale_reloads": 0}

    # ------------------------------------------------------------------ serving
    def claim(self, agent_id: str) -> bool:
        """Hold `agent_id`'s lease for a call (pair with `done`); returns whether the local copy is stale.

        The copy is stale when another replica held the agent since this one last
        did (the lease log shows another owner between the two tokens). While
        another replica holds it, this waits (`sleep`) up to `wait_s`.

        Raises:
            LeaseHeldError: another replica still holds it after `wait_s`
                (`expires_in_s` says when to retry).
        """
        deadline = self.clock() + self.wait_s
        while True:
            try:
                return self.try_claim(agent_id)
            except LeaseHeldError as exc:
                pause = self.pause_s(exc, deadline)
                if pause is None:
                    raise
                self.sleep(pause)

    def pause_s(self, exc: LeaseHeldError, deadline: float) -> float | None:
        """How long to wait before the next try of a claim refused with `exc` (None: give up, past `deadline`)."""
        left = max(0.0, float(exc.expires_in_s))
        if self.clock() + min(left, 0.25) > deadline:
            return None
        self.counts["waited"] += 1
        return min(max(left, 0.05), 0.25)

    def try_claim(self, agent_id: str) -> bool:
        """`claim` without waiting: `LeaseHeldError` at once while another replica holds the agent."""
        with self._lock:
            h = self._held.get(agent_id)
            if h is not None and (self.clock() < h.valid_until or self._renew(agent_id, h)):
                h.active += 1
                h.last_used = self.clock()
                return False
        t0 = self.clock()
        lease = self.store.acquire_lease(agent_id, owner=self.owner, ttl_s=self.ttl_s)
        with self._lock:
            self.counts["acquired"] += 1
            stale = self._served_elsewhere(agent_id, lease.token)
            self._last_token[agent_id] = lease.token
            self._held[agent_id] = _Held(lease, t0 + self.ttl_s - self.margin_s, self.clock(), active=1)
            if stale:
                self.counts["stale_reloads"] += 1
            return stale

    def _renew(self, agent_id: str, h: _Held) -> bool:
        """Renew `h` at its token (it may have lapsed with nobody taking it); False, forgetting it, if it is lost."""
        t0 = self.clock()
        try:
            h.lease = self.store.renew_lease(h.lease, ttl_s=self.ttl_s)
        except LeaseLostError:
            self._drop(agent_id)
            return False
        h.valid_until = t0 + self.ttl_s - self.margin_s
        self.counts["renewed"] += 1
        return True

    def _served_elsewhere(self, agent_id: str, token: Any) -> bool:
        """Whether another owner may have held `agent_id` between this replica's last token and `token`."""
        last = self._last_token.get(agent_id)
        if last is None:
            return True  # no local copy to trust
        if token == last:
            return False
        log = getattr(self.store, "lease_log", None)
        if log is None:
            return True
        events = log(agent_id, limit=64)
        if not events or events[0].token > last:
            return True  # the log window does not reach back to our token
        return any(e.owner != self.owner for e in events if last < e.token <= token)

    def done(self, agent_id: str) -> None:
        """A call that `claim`ed `agent_id` ended."""
        with self._lock:
            h = self._held.get(agent_id)
            if h is not None:
                h.active = max(0, h.active - 1)
                h.last_used = self.clock()

    def fence(self, agent_id: str) -> Any:
        """The lease an archive write of `agent_id` must carry (called under the pool's lock).

        A lease that ran out with nobody taking it over is renewed at its token; an
        agent whose lease was released when idle (its local copy kept) is written
        only if its lease is free and no other replica held it since this one did
        (the lease log shows no other owner): then the local copy is current.

        Raises:
            LeaseLostError: this replica does not hold it and cannot take it back
                at its last token.
        """
        h = self._held.get(agent_id)
        if h is not None and (self.clock() < h.valid_until or self._renew(agent_id, h)):
            return h.lease
        try:
            lease = self.store.acquire_lease(agent_id, owner=self.owner, ttl_s=self.ttl_s)
        except LeaseHeldError as exc:
            raise LeaseLostError(f"agent {agent_id!r} is leased to {exc.owner!r}; replica {self.owner!r} must not "
                                 "write it") from exc
        if self._served_elsewhere(agent_id, lease.token):
            self._release(agent_id, _Held(lease, 0.0, 0.0))
            raise LeaseLostError(f"agent {agent_id!r} was served elsewhere since replica {self.owner!r} last held it "
                                 f"(token {self._last_token.get(agent_id)} -> {lease.token}); its local copy must "
                                 "not be written")
        # no keeper lock here (the pool's lock is held, and the renewal thread may hold the
        # keeper's while it waits for the pool's): single dict operations only
        now = self.clock()
        self._last_token[agent_id] = lease.token
        self._held.setdefault(agent_id, _Held(lease, now + self.ttl_s - self.margin_s, now))
        return lease

    def _drop(self, agent_id: str) -> None:
        if self._held.pop(agent_id, None) is not None:
            self.counts["lost"] += 1

    def lost(self, agent_id: str) -> None:
        """Forget `agent_id`'s lease after the archive refused it (`LeaseLostError`)."""
        with self._lock:
            self._drop(agent_id)
        logger.warning("replica %s lost the lease of agent %r", self.owner, agent_id)

    def release(self, agent_id: str) -> None:
        """Give `agent_id`'s lease up now (parked to the archive, forgotten)."""
        with self._lock:
            h = self._held.pop(agent_id, None)
            if h is not None:
                self._release(agent_id, h)

    def _release(self, agent_id: str, h: _Held) -> None:
        try:
            self.store.release_lease(h.lease)
            self.counts["released"] += 1
        except ArchiveError as exc:  # already gone, or the archive is closed: it runs out by itself
            logger.info("lease of agent %r not released (%s); it expires within %.0f s", agent_id, exc, self.ttl_s)

    def held(self) -> list[str]:
        """Agent ids whose lease this replica holds."""
        with self._lock:
            return list(self._held)

    # ------------------------------------------------------------------ upkeep
    def tick(self) -> None:
        """One round of upkeep: release idle leases, renew the others (the thread calls it every `ttl_s / 3`)."""
        with self._lock:
            for agent_id, h in list(self._held.items()):
                now = self.clock()
                if not h.active and now - h.last_used >= self.idle_s:
                    self._release_idle(agent_id, h)
                    continue
                try:
                    if not self._renew(agent_id, h):
                        logger.warning("replica %s lost the lease of agent %r", self.owner, agent_id)
                except LeaseError as exc:  # the archive is unreachable: keep trying until it runs out
                    logger.warning("could not renew the lease of agent %r: %s", agent_id, exc)

    def _release_idle(self, agent_id: str, h: _Held) -> None:
        if self.before_release is not None:
            try:
                self.before_release(agent_id)
            except LeaseLostError:
                self.lost(agent_id)
                return
            except Exception:  # noqa: BLE001 - keep the lease (and the local state) for a later try
                logger.exception("could not store agent %r before releasing its lease", agent_id)
                return
        self._held.pop(agent_id, None)
        self._release(agent_id, h)

    def start(self) -> None:
        """Start the renewal thread (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"agentmem-leases-{self.owner}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the thread must outlive one bad round
                logger.exception("lease upkeep failed")

    def close(self) -> None:
        """Stop renewing and release every lease (idempotent; after the pool has stored its agents)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
            self._thread = None
        with self._lock:
            for agent_id, h in list(self._held.items()):
                self._held.pop(agent_id, None)
                self._release(agent_id, h)
