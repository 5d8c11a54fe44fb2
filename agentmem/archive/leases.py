"""Agent leases with fencing tokens: which owner (replica) may write an agent, and the log of who did.

`LeasesMixin` adds to `Archive` the `leases` table (one row per agent that was
ever leased: owner, token, expiry) and the append-only `lease_log`. Every change
locks the agent's row (`SELECT ... FOR UPDATE` on PostgreSQL) in one transaction
with its log line, so two replicas racing for one agent queue on the row and
exactly one wins. Time is the archive's clock (`_now`): the database server's on
PostgreSQL, so clock skew between replicas does not matter.

Rules:

* a free, released or expired lease goes to whoever asks, with `token + 1` (the
  token is never reused, not even after a release or a `delete_agent`);
* another owner's unexpired lease raises `LeaseHeldError`;
* the holder asking again renews and keeps its token;
* `renew_lease` and fenced writes need the lease's owner and token to still be
  the row's (an expired lease nobody took over is still current).
"""

from __future__ import annotations

import math
from typing import Any

from agentmem.archive.core import ArchiveCore
from agentmem.archive.records import Lease, LeaseEvent, LeaseKind
from agentmem.archive.values import _check_agent_id, _check_count, _check_key, _check_text
from agentmem.errors import ConfigError, LeaseHeldError

__all__ = ["LeasesMixin"]


def _check_owner(owner: Any) -> str:
    if not isinstance(owner, str) or not owner:
        raise ConfigError(f"owner must be a non-empty str, not {owner!r}")
    return _check_text("owner", owner)


def _check_ttl(ttl_s: Any) -> float:
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not math.isfinite(ttl_s) or ttl_s <= 0:
        raise ConfigError(f"ttl_s must be a positive number of seconds, not {ttl_s!r}")
    return float(ttl_s)


