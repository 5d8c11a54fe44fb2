"""The public `Archive`: one SQLite file with reads and writes by kind of data.

`Archive` composes the per-kind mixins over `ArchiveConnection` and adds the
maintenance calls (`stats`, `checkpoint`, `vacuum`).
"""

from __future__ import annotations

import logging
import os

from agentmem.archive import schema
from agentmem.archive.agents import AgentsMixin
from agentmem.archive.blocks import BlocksMixin
from agentmem.archive.connection import _file_size
from agentmem.archive.events import EventsMixin
from agentmem.archive.records import ArchiveStats, TableStats, VacuumResult
from agentmem.archive.states import StatesMixin
from agentmem.errors import ArchiveError

__all__ = ["Archive"]

logger = logging.getLogger(__name__)


class Archive(AgentsMixin, StatesMixin, EventsMixin, BlocksMixin):
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
    * the file (`ArchiveConnection` and here): `transaction`, `close`, `stats`,
      `checkpoint`, `vacuum`.

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
            tables = {}
            for name in schema.TABLES:
                rows, payload = db.execute(
                    f"SELECT count(*), coalesce(sum({schema.PAYLOAD_SQL[name]}), 0) FROM {name}"
                ).fetchone()
                tables[name] = TableStats(rows=rows, payload_bytes=payload)
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
