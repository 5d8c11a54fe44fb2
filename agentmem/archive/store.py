"""The public archives: `Archive` (one SQLite file) and `PostgresArchive` (a shared database).

`ArchiveBase` composes the per-kind mixins (agents, states, events, blocks,
leases), written once against the backend-neutral core; `Archive` puts it over
the SQLite connection and `PostgresArchive` over the PostgreSQL one, each adding
its maintenance calls (`stats`, `checkpoint`, `vacuum`). `open_archive` picks
the backend from its target: a `postgresql://` URL or a file path.
"""

from __future__ import annotations

import abc

import logging
import os
from typing import Any

from agentmem.archive import schema
from agentmem.archive.agents import AgentsMixin
from agentmem.archive.blocks import BlocksMixin
from agentmem.archive.connection import ArchiveConnection, _file_size
from agentmem.archive.events import EventsMixin
from agentmem.archive.leases import LeasesMixin
from agentmem.archive.postgres import PostgresConnection, is_postgres_url
from agentmem.archive.records import ArchiveStats, TableStats, VacuumResult
from agentmem.archive.spankv import SpanKVMixin
from agentmem.archive.states import StatesMixin
from agentmem.errors import ArchiveError

__all__ = ["Archive", "ArchiveBase", "PostgresArchive", "open_archive"]

logger = logging.getLogger(__name__)


class ArchiveBase(AgentsMixin, StatesMixin, EventsMixin, BlocksMixin, LeasesMixin, SpanKVMixin):
    """The archive API both backends implement (use it in type hints); see `Archive` for the methods."""

    @abc.abstractmethod
    def stats(self) -> ArchiveStats:
        """Sizes and row counts."""

    @abc.abstractmethod
    def checkpoint(self) -> None:
        """Flush what the backend buffers (SQLite: the WAL)."""

    @abc.abstractmethod
    def vacuum(self) -> VacuumResult:
        """Return free space to the OS."""

    def _table_stats(self, db: Any) -> dict[str, TableStats]:
        tables = {}
        for name in schema.TABLES:
            rows, payload = db.execute(
                f"SELECT count(*), coalesce(sum({schema.PAYLOAD_SQL[name]}), 0) FROM {name}"
            ).fetchone()
            tables[name] = TableStats(rows=int(rows), payload_bytes=int(payload))
        return tables


def open_archive(target: str | os.PathLike[str], **options: Any) -> ArchiveBase:
    """The archive at `target`: `PostgresArchive` for a `postgresql://` URL, else the SQLite `Archive`.

    Args:
        target: a `postgresql://user:password@host/db` URL, or a file path
            (`":memory:"` for a throwaway SQLite archive).
        options: keyword arguments of the chosen class (`readonly=True`, ...).

    Examples:
        >>> with open_archive(":memory:") as arc:
        ...     type(arc).__name__
        'Archive'
    """
    if is_postgres_url(target):
        return PostgresArchive(str(target), **options)
    return Archive(target, **options)


