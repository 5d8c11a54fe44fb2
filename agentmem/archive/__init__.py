"""The SQLite archive: agentmem's cold tier and its recall store.

One archive is one SQLite file (WAL journal) that outlives the process. It holds,
per agent, the record (priority, labels), the token ledger (tokens, region spans,
message text), at most one KV state blob with its codec, checksum and
model/config fingerprint, an event log, the text of evicted spans (full-text
searchable with FTS5), and shared KV blocks with reference counts.

* `records` holds the frozen records the queries return (`AgentRecord`,
  `LedgerRecord`, `StateInfo`, `StoredState`, `EventRecord`, `EvictedSpan`,
  `SharedBlockInfo`, `SharedBlock`, `TableStats`, `ArchiveStats`, `VacuumResult`).
* `schema` holds the versioned migrations (`MIGRATIONS`, `SCHEMA_VERSION`) and
  applies the missing ones to an older file.
* `connection` opens the file (path checks, the one-writer file lock, WAL and
  pragmas, schema, FTS set-up) and holds the locked read/write/transaction
  plumbing, `checksum` and the value checks.
* `agents` reads and writes agent records and token ledgers.
* `states` reads and writes KV states and their sliding-window checkpoints.
* `events` keeps the event log and the evicted text with its full-text search.
* `blocks` keeps shared KV blocks and their reference counts.
* `store` composes those into the public `Archive` and adds stats, WAL
  checkpoint and vacuum.
"""

from agentmem.archive.connection import checksum
from agentmem.archive.records import (
    AgentRecord,
    ArchiveStats,
    EventRecord,
    EvictedSpan,
    LedgerRecord,
    SharedBlock,
    SharedBlockInfo,
    StateInfo,
    StoredState,
    TableStats,
    VacuumResult,
)
from agentmem.archive.schema import MIGRATIONS, SCHEMA_VERSION
from agentmem.archive.store import Archive

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AgentRecord",
    "Archive",
    "ArchiveStats",
    "EventRecord",
    "EvictedSpan",
    "LedgerRecord",
    "SharedBlock",
    "SharedBlockInfo",
    "StateInfo",
    "StoredState",
    "TableStats",
    "VacuumResult",
    "checksum",
]
