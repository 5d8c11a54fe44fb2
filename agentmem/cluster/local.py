"""`LocalLeaseStore`: agent leases kept in one process's memory, with the shared archive's semantics.

For unit tests of lease logic and for a single replica without a shared archive:
a free, released or expired lease goes to whoever asks with `token + 1`, the
holder asking again renews and keeps its token, `renew_lease` and fenced writes
need the lease to still be the current one (an expired lease nobody took over is), and every change is logged
(`lease_log`), as `Archive` does in PostgreSQL. It cannot coordinate two
processes: use a shared archive (`--archive-url postgresql://…`) for that.

>>> store = LocalLeaseStore(clock=lambda: 0.0)
>>> a = store.acquire_lease("coder", owner="r1", ttl_s=10)
>>> store.acquire_lease("coder", owner="r2", ttl_s=10)
Traceback (most recent call last):
...
agentmem.errors.LeaseHeldError: agent 'coder' is leased to 'r1' for 10.0 s more
>>> [e.kind for e in store.lease_log("coder")]
['acquire']
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from agentmem.errors import LeaseHeldError, LeaseLostError

__all__ = ["LocalLease", "LocalLeaseEvent", "LocalLeaseStore"]


@dataclass(frozen=True)
class LocalLease:
    """An agent's lease: `token` is the fencing token (strictly increasing across owners)."""

    agent_id: str
    owner: str
    token: int
    expires_at: float


@dataclass(frozen=True)
class LocalLeaseEvent:
    """One change of a lease: `kind` is `acquire`, `renew`, `release` or `takeover`."""

    agent_id: str
    owner: str
    token: int
    kind: str
    at: float


class LocalLeaseStore:
    """Leases in memory (thread-safe). `check(fence)` is what a fenced archive write does first."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._leases: dict[str, LocalLease] = {}
        self._tokens: dict[str, int] = {}
        self._log: list[LocalLeaseEvent] = []
        self._lock = threading.Lock()

    def _note(self, lease: LocalLease, kind: str) -> None:
        self._log.append(LocalLeaseEvent(lease.agent_id, lease.owner, lease.token, kind, self.clock()))

    def acquire_lease(self, agent_id: str, *, owner: str, ttl_s: float) -> LocalLease:
        with self._lock:
            now = self.clock()
            cur = self._leases.get(agent_id)
            live = cur is not None and cur.expires_at > now
            if live and cur.owner != owner:
                raise LeaseHeldError(f"agent {agent_id!r} is leased to {cur.owner!r} for {cur.expires_at - now:.1f} s more",
                                     agent_id=agent_id, owner=cur.owner, expires_in_s=cur.expires_at - now)
            if live:
                new = replace(cur, expires_at=now + ttl_s)
                self._leases[agent_id] = new
                self._note(new, "renew")
                return new
            token = self._tokens.get(agent_id, 0) + 1
            self._tokens[agent_id] = token
            new = LocalLease(agent_id, owner, token, now + ttl_s)
            self._leases[agent_id] = new
            self._note(new, "takeover" if cur is not None and cur.owner != owner else "acquire")
            return new

    def renew_lease(self, lease: LocalLease, *, ttl_s: float) -> LocalLease:
        with self._lock:
            self._check(lease)
            new = replace(lease, expires_at=self.clock() + ttl_s)
            self._leases[lease.agent_id] = new
            self._note(new, "renew")
            return new

    def release_lease(self, lease: LocalLease) -> None:
        with self._lock:
            cur = self._leases.get(lease.agent_id)
            if cur is not None and cur.token == lease.token and cur.owner == lease.owner:
                del self._leases[lease.agent_id]
                self._note(cur, "release")

    def current_lease(self, agent_id: str) -> LocalLease | None:
        with self._lock:
            cur = self._leases.get(agent_id)
            return cur if cur is not None and cur.expires_at > self.clock() else None

    def lease_log(self, agent_id: str | None = None, *, limit: int | None = None) -> list[LocalLeaseEvent]:
        with self._lock:
            out = [e for e in self._log if agent_id is None or e.agent_id == agent_id]
            return out[-limit:] if limit else out

    def check(self, fence: LocalLease) -> None:
        """Raise `LeaseLostError` unless `fence` is the agent's current lease (expired but not taken over counts)."""
        with self._lock:
            self._check(fence)

    def _check(self, lease: LocalLease) -> None:
        cur = self._leases.get(lease.agent_id)
        if cur is None or cur.token != lease.token or cur.owner != lease.owner:
            raise LeaseLostError(f"the lease of agent {lease.agent_id!r} (token {lease.token}) is no longer current")
