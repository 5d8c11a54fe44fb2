"""The archive's schema as ordered migrations.

A file's schema version is the number of steps of `MIGRATIONS` applied to it;
`SCHEMA_VERSION` is the newest. These are the SQLite steps; `pg_schema` holds the
PostgreSQL ones, one per version here, so both backends number versions alike.
`migrate` applies the missing steps, each in its
own transaction together with its version bump. `TABLES` and `PAYLOAD_SQL` say
which tables `Archive.stats` counts and how it sizes their payload.

A new schema step is one more `_vN_…` function appended to `MIGRATIONS`; never edit
a released step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlite_utils import Database

from agentmem.errors import ArchiveError

__all__ = ["MIGRATIONS", "PAYLOAD_SQL", "SCHEMA_VERSION", "TABLES", "migrate"]

logger = logging.getLogger(__name__)


_V1_AGENTS = """
        CREATE TABLE meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        CREATE TABLE agents (
            id       TEXT PRIMARY KEY,
            priority NOT NULL DEFAULT 0,   -- no type: keeps ints as ints, names as text
            labels   TEXT NOT NULL DEFAULT '{}',
            created  REAL NOT NULL,
            updated  REAL NOT NULL
        );
        -- Large columns come last in every table: SQLite must walk a column's
        -- overflow pages to reach the columns after it.
        CREATE TABLE ledgers (
            agent_id TEXT PRIMARY KEY REFERENCES agents(id) ON DELETE CASCADE,
            n_tokens INTEGER NOT NULL,
            n_bytes  INTEGER NOT NULL,     -- bytes of tokens + regions + messages
            updated  REAL NOT NULL,
            regions  TEXT NOT NULL,        -- JSON [[start, end, region, flags], ...]
            messages TEXT,                 -- JSON list of message dicts, or NULL
            tokens   BLOB NOT NULL         -- int32 little-endian
        );
"""
"""Version 1: meta, agents and their ledgers (token lists, spans, messages)."""

_V1_STATES = """
        CREATE TABLE states (
            agent_id    TEXT PRIMARY KEY REFERENCES agents(id) ON DELETE CASCADE,
            tier        TEXT NOT NULL,
            codec       TEXT NOT NULL,
            n_tokens    INTEGER NOT NULL,
            n_bytes     INTEGER NOT NULL,
            checksum    TEXT NOT NULL,     -- "sha256:<hex>" of blob
            fingerprint TEXT NOT NULL,     -- JSON object, keys sorted
            created     REAL NOT NULL,
            blob        BLOB NOT NULL
        );
"""
"""Version 1: one KV state per agent."""

_V1_HISTORY = """
        CREATE TABLE events (
            id       INTEGER PRIMARY KEY,
            ts       REAL NOT NULL,
            agent_id TEXT,                 -- NULL for pool-wide events; no FK on purpose
            kind     TEXT NOT NULL,
            data     TEXT NOT NULL         -- JSON object
        );
        CREATE TABLE evicted_spans (
            id       INTEGER PRIMARY KEY,
            agent_id TEXT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
            start    INTEGER NOT NULL,
            "end"    INTEGER NOT NULL,
            region   TEXT NOT NULL,
            text     TEXT NOT NULL,
            ts       REAL NOT NULL
        );
        CREATE INDEX evicted_spans_agent ON evicted_spans(agent_id, id);
"""
"""Version 1: what happened to an agent, and the text evicted from its context."""

_V1_SHARED_BLOCKS = """
        CREATE TABLE shared_blocks (
            id          TEXT PRIMARY KEY,
            refcount    INTEGER NOT NULL DEFAULT 0 CHECK (refcount >= 0),
            n_tokens    INTEGER NOT NULL,
            n_bytes     INTEGER NOT NULL,
            checksum    TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            created     REAL NOT NULL,
            updated     REAL NOT NULL,
            blob        BLOB NOT NULL
        );