class Archive(ArchiveBase, ArchiveConnection):
    """A SQLite file holding agents, ledgers, KV states, events and evicted text.

    The archive opens (creating or migrating the file) in the constructor and
    holds an exclusive lock on `<path>-lock` until `close`, unless
    `readonly=True`. All methods are thread-safe (one internal lock); methods
    that write commit before returning, except inside `transaction`, which
    commits all its writes at once.

    Methods by kind of data:

    * agents and ledgers (`AgentsMixin`): `put_agent`, `get_agent`,
      `list_agents`, `delete_agent`, `put_ledger`, `get_ledger`, `delete_ledger`;
    * states and checkpoints (`StatesMixin`): `put_state`, `get_state`,
      `get_state_info`, `delete_state`, `put_checkpoint`, `get_checkpoint`,
      `checkpoint_prompt_ends`;
    * events and evicted text (`EventsMixin`): `log_event`, `events`,
      `prune_events`, `add_evicted_span`, `add_evicted_spans`, `list_evicted`,
      `search_evicted`;
    * shared blocks (`BlocksMixin`): `put_shared_block`, `get_shared_block`,
      `has_shared_block`, `list_shared_blocks`, `incref_shared_block`,
      `decref_shared_block`, `state_blocks`, `gc_shared_blocks`;
    * leases (`LeasesMixin`): `acquire_lease`, `renew_lease`, `release_lease`,
      `current_lease`, `lease_log`; every agent-scoped write takes `fence=lease`;
    * the file (`ArchiveConnection` and here): `transaction`, `close`, `stats`,
      `checkpoint`, `vacuum`.

    One writer per file: two replicas cannot share one SQLite archive (use
    `PostgresArchive`); leases here serve parity and single-host tests.

    Args:
        path: database file, created if missing; `":memory:"` for a throwaway
            archive (no lock, no file).
        readonly: open for reading only; takes no lock, never migrates, fails on
            writes; works while another process holds the archive.
        synchronous: `"NORMAL"` (default; survives process crashes, a power
            cut may drop the last commits) or `"FULL"` (fsync every commit).
        busy_timeout_ms: how long SQLite waits for a concurrent reader or
            checkpoint before failing.

    Raises:
        ArchiveError: the file is not a SQLite database, is a database of some
            other application, has a newer schema, is locked by another writer,
            or cannot be created.

    Examples:
        >>> import numpy as np
        >>> with Archive(":memory:") as arc:
        ...     with arc.transaction():
        ...         arc.put_ledger("coder", np.array([2, 10, 11], np.int32),
        ...                        [(0, 1, "system", 0), (1, 3, "user", 0)])
        ...         _ = arc.put_state("coder", b"\\x00" * 64, codec="f16", n_tokens=3,
        ...                       fingerprint={"model": "gemma-3-270m"})
        ...     state = arc.get_state("coder")
        ...     (state.n_tokens, state.codec, len(state.blob))
        (3, 'f16', 64)
    """

    def _disk_bytes(self) -> tuple[int, int]:
        if self._memory:
            conn = self._require_conn()
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            return pages * conn.execute("PRAGMA page_size").fetchone()[0], 0
        wal = _file_size(os.path.realpath(self.path) + "-wal")  # SQLite keeps it by the real file
        return _file_size(self.path) + wal, wal

    def stats(self) -> ArchiveStats:
        """Sizes and row counts; cheap (blob lengths come from record headers)."""
        with self._reading("stats") as db:
            conn = self._require_conn()
            tables = self._table_stats(db)
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            page_count = conn.execute("PRAGMA page_count").fetchone()[0]
            freelist = conn.execute("PRAGMA freelist_count").fetchone()[0]
            file_bytes, wal_bytes = self._disk_bytes()
        return ArchiveStats(
            path=self.path,
            schema_version=self._schema_version,
            file_bytes=file_bytes,
            wal_bytes=wal_bytes,
            page_size=page_size,
            page_count=page_count,
            freelist_pages=freelist,
            fts=self._fts,
            tables=tables,
        )

    def checkpoint(self) -> None:
        """Copy the WAL into the database file and truncate it."""
        with self._reading("checkpoint") as db:
            if not self._memory:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def vacuum(self) -> VacuumResult:
        """Rebuild the file to return free pages to the OS; merges the FTS index.

        Not allowed inside `transaction`.

        Returns:
            Database + WAL bytes before and after.
        """
        with self._reading("vacuum") as db:
            if self.readonly:
                raise ArchiveError(f"{self.path}: opened readonly; cannot vacuum")
            if self._require_conn().in_transaction:
                raise ArchiveError(f"{self.path}: cannot vacuum inside a transaction")
            before = self._disk_bytes()[0]
            if self._fts:
                db.table("evicted_spans").optimize()
            db.execute("VACUUM")
            if not self._memory:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            after = self._disk_bytes()[0]
        logger.info("%s: vacuum %d -> %d bytes", self.path, before, after)
        return VacuumResult(bytes_before=before, bytes_after=after)


class PostgresArchive(ArchiveBase, PostgresConnection):
    """The archive in a PostgreSQL database, shared by every replica that opens it.

    Same methods and semantics as `Archive` (agents, ledgers, checksummed and
    fingerprinted states, checkpoints, shared blocks with exact refcounts,
    events, evicted-text recall, leases and fencing), over psycopg 3. Many
    processes may open one database; `acquire_lease` decides which of them
    writes an agent, and `fence=lease` makes a replica that lost it unable to
    commit. Full-text recall uses a generated `tsvector` (English stemming,
    `ts_rank`) instead of FTS5.

    Args:
        url: `postgresql://user:password@host:port/database`; libpq parameters
            go in the query (`?sslmode=require`, `?options=-csearch_path%3Dagents`
            for a schema other than `public`). Never logged with its password.
        readonly: refuse writes and never migrate.
        connect_timeout_s: how long connecting may take.
        application_name: what `pg_stat_activity` shows for the connection.

    Raises:
        ArchiveError: cannot connect, the schema holds another application's
            tables or a newer schema version, or psycopg is not installed.
    """

    def _relation_bytes(self, db: Any) -> int:
        names = list(schema.TABLES) + ["meta"]
        row = db.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relname = ANY(?)",
            [names],
        ).fetchone()
        return int(row[0])

    def stats(self) -> ArchiveStats:
        """Row counts and payload per table; `file_bytes` is the tables' size with indexes and TOAST."""
        with self._reading("stats") as db:
            tables = self._table_stats(db)
            page_size = int(db.execute("SELECT current_setting('block_size')::int").fetchone()[0])
            total = self._relation_bytes(db)
        return ArchiveStats(
            path=self.path, schema_version=self._schema_version, file_bytes=total, wal_bytes=0,
            page_size=page_size, page_count=total // page_size, freelist_pages=0, fts=True, tables=tables,
        )

    def checkpoint(self) -> None:
        """Nothing to do: the server manages its WAL (a `CHECKPOINT` needs superuser rights)."""
        with self._reading("checkpoint"):
            return

    def vacuum(self) -> VacuumResult:
        """`VACUUM FULL` the archive's tables, returning their free space to the OS.

        It locks each table exclusively while it is rewritten: run it when the
        replicas are quiet. Not allowed inside `transaction`.
        """
        with self._reading("vacuum") as db:
            if self.readonly:
                raise ArchiveError(f"{self.path}: opened readonly; cannot vacuum")
            if self._tx_depth:
                raise ArchiveError(f"{self.path}: cannot vacuum inside a transaction")
            before = self._relation_bytes(db)
            for name in schema.TABLES:
                db.execute(f"VACUUM FULL {name}")
            after = self._relation_bytes(db)
        logger.info("%s: vacuum %d -> %d bytes", self.path, before, after)
        return VacuumResult(bytes_before=before, bytes_after=after)