class LeasesMixin(ArchiveCore):
    """Leases and the lease log (part of `Archive`)."""

    def _log_lease(self, db: Any, agent_id: str, owner: str, token: int, kind: LeaseKind, at: float) -> None:
        db.execute(
            "INSERT INTO lease_log(agent_id, owner, token, kind, at) VALUES (?, ?, ?, ?, ?)",
            [agent_id, owner, token, kind, at],
        )

    def _locked_lease(self, db: Any, agent_id: str) -> tuple[str | None, int, float]:
        """`(owner, token, expires_at)` of the agent's lease row, created (token 0, free) and locked."""
        db.execute(
            "INSERT INTO leases(agent_id, owner, token, expires_at, updated) VALUES (?, NULL, 0, 0, 0) "
            "ON CONFLICT(agent_id) DO NOTHING",
            [agent_id],
        )
        row = db.execute(
            f"SELECT owner, token, expires_at FROM leases WHERE agent_id = ?{self._FOR_UPDATE}", [agent_id]
        ).fetchone()
        return row[0], int(row[1]), float(row[2])

    def acquire_lease(self, agent_id: str, *, owner: str, ttl_s: float) -> Lease:
        """Take (or renew) the right to write `agent_id` for `ttl_s` seconds.

        Args:
            agent_id: the agent (it need not exist in the archive yet).
            owner: who takes it, e.g. the replica's name.
            ttl_s: seconds until the lease lapses unless renewed.

        Returns:
            The lease: a new token (previous + 1) for a new holder, the same
            token when `owner` already holds an unexpired lease.

        Raises:
            LeaseHeldError: another owner holds an unexpired lease (with its
                `owner` and `expires_in_s`).
            ConfigError: empty `owner`, or `ttl_s` not a positive number.

        Examples:
            >>> from agentmem.archive import Archive
            >>> with Archive(":memory:") as arc:
            ...     first = arc.acquire_lease("coder", owner="replica-a", ttl_s=30)
            ...     arc.release_lease(first)
            ...     second = arc.acquire_lease("coder", owner="replica-b", ttl_s=30)
            ...     (first.token, second.token, [e.kind for e in arc.lease_log("coder")])
            (1, 2, ['acquire', 'release', 'acquire'])
        """
        _check_agent_id(agent_id)
        owner, ttl_s = _check_owner(owner), _check_ttl(ttl_s)
        with self._writing("acquire_lease") as db:
            held_by, token, expires_at = self._locked_lease(db, agent_id)
            now = self._now(db)
            live = held_by is not None and expires_at > now
            if live and held_by != owner:
                raise LeaseHeldError(
                    f"{self.path}: agent {agent_id!r} is leased by {held_by!r} for another "
                    f"{expires_at - now:.3f} s (token {token})",
                    agent_id=agent_id, owner=str(held_by), expires_in_s=expires_at - now,
                )
            kind: LeaseKind
            if live:
                kind = "renew"
            else:
                kind = "takeover" if held_by is not None and held_by != owner else "acquire"
                token += 1
            lease = Lease(agent_id=agent_id, owner=owner, token=token, expires_at=now + ttl_s)
            db.execute(
                "UPDATE leases SET owner = ?, token = ?, expires_at = ?, updated = ? WHERE agent_id = ?",
                [owner, token, lease.expires_at, now, agent_id],
            )
            self._log_lease(db, agent_id, owner, token, kind, now)
        return lease

    def renew_lease(self, lease: Lease, *, ttl_s: float) -> Lease:
        """Extend `lease` to `ttl_s` seconds from now, keeping its token.

        Raises:
            LeaseLostError: another owner took the agent over, or the lease was released.
        """
        ttl_s = _check_ttl(ttl_s)
        with self._writing("renew_lease", fence=lease) as db:  # the fence check is the currency check
            now = self._now(db)
            renewed = Lease(agent_id=lease.agent_id, owner=lease.owner, token=lease.token, expires_at=now + ttl_s)
            db.execute(
                "UPDATE leases SET expires_at = ?, updated = ? WHERE agent_id = ?",
                [renewed.expires_at, now, lease.agent_id],
            )
            self._log_lease(db, lease.agent_id, lease.owner, lease.token, "renew", now)
        return renewed

    def release_lease(self, lease: Lease) -> None:
        """Give `lease` up so another owner may take the agent at once.

        Idempotent: releasing a lease that was already released, or that another
        owner took over, changes nothing and raises nothing. The token is kept, so
        the next holder gets a larger one.
        """
        if not isinstance(lease, Lease):
            raise ConfigError(f"lease must be a Lease, not {type(lease).__name__}")
        with self._writing("release_lease") as db:
            held_by, token, _ = self._locked_lease(db, lease.agent_id)
            if held_by != lease.owner or token != lease.token:
                return
            now = self._now(db)
            db.execute(
                "UPDATE leases SET owner = NULL, expires_at = 0, updated = ? WHERE agent_id = ?", [now, lease.agent_id]
            )
            self._log_lease(db, lease.agent_id, lease.owner, token, "release", now)

    def current_lease(self, agent_id: str) -> Lease | None:
        """The agent's unexpired lease, or `None` (never leased, released or expired)."""
        _check_key("agent_id", agent_id)
        with self._reading("current_lease") as db:
            row = db.execute("SELECT owner, token, expires_at FROM leases WHERE agent_id = ?", [agent_id]).fetchone()
            if row is None or row[0] is None or float(row[2]) <= self._now(db):
                return None
        return Lease(agent_id=agent_id, owner=row[0], token=int(row[1]), expires_at=float(row[2]))

    def lease_log(self, agent_id: str | None = None, *, limit: int | None = None) -> list[LeaseEvent]:
        """Every acquire, renew, release and takeover, oldest first.

        Args:
            agent_id: one agent's events, or `None` for all agents.
            limit: only the newest `limit` events (still oldest first).
        """
        _check_key("agent_id", agent_id)
        where, params = ("", []) if agent_id is None else (" WHERE agent_id = ?", [agent_id])
        sql = f"SELECT id, agent_id, owner, token, kind, at FROM lease_log{where} ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(_check_count("limit", limit))
        with self._reading("lease_log") as db:
            rows = db.execute(sql, params).fetchall()
        return [
            LeaseEvent(agent_id=r[1], owner=r[2], token=int(r[3]), kind=r[4], at=float(r[5])) for r in reversed(rows)
        ]