"""
"""Version 1: shared KV prefixes, stored once."""


def _v1_initial(db: Database) -> None:
    """Version 1: every table of the archive."""
    db.executescript(_V1_AGENTS + _V1_STATES + _V1_HISTORY + _V1_SHARED_BLOCKS)


def _v2_event_indexes(db: Database) -> None:
    """Version 2: indexes for per-agent and recent-first event queries."""
    db.table("events").create_index(["agent_id", "id"], index_name="events_agent")
    db.table("events").create_index(["ts"], index_name="events_ts")


def _v3_state_blocks(db: Database) -> None:
    """Version 3: a state may reference a shared block (it then holds only its private cells).

    `shared_blocks.refcount` counts the states that reference a block; triggers
    keep it exact (cascading deletes included) and drop a block when it reaches 0.
    """
    db.executescript(
        """
        CREATE TABLE state_blocks (
            agent_id TEXT PRIMARY KEY REFERENCES states(agent_id) ON DELETE CASCADE,
            block_id TEXT NOT NULL REFERENCES shared_blocks(id),
            layout   BLOB NOT NULL          -- int32 order array (agentmem.memory.shared.split_state)
        );
        CREATE INDEX state_blocks_block ON state_blocks(block_id);
        CREATE TRIGGER state_blocks_ref AFTER INSERT ON state_blocks BEGIN
            UPDATE shared_blocks SET refcount = refcount + 1 WHERE id = NEW.block_id;
        END;
        CREATE TRIGGER state_blocks_unref AFTER DELETE ON state_blocks BEGIN
            UPDATE shared_blocks SET refcount = refcount - 1 WHERE id = OLD.block_id;
            DELETE FROM shared_blocks WHERE id = OLD.block_id AND refcount = 0;
        END;
        """
    )


def _v4_state_checkpoints(db: Database) -> None:
    """Version 4: a state's sliding-window checkpoint (and the prompt end it belongs to)."""
    db.executescript(
        """
        CREATE TABLE state_checkpoints (
            agent_id        TEXT PRIMARY KEY REFERENCES states(agent_id) ON DELETE CASCADE,
            prompt_end_hist INTEGER NOT NULL,   -- history tokens at the last prompt's end
            prompt_end_live INTEGER NOT NULL,   -- live tokens (KV cells) there
            checksum        TEXT NOT NULL,      -- "sha256:<hex>" of blob
            layout          BLOB,               -- order array when cut against the state itself
            blob            BLOB NOT NULL
        );
        """
    )


def _v5_leases(db: Database) -> None:
    """Version 5: agent leases with fencing tokens, and their log.

    A lease row outlives its release and its agent (`token` must never be reused),
    so it has no foreign key to `agents`.
    """
    db.executescript(
        """
        CREATE TABLE leases (
            agent_id   TEXT PRIMARY KEY,
            owner      TEXT,                -- NULL once released
            token      INTEGER NOT NULL,    -- fencing token: +1 per new owner, never reused
            expires_at REAL NOT NULL,
            updated    REAL NOT NULL
        );
        CREATE TABLE lease_log (
            id       INTEGER PRIMARY KEY,
            agent_id TEXT NOT NULL,
            owner    TEXT NOT NULL,
            token    INTEGER NOT NULL,
            kind     TEXT NOT NULL,         -- acquire | renew | release | takeover
            at       REAL NOT NULL
        );
        CREATE INDEX lease_log_agent ON lease_log(agent_id, id);
        """
    )


def _v6_span_vectors(db: Database) -> None:
    """Version 6: one embedding per evicted span (`agentmem.archive.vectors`), deleted with its span.

    `agent_id` repeats the span's so a search selects an agent's or a tenant's vectors
    without a join; `model` names the embedder (vectors of two embedders never compare).
    """
    db.executescript(
        """
        CREATE TABLE span_vectors (
            span_id  INTEGER PRIMARY KEY REFERENCES evicted_spans(id) ON DELETE CASCADE,
            agent_id TEXT NOT NULL,
            model    TEXT NOT NULL,
            vec      BLOB NOT NULL          -- float32 little-endian, unit length
        );
        CREATE INDEX span_vectors_agent ON span_vectors(agent_id, model);
        """
    )


