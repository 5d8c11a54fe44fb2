"""The frozen records the archive's queries return.

Each class is one row (or one summary) as a caller sees it; none of them holds a
connection. `Region` and `BlobLike` are the type aliases the writers accept.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

__all__ = [
    "AgentRecord",
    "ArchiveStats",
    "BlobLike",
    "EventRecord",
    "EvictedSpan",
    "Lease",
    "LeaseEvent",
    "LeaseKind",
    "LedgerRecord",
    "Region",
    "SharedBlock",
    "SharedBlockInfo",
    "StateInfo",
    "StoredState",
    "TableStats",
    "VacuumResult",
]

Region = tuple[int, int, str, int]
"""One ledger span: `(start, end, region, flags)`, `end` exclusive."""

BlobLike = bytes | bytearray | memoryview | np.ndarray


@dataclasses.dataclass(frozen=True, slots=True)
class AgentRecord:
    """One agent as `Archive.list_agents` and `Archive.get_agent` see it.

    Attributes:
        agent_id: the agent's id.
        priority: what the pool stored (an int or a name such as `"foreground"`).
        labels: free-form JSON labels.
        created: Unix time the agent was first stored.
        updated: Unix time of the last write touching the agent.
        ledger_tokens: tokens in its ledger (0 without a ledger).
        ledger_bytes: bytes of its ledger (tokens + regions + messages).
        tier: tier recorded with its state, `None` without a state.
        codec: codec of its state, `None` without a state.
        state_tokens: tokens covered by its state (0 without a state).
        state_bytes: bytes of its state blob (0 without a state).
    """

    agent_id: str
    priority: int | str
    labels: dict[str, Any]
    created: float
    updated: float
    ledger_tokens: int
    ledger_bytes: int
    tier: str | None
    codec: str | None
    state_tokens: int
    state_bytes: int

    @property
    def n_bytes(self) -> int:
        """Ledger plus state bytes."""
        return self.ledger_bytes + self.state_bytes


@dataclasses.dataclass(frozen=True, slots=True)
class LedgerRecord:
    """An agent's stored token ledger.

    Attributes:
        agent_id: the agent's id.
        tokens: token ids, `int32`, one per ledger position.
        regions: `(start, end, region, flags)` spans over `tokens`.
        messages: the chat messages the tokens were rendered from, if stored.
        updated: Unix time of the write.
    """

    agent_id: str
    tokens: np.ndarray
    regions: list[Region]
    messages: list[dict[str, Any]] | None
    updated: float

    @property
    def n_tokens(self) -> int:
        """Number of tokens in the ledger."""
        return int(self.tokens.shape[0])


@dataclasses.dataclass(frozen=True, slots=True)
class StateInfo:
    """Metadata of a stored KV state, without its blob.

    Attributes:
        agent_id: the agent's id.
        tier: the tier the pool recorded (`"cold"` unless told otherwise).
        codec: codec name of the blob (`"f16"`, `"q8_0"`, …).
        n_tokens: tokens the state covers.
        n_bytes: length of the blob.
        checksum: `"sha256:<hex>"` of the blob.
        fingerprint: model and cache configuration the state belongs to.
        created: Unix time of the write.
    """

    agent_id: str
    tier: str
    codec: str
    n_tokens: int
    n_bytes: int
    checksum: str
    fingerprint: dict[str, Any]
    created: float


@dataclasses.dataclass(frozen=True, slots=True)
class StoredState(StateInfo):
    """A verified KV state: `StateInfo` plus the blob itself.

    When `block_id` is set the blob holds only the agent's private cells; the
    rest are in that shared block and `layout` (int32 little-endian) says how
    the two join (`agentmem.memory.shared.join_state`).
    """

    blob: bytes = b""
    block_id: str | None = None
    layout: bytes | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class EventRecord:
    """One entry of the event log (newest first from `Archive.events`)."""

    id: int
    ts: float
    agent_id: str | None
    kind: str
    data: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class EvictedSpan:
    """Text evicted from an agent's context, kept for recall.

    Attributes:
        id: row id.
        agent_id: the agent it was evicted from.
        start, end: ledger positions of the span (`end` exclusive).
        region: region name of the span.
        text: the span's text.
        ts: Unix time of the eviction.
        score: relevance to the query (higher is better; 0.0 outside searches).
    """

    id: int
    agent_id: str
    start: int
    end: int
    region: str
    text: str
    ts: float
    score: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class SharedBlockInfo:
    """Metadata of a shared KV block, without its blob."""

    block_id: str
    refcount: int
    n_tokens: int
    n_bytes: int
    checksum: str
    fingerprint: dict[str, Any]
    created: float
    updated: float


@dataclasses.dataclass(frozen=True, slots=True)
class SharedBlock(SharedBlockInfo):
    """A verified shared KV block: `SharedBlockInfo` plus the blob."""

    blob: bytes = b""


@dataclasses.dataclass(frozen=True, slots=True)
class TableStats:
    """Row count and payload bytes (sum of stored column lengths) of one table."""

    rows: int
    payload_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class ArchiveStats:
    """Size and content summary of an archive (`Archive.stats`).

    Attributes:
        path: the database file.
        schema_version: schema version of the file.
        file_bytes: size of the database file plus its WAL.
        wal_bytes: size of the WAL alone.
        page_size: SQLite page size.
        page_count: pages in the database file.
        freelist_pages: unused pages that `Archive.vacuum` would return.
        fts: whether full-text search runs on FTS5 (else LIKE scans).
        tables: per table rows and payload bytes.
    """

    path: str
    schema_version: int
    file_bytes: int
    wal_bytes: int
    page_size: int
    page_count: int
    freelist_pages: int
    fts: bool
    tables: dict[str, TableStats]


@dataclasses.dataclass(frozen=True, slots=True)
class VacuumResult:
    """Bytes on disk (database + WAL) before and after `Archive.vacuum`."""

    bytes_before: int
    bytes_after: int


LeaseKind = Literal["acquire", "renew", "release", "takeover"]
"""What a `LeaseEvent` records."""


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """The right of one owner (a replica) to write one agent, with its fencing token.

    Pass it as `fence=` to the archive's agent-scoped writes: they commit only while
    the agent's lease row still holds this owner and token.

    Attributes:
        agent_id: the agent the lease is for.
        owner: who holds it (a replica's name).
        token: the fencing token; strictly increasing per agent, never reused.
        expires_at: when it lapses unless renewed, in seconds since the epoch by the
            archive's clock (the database server's on PostgreSQL), so compare it with
            another `Lease`, not with the local clock.
    """

    agent_id: str
    owner: str
    token: int
    expires_at: float


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseEvent:
    """One line of the lease log (`Archive.lease_log`), oldest first.

    Attributes:
        agent_id: the agent.
        owner: the owner that acquired, renewed, released or took over the lease.
        token: the lease's token after the event.
        kind: `acquire` (a free or released lease, or the owner's own expired one),
            `renew`, `release` or `takeover` (another owner's lease had expired).
        at: when, by the archive's clock.
    """

    agent_id: str
    owner: str
    token: int
    kind: LeaseKind
    at: float
