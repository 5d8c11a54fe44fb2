"""The archive: agentmem's cold tier and its recall store, on SQLite or PostgreSQL.

An archive is one SQLite file (WAL journal, the embedded default) or one
PostgreSQL database shared by several replicas; either outlives the process. It holds,
per agent, the record (priority, labels), the token ledger (tokens, region spans,
message text), at most one KV state blob with its codec, checksum and
model/config fingerprint, an event log, the text of evicted spans (full-text
searchable), shared KV blocks with reference counts, and leases with fencing
tokens that decide which replica may write an agent.

* `records` holds the frozen records the queries return (`AgentRecord`,
  `LedgerRecord`, `StateInfo`, `StoredState`, `EventRecord`, `EvictedSpan`,
  `SharedBlockInfo`, `SharedBlock`, `TableStats`, `ArchiveStats`, `VacuumResult`,
  `Lease`, `LeaseEvent`).
* `values` holds `checksum` and the value checks both backends apply before any SQL.
* `core` is the backend-neutral plumbing: the lock, reading/writing helpers,
  `transaction` and the fencing check.
* `schema` holds the SQLite migrations (`MIGRATIONS`, `SCHEMA_VERSION`) and
  applies the missing ones to an older file; `pg_schema` the PostgreSQL ones.
* `connection` opens a SQLite file (path checks, the one-writer file lock, WAL
  and pragmas, schema, FTS5 set-up and search).
* `postgres` opens a PostgreSQL database (psycopg 3, migrations under an
  advisory lock, `tsvector` search, the server's clock, URL redaction).
* `agents` reads and writes agent records and token ledgers.
* `states` reads and writes KV states and their sliding-window checkpoints.
* `events` keeps the event log and the evicted text with its full-text search.
* `vectors` keeps the evicted spans' embeddings and searches them by cosine, through
  `hotvectors` (the vectors of recent and pinned agents in RAM) and, on PostgreSQL,
  `pgvector` (an HNSW index where the database has the extension; exact otherwise).
* `blocks` keeps shared KV blocks and their reference counts.
* `leases` keeps agent leases (owner, fencing token, expiry) and their log.
* `store` composes those into the public `Archive` (SQLite) and `PostgresArchive`,
  adds stats, checkpoint and vacuum, and `open_archive(path or URL)`.
"""

from agentmem.archive.records import (
    AgentRecord,
    ArchiveStats,
    EventRecord,
    EvictedSpan,
    Lease,
    LeaseEvent,
    LedgerRecord,
    SharedBlock,
    SharedBlockInfo,
    StateInfo,
    StoredState,
    TableStats,
    VacuumResult,
)
from agentmem.archive.schema import MIGRATIONS, SCHEMA_VERSION
from agentmem.archive.store import Archive, ArchiveBase, PostgresArchive, open_archive
from agentmem.archive.values import checksum

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AgentRecord",
    "Archive",
    "ArchiveBase",
    "ArchiveStats",
    "EventRecord",
    "EvictedSpan",
    "Lease",
    "LeaseEvent",
    "LedgerRecord",
    "PostgresArchive",
    "SharedBlock",
    "SharedBlockInfo",
    "StateInfo",
    "StoredState",
    "TableStats",
    "VacuumResult",
    "checksum",
    "open_archive",
]