def _v7_span_kv(db: Database) -> None:
    """Version 7: an evicted span's KV cells (`agentmem.archive.spankv`), deleted with its span.

    `model` is the fingerprint of the model and cache layout that wrote the blob (it loads
    nowhere else); `tokens` the span's token ids (int32 little-endian), which a state blob
    does not keep; `pos0` the position of its first cell in the blob.
    """
    db.executescript(
        """
        CREATE TABLE span_kv (
            span_id  INTEGER PRIMARY KEY REFERENCES evicted_spans(id) ON DELETE CASCADE,
            agent_id TEXT NOT NULL,
            model    TEXT NOT NULL,
            pos0     INTEGER NOT NULL,
            n_tokens INTEGER NOT NULL,
            tokens   BLOB NOT NULL,
            blob     BLOB NOT NULL
        );
        CREATE INDEX span_kv_agent ON span_kv(agent_id);
        """
    )


MIGRATIONS: list[Callable[[Database], None]] = [
    _v1_initial, _v2_event_indexes, _v3_state_blocks, _v4_state_checkpoints, _v5_leases, _v6_span_vectors,
    _v7_span_kv,
]
"""Schema steps in order; step `i` takes a file from version `i` to `i + 1`."""

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes."""

TABLES = (
    "agents", "ledgers", "states", "events", "evicted_spans", "shared_blocks", "state_blocks", "state_checkpoints",
    "leases", "lease_log", "span_vectors", "span_kv",
)
"""Every table of the newest schema, in the order `Archive.stats` reports them."""

PAYLOAD_SQL = {
    "agents": "length(id) + length(labels)",
    "ledgers": "n_bytes",
    "states": "length(blob) + length(fingerprint)",
    "events": "length(kind) + length(data)",
    "evicted_spans": "length(text)",
    "shared_blocks": "length(blob) + length(fingerprint)",
    "state_blocks": "length(layout)",
    "state_checkpoints": "length(blob) + coalesce(length(layout), 0)",
    "leases": "length(agent_id) + coalesce(length(owner), 0)",
    "lease_log": "length(agent_id) + length(owner) + length(kind)",
    "span_vectors": "length(vec)",
    "span_kv": "length(tokens) + length(blob)",
}
"""Per table, the SQL expression summing a row's stored payload bytes (valid SQL for both backends)."""


def needs_migration(path: str, version: int, *, readonly: bool) -> bool:
    """Whether an archive at schema `version` must be migrated to `SCHEMA_VERSION` (both backends).

    Raises:
        ArchiveError: the archive is newer than this agentmem, or older and opened read-only.
    """
    newest = SCHEMA_VERSION
    if version > newest:
        raise ArchiveError(
            f"{path}: schema version {version} is newer than this agentmem "
            f"supports (version {newest}); upgrade agentmem to open it"
        )
    if version < newest and readonly:
        raise ArchiveError(
            f"{path}: schema version {version} needs migrating to version "
            f"{newest}; open it once without readonly=True"
        )
    return version < newest


def migrate(db: Database, path: str, version: int) -> None:
    """Take the file behind `db` from schema `version` to `SCHEMA_VERSION`.

    Each step commits together with its version bump, or not at all, so a failed
    step leaves the file at the last version that fully applied.

    Args:
        db: the open, writable database.
        path: the file's name, for messages.
        version: the file's current schema version.

    Raises:
        ArchiveError: a step failed; the message names it and both versions.
    """
    for step in range(version, SCHEMA_VERSION):
        migration = MIGRATIONS[step]
        try:
            with db.atomic():
                migration(db)
                db.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    [str(step + 1)],
                )
                if step == 0:
                    db.execute(
                        "INSERT INTO meta(key, value) VALUES ('application', 'agentmem'), ('created', ?)",
                        [str(time.time())],
                    )
        except Exception as exc:
            raise ArchiveError(
                f"{path}: migration {migration.__name__} (version {step} -> {step + 1}) failed: {exc}"
            ) from exc
        logger.info("%s: migrated schema to version %d (%s)", path, step + 1, migration.__name__)
