"""The backend-neutral core every archive is built on: locking, transactions, fencing.

`ArchiveCore` holds what the SQLite and the PostgreSQL archive share: one
connection guarded by one re-entrant lock, the `_reading`/`_writing` helpers that
turn driver errors into `ArchiveError` naming the archive, `transaction` (nested
calls become savepoints) and the fencing check of agent-scoped writes. The
per-kind mixins (`agents`, `states`, `events`, `blocks`, `leases`) write their SQL
once, with `?` placeholders, against this core; a backend subclass
(`connection.ArchiveConnection` for SQLite, `postgres.PostgresConnection`)
opens the database and fills in the few hooks where the dialects differ:

* `_require_db()` returns an object with `execute(sql, params) -> cursor`;
* `_atomic(db)` opens a transaction, or a savepoint when one is open;
* `_DRIVER_ERRORS` are the driver's exceptions to wrap;
* `_FOR_UPDATE` / `_FOR_SHARE` are row-lock clauses (empty on SQLite, whose one
  writer per file serialises everything already);
* `_now(db)` is the lease clock (Python's on SQLite, the server's on PostgreSQL);
* `_priority_in` / `_priority_out` map an agent priority (int or name) to the
  stored column and back; `_span_text_in` adapts evicted text (PostgreSQL's
  `text` cannot hold NUL);
* `_search(db, agent_id, terms, k)` runs the full-text search of evicted text.

Storage faults: a driver error that says the storage is full (SQLite's `SQLITE_FULL`,
an `OSError` `ENOSPC`, PostgreSQL's SQLSTATE `53100 disk_full`) becomes
`ArchiveFullError`; the transaction is rolled back, so what was stored stays intact.
`storage_fault` holds its message until a later write commits.

Fencing: a write given `fence=lease` first locks the agent's lease row (`FOR
SHARE` on PostgreSQL, so a takeover waits for the write and a write after a
takeover sees it) and checks it still holds the lease's owner and token; if not,
it raises `LeaseLostError` and the transaction writes nothing. `set_default_fence`
makes a lease the fence of every later write of its agent that names none, so a
caller that does not pass `fence=` itself (the pool's persister) is fenced too.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from agentmem.archive.records import Lease
from agentmem.errors import ArchiveError, ArchiveFullError, ConfigError, LeaseLostError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ArchiveCore"]

logger = logging.getLogger(__name__)


def storage_full(exc: BaseException) -> bool:
    """Whether a driver error says the storage is full (SQLite, the OS or PostgreSQL)."""
    if getattr(exc, "sqlite_errorname", None) == "SQLITE_FULL" or getattr(exc, "sqlstate", None) == "53100":
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    return "database or disk is full" in str(exc)


class ArchiveCore(abc.ABC):
    """Lifecycle, locked plumbing, transactions and fencing shared by every backend.

    Not used on its own: `Archive` (SQLite) and `PostgresArchive` compose it with
    the per-kind mixins and a backend connection class.
    """

    path: str
    readonly: bool
    _schema_version: int = 0
    _tx_depth: int = 0
    storage_fault: str | None = None
    """Why the last write failed for lack of space (`ArchiveFullError`), or None once a write commits."""
    _DRIVER_ERRORS: ClassVar[tuple[type[BaseException], ...]] = ()
    _FOR_UPDATE: ClassVar[str] = ""
    _FOR_SHARE: ClassVar[str] = ""
    _PRIORITY_DEFAULT: ClassVar[Any] = 0
    _SHARED_WRITERS: ClassVar[bool] = False
    """Whether other processes may write the same archive (PostgreSQL): RAM caches then check before trusting."""

    # ------------------------------------------------------------------ backend hooks

    @abc.abstractmethod
    def _require_db(self) -> Any:
        """The open connection (`ArchiveError` once closed)."""

    @abc.abstractmethod
    def _atomic(self, db: Any) -> contextlib.AbstractContextManager[Any]:
        """A transaction on `db`: committed on exit, rolled back on an exception."""

    @abc.abstractmethod
    def _now(self, db: Any) -> float:
        """The lease clock, in seconds since the epoch."""

    @abc.abstractmethod
    def _search(self, db: Any, agent_id: str | None, terms: list[str], k: int) -> list[Sequence[Any]]:
        """Full-text search of evicted text: the best `k` rows for `terms`."""

    def _ann_path(self) -> str:
        """How span vectors are searched: `"exact-numpy"` here; the PostgreSQL archive may use pgvector."""
        return "exact-numpy"

    def _ann_prepare(self, model: str, dim: int) -> None:
        """Ready the ANN index of `model`'s `dim`-d vectors before a write transaction (nothing here)."""

    def _ann_write(self, db: Any, ids: Sequence[int], vectors: Any, model: str) -> None:
        """Index the vectors just written for `ids` (same transaction); nothing to do without an ANN index."""

    def _ann_search(self, db: Any, agent_id: str | None, tenant: str | None, q: Any, k: int,
                    model: str) -> list[tuple[int, float]] | None:
        """`(span_id, cosine)` of the nearest vectors from an ANN index, or `None`: search exactly."""
        return None

    def _vectors_changed(self, agent_id: str) -> None:
        """`agent_id`'s span vectors changed or are gone: drop what RAM holds of them (`VectorsMixin`)."""

    def _span_tokens_drop(self, agent_id: str) -> None:
        """`agent_id`'s kept span cells changed or are gone: drop what RAM holds of their tokens (`SpanKVMixin`)."""

    def _span_text_in(self, text: str) -> str:
        """Evicted text as the backend stores it (unchanged unless the backend cannot hold a character)."""
        return text

    def _priority_in(self, priority: int | str | None) -> Any:
        """The stored form of a priority (`None` stays `None`)."""
        return priority

    def _priority_out(self, stored: Any) -> int | str:
        """The priority a stored value stands for."""
        return stored

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """Whether `close` has run."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection; safe to call twice."""

    # ------------------------------------------------------------------ lifecycle

    @property
    def schema_version(self) -> int:
        """Schema version of the open archive (always `SCHEMA_VERSION` when writable)."""
        return self._schema_version

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            still_open = not self.closed
        except Exception:  # noqa: BLE001 - half-built object
            return
        if still_open:
            warnings.warn(f"Archive {self.path!r} was not closed", ResourceWarning, stacklevel=2)
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("readonly" if self.readonly else "open")
        return f"{type(self).__name__}({self.path!r}, {state})"

    # ------------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[Any]:
        """Hold the lock and turn driver errors into `ArchiveError` naming the archive."""
        with self._lock:
            db = self._require_db()
            try:
                yield db
            except self._DRIVER_ERRORS as exc:
                if storage_full(exc):
                    raise ArchiveFullError(
                        f"{self.path}: {what} failed: the archive's storage is full ({exc}); nothing was written, "
                        "what was stored before is intact"
                    ) from exc
                raise ArchiveError(f"{self.path}: {what} failed: {exc}") from exc

    def _row(self, what: str, sql: str, params: Sequence[Any]) -> Any:
        """The first row of a read query (`None` when there is none)."""
        with self._reading(what) as db:
            return db.execute(sql, list(params)).fetchone()

    @contextlib.contextmanager
    def _writing(self, what: str, *, fence: Lease | None = None, agent_id: str | None = None) -> Iterator[Any]:
        """Like `_reading`, inside a transaction (a savepoint when nested), fenced when `fence` is given.

        Raises:
            ArchiveError: the archive is read-only.
            LeaseLostError: `fence` is no longer the agent's current lease (nothing is written).
        """
        if fence is None and agent_id is not None:
            fence = self._default_fences.get(agent_id)
        if fence is not None:
            _check_fence_arg(fence, agent_id)
        try:
            with self._reading(what) as db:
                if self.readonly:
                    raise ArchiveError(f"{self.path}: opened readonly; cannot {what}")
                with self._atomic(db):
                    self._tx_depth += 1
                    try:
                        if fence is not None:
                            self._check_fence(db, fence, what)
                        yield db
                    finally:
                        self._tx_depth -= 1
        except ArchiveFullError as exc:
            self.storage_fault = str(exc)
            raise
        if not self._tx_depth:  # committed: the storage takes writes again
            self.storage_fault = None

    @property
    def _default_fences(self) -> dict[str, Lease]:
        fences = self.__dict__.get("_fences")
        if fences is None:
            fences = self.__dict__["_fences"] = {}
        return fences

    def set_default_fence(self, lease: Lease) -> None:
        """Fence every later write of `lease.agent_id` that passes no `fence=` of its own.

        For callers that hold a lease while code they do not control writes the
        agent (a pool's persister): once the lease is lost, those writes raise
        `LeaseLostError` instead of committing. Replaces the agent's previous
        default; `clear_default_fence` removes it.

        Examples:
            >>> from agentmem.archive import Archive
            >>> from agentmem.errors import LeaseLostError
            >>> with Archive(":memory:") as arc:
            ...     lease = arc.acquire_lease("coder", owner="a", ttl_s=30)
            ...     arc.set_default_fence(lease)
            ...     arc.release_lease(lease)
            ...     try:
            ...         arc.put_agent("coder")
            ...     except LeaseLostError:
            ...         print("fenced out")
            fenced out
        """
        _check_fence_arg(lease, None)
        self._default_fences[lease.agent_id] = lease

    def clear_default_fence(self, agent_id: str) -> Lease | None:
        """Stop fencing `agent_id`'s writes by default; returns the lease that did, or `None`."""
        return self._default_fences.pop(agent_id, None)

    def _check_fence(self, db: Any, fence: Lease, what: str) -> None:
        row = db.execute(
            f"SELECT owner, token FROM leases WHERE agent_id = ?{self._FOR_SHARE}", [fence.agent_id]
        ).fetchone()
        if row is not None and row[0] == fence.owner and int(row[1]) == fence.token:
            return
        if row is None:
            now = "no lease was ever taken"
        elif row[0] is None:
            now = f"it was released (token {int(row[1])})"
        else:
            now = f"token {int(row[1])} is held by {row[0]!r}"
        raise LeaseLostError(
            f"{self.path}: cannot {what}: the lease of agent {fence.agent_id!r} with token {fence.token} "
            f"(owner {fence.owner!r}) is no longer current ({now}); nothing was written"
        )

    def _touch_agent(self, db: Any, agent_id: str, now: float) -> None:
        db.execute(
            "INSERT INTO agents(id, created, updated) VALUES (?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET updated = excluded.updated",
            [agent_id, now, now],
        )

    @contextlib.contextmanager
    def transaction(self, *, fence: Lease | None = None) -> Iterator[Self]:
        """Group writes so they commit together or not at all.

        Nested calls become savepoints. Other threads wait until the outermost
        block ends. An exception inside the block rolls everything back and
        propagates.

        Args:
            fence: check (and lock, on PostgreSQL) this lease at the start, so the
                block commits only while it is current.

        Raises:
            LeaseLostError: `fence` is no longer current; nothing is written.

        Examples:
            >>> import numpy as np
            >>> from agentmem.archive import Archive
            >>> with Archive(":memory:") as arc:
            ...     with arc.transaction():
            ...         arc.put_ledger("a", np.arange(4, dtype=np.int32), [])
            ...         _ = arc.put_state("a", b"kv", codec="f16", n_tokens=4, fingerprint={})
            ...     arc.get_ledger("a").n_tokens
            4
        """
        with self._writing("transaction", fence=fence, agent_id=None if fence is None else fence.agent_id):
            yield self


def _check_fence_arg(fence: Any, agent_id: str | None) -> None:
    if not isinstance(fence, Lease):
        raise ConfigError(f"fence must be a Lease (from acquire_lease), not {type(fence).__name__}")
    if agent_id is not None and fence.agent_id != agent_id:
        raise ConfigError(f"fence is the lease of agent {fence.agent_id!r}, not of {agent_id!r}")
