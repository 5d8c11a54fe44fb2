"""The SQLite archive: agentmem's cold tier and its recall store.

One archive is one SQLite file (WAL journal) that outlives the process. It holds,
per agent, the record (priority, labels), the token ledger (tokens, region spans,
message text), at most one KV state blob with its codec, checksum and
model/config fingerprint, an event log, the text of evicted spans (full-text
searchable with FTS5), and shared KV blocks with reference counts.

Classes:

* :class:`Archive` owns the connection and the file lock, applies schema
  migrations on open and offers typed reads and writes; writes that must land
  together go through :meth:`Archive.transaction`.
* :class:`AgentRecord`, :class:`LedgerRecord`, :class:`StateInfo`,
  :class:`StoredState`, :class:`EventRecord`, :class:`EvictedSpan`,
  :class:`SharedBlock`, :class:`SharedBlockInfo`, :class:`ArchiveStats` and
  :class:`VacuumResult` are the frozen records its queries return.
* :data:`MIGRATIONS` is the ordered list of schema steps; the schema version of a
  file is the number of steps applied to it (:data:`SCHEMA_VERSION` is the newest).

Concurrency: one writer per file. A writable ``Archive`` takes an exclusive
advisory lock (``flock`` on ``<path>-lock``) for as long as it is open, so a
second writer -- another pool, another process, or a second ``Archive`` in the
same process -- fails at once with ``ArchiveError("… is in use by pid N …")``.
Readers (``readonly=True``, used by ``agentmem archive ls``) take no lock and see
consistent snapshots thanks to WAL, so they work while a pool is running.

Durability: ``synchronous=NORMAL`` in WAL mode (the default) never corrupts the
file and loses no committed transaction when the *process* dies (SIGKILL, OOM);
a power cut may drop the last few commits, which is acceptable for a cache whose
ledger the application can resend. Pass ``synchronous="FULL"`` to fsync every
commit. Every state blob carries a SHA-256 checksum written in the same
transaction and verified on read; a mismatch raises :class:`CodecError`, which
callers treat as a cache miss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from sqlite_utils import Database

from agentmem.errors import ArchiveError, CodecError, FingerprintMismatch

if TYPE_CHECKING:
    from typing_extensions import Self

try:  # POSIX only; elsewhere the archive opens without the cross-process lock
    import fcntl
except ImportError:  # pragma: no cover - exercised on Windows only
    fcntl = None  # type: ignore[assignment]

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

logger = logging.getLogger(__name__)

Region = tuple[int, int, str, int]
"""One ledger span: ``(start, end, region, flags)``, ``end`` exclusive."""

BlobLike = bytes | bytearray | memoryview | np.ndarray

_CHECKSUM_ALGO = "sha256"  # SHA-NI makes it ~2x faster than blake2b on x86
_BUSY_TIMEOUT_MS = 5_000
_WAL_SIZE_LIMIT = 64 * 1024 * 1024  # truncate the WAL back to this after checkpoints
_MAX_QUERY_TERMS = 64
_INT32 = np.iinfo(np.int32)


# --------------------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True, slots=True)
class AgentRecord:
    """One agent as :meth:`Archive.list_agents` and :meth:`Archive.get_agent` see it.

    Attributes:
        agent_id: the agent's id.
        priority: what the pool stored (an int or a name such as ``"foreground"``).
        labels: free-form JSON labels.
        created: Unix time the agent was first stored.
        updated: Unix time of the last write touching the agent.
        ledger_tokens: tokens in its ledger (0 without a ledger).
        ledger_bytes: bytes of its ledger (tokens + regions + messages).
        tier: tier recorded with its state, ``None`` without a state.
        codec: codec of its state, ``None`` without a state.
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
        tokens: token ids, ``int32``, one per ledger position.
        regions: ``(start, end, region, flags)`` spans over ``tokens``.
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
        tier: the tier the pool recorded (``"cold"`` unless told otherwise).
        codec: codec name of the blob (``"f16"``, ``"q8_0"``, …).
        n_tokens: tokens the state covers.
        n_bytes: length of the blob.
        checksum: ``"sha256:<hex>"`` of the blob.
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
    """A verified KV state: :class:`StateInfo` plus the blob itself.

    When ``block_id`` is set the blob holds only the agent's private cells; the
    rest are in that shared block and ``layout`` (int32 little-endian) says how
    the two join (:func:`agentmem.memory.shared.join_state`).
    """

    blob: bytes = b""
    block_id: str | None = None
    layout: bytes | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class EventRecord:
    """One entry of the event log (newest first from :meth:`Archive.events`)."""

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
        start, end: ledger positions of the span (``end`` exclusive).
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
    """A verified shared KV block: :class:`SharedBlockInfo` plus the blob."""

    blob: bytes = b""


@dataclasses.dataclass(frozen=True, slots=True)
class TableStats:
    """Row count and payload bytes (sum of stored column lengths) of one table."""

    rows: int
    payload_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class ArchiveStats:
    """Size and content summary of an archive (:meth:`Archive.stats`).

    Attributes:
        path: the database file.
        schema_version: schema version of the file.
        file_bytes: size of the database file plus its WAL.
        wal_bytes: size of the WAL alone.
        page_size: SQLite page size.
        page_count: pages in the database file.
        freelist_pages: unused pages that :meth:`Archive.vacuum` would return.
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
    """Bytes on disk (database + WAL) before and after :meth:`Archive.vacuum`."""

    bytes_before: int
    bytes_after: int


# --------------------------------------------------------------------------- schema


def _v1_initial(db: Database) -> None:
    """Version 1: every table of the archive."""
    db.executescript(
        """
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
    )


def _v2_event_indexes(db: Database) -> None:
    """Version 2: indexes for per-agent and recent-first event queries."""
    db.table("events").create_index(["agent_id", "id"], index_name="events_agent")
    db.table("events").create_index(["ts"], index_name="events_ts")


def _v3_state_blocks(db: Database) -> None:
    """Version 3: a state may reference a shared block (it then holds only its private cells).

    ``shared_blocks.refcount`` counts the states that reference a block; triggers
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


MIGRATIONS: list[Callable[[Database], None]] = [_v1_initial, _v2_event_indexes, _v3_state_blocks, _v4_state_checkpoints]
"""Schema steps in order; step ``i`` takes a file from version ``i`` to ``i + 1``."""

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes."""

_TABLES = (
    "agents", "ledgers", "states", "events", "evicted_spans", "shared_blocks", "state_blocks", "state_checkpoints",
)
_PAYLOAD_SQL = {
    "agents": "length(id) + length(labels)",
    "ledgers": "n_bytes",
    "states": "length(blob) + length(fingerprint)",
    "events": "length(kind) + length(data)",
    "evicted_spans": "length(text)",
    "shared_blocks": "length(blob) + length(fingerprint)",
    "state_blocks": "length(layout)",
    "state_checkpoints": "length(blob) + ifnull(length(layout), 0)",
}


# --------------------------------------------------------------------------- helpers


def checksum(data: BlobLike) -> str:
    """Return the archive's checksum of ``data`` as ``"sha256:<hex>"``.

    Example:
        >>> checksum(b"abc")[:15]
        'sha256:ba7816bf'
    """
    return f"{_CHECKSUM_ALGO}:{hashlib.new(_CHECKSUM_ALGO, _as_buffer(data)).hexdigest()}"


def _verify_checksum(stored: str, data: bytes) -> str | None:
    """Return the recomputed checksum when it differs from ``stored``, else None."""
    algo, _, _ = stored.partition(":")
    try:
        actual = f"{algo}:{hashlib.new(algo, data).hexdigest()}"
    except ValueError:  # unknown algorithm name: treat as unverifiable
        return f"unknown algorithm {algo!r}"
    return None if actual == stored else actual


def _as_buffer(blob: BlobLike) -> bytes | bytearray | memoryview:
    """A zero-copy byte view of ``blob`` that sqlite3 and hashlib both accept."""
    if isinstance(blob, np.ndarray):
        return np.ascontiguousarray(blob).data.cast("B")
    if isinstance(blob, memoryview):
        return blob.cast("B") if blob.c_contiguous else memoryview(blob.tobytes())
    if isinstance(blob, (bytes, bytearray)):
        return blob
    raise TypeError(f"blob must be bytes, bytearray, memoryview or numpy array, not {type(blob).__name__}")


def _json_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _normalise_fingerprint(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """Round-trip through JSON so tuples/lists and key order compare equal."""
    if not isinstance(fingerprint, Mapping):
        raise TypeError(f"fingerprint must be a dict, not {type(fingerprint).__name__}")
    try:
        return json.loads(_json_dumps(dict(fingerprint)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"fingerprint is not JSON-serialisable: {exc}") from exc


def _check_agent_id(agent_id: str) -> str:
    if not isinstance(agent_id, str) or not agent_id:
        raise TypeError(f"agent_id must be a non-empty str, not {agent_id!r}")
    return agent_id


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, not {value!r}")
    return int(value)


def _tokens_to_bytes(tokens: np.ndarray | Sequence[int]) -> tuple[bytes, int]:
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"tokens must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < _INT32.min or arr.max() > _INT32.max):
        raise ValueError("tokens must fit in int32")
    return arr.astype("<i4", copy=False).tobytes(), int(arr.size)


def _check_regions(regions: Iterable[Sequence[Any]], n_tokens: int) -> list[list[Any]]:
    out: list[list[Any]] = []
    for i, span in enumerate(regions):
        try:
            start, end, region, flags = span
        except (TypeError, ValueError) as exc:
            raise ValueError(f"regions[{i}] must be (start, end, region, flags), got {span!r}") from exc
        if not isinstance(region, str):
            raise TypeError(f"regions[{i}]: region must be a str, got {region!r}")
        start, end, flags = int(start), int(end), int(flags)
        if not 0 <= start <= end <= n_tokens:
            raise ValueError(f"regions[{i}] = {span!r} is outside 0..{n_tokens} or reversed")
        out.append([start, end, region, flags])
    return out


def _fts_terms(query: str) -> list[str]:
    """Words of ``query``; FTS5 operators and quotes never survive this."""
    return re.findall(r"\w+", query, flags=re.UNICODE)[:_MAX_QUERY_TERMS]


def _fts5_available(conn: sqlite3.Connection) -> bool:
    """Whether this SQLite build has FTS5 (probed with a temp table)."""
    try:
        conn.execute("CREATE VIRTUAL TABLE temp._agentmem_fts5_probe USING fts5(x)")
        conn.execute("DROP TABLE temp._agentmem_fts5_probe")
    except sqlite3.OperationalError:
        return False
    return True


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# --------------------------------------------------------------------------- the archive


class Archive:
    """A SQLite file holding agents, ledgers, KV states, events and evicted text.

    The archive opens (creating or migrating the file) in the constructor and
    holds an exclusive lock on ``<path>-lock`` until :meth:`close`, unless
    ``readonly=True``. All methods are thread-safe (one internal lock); methods
    that write commit before returning, except inside :meth:`transaction`, which
    commits all its writes at once.

    Args:
        path: database file, created if missing; ``":memory:"`` for a throwaway
            archive (no lock, no file).
        readonly: open for reading only; takes no lock, never migrates, fails on
            writes; works while another process holds the archive.
        synchronous: ``"NORMAL"`` (default; survives process crashes, a power
            cut may drop the last commits) or ``"FULL"`` (fsync every commit).
        busy_timeout_ms: how long SQLite waits for a concurrent reader or
            checkpoint before failing.

    Raises:
        ArchiveError: the file is not a SQLite database, is a database of some
            other application, has a newer schema, is locked by another writer,
            or cannot be created.

    Example:
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

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_ms: int = _BUSY_TIMEOUT_MS,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
        self.path = os.fspath(path)
        self.readonly = readonly
        self._memory = self.path == ":memory:"
        self._lock = threading.RLock()
        self._lock_fd: int | None = None
        self._conn: sqlite3.Connection | None = None
        self._db: Database | None = None
        self._fts = False
        self._fts5 = False
        self._schema_version = 0
        try:
            if not self._memory:
                self._check_path()
                if not readonly:
                    self._acquire_file_lock()
            self._connect(synchronous, busy_timeout_ms)
            self._open_schema()
            self._setup_fts()
        except BaseException:
            self.close()
            raise
        logger.debug(
            "opened archive %s (schema v%d, %s, fts=%s)",
            self.path,
            self._schema_version,
            "readonly" if readonly else "read-write",
            self._fts,
        )

    # ------------------------------------------------------------------ lifecycle

    @property
    def lock_path(self) -> str:
        """The advisory lock file a writable archive holds (``<path>-lock``)."""
        return self.path + "-lock"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._conn is None

    @property
    def schema_version(self) -> int:
        """Schema version of the open file (always :data:`SCHEMA_VERSION` when writable)."""
        return self._schema_version

    @property
    def fts_enabled(self) -> bool:
        """Whether :meth:`search_evicted` uses FTS5 (else a LIKE scan)."""
        return self._fts

    def close(self) -> None:
        """Close the connection and release the lock; safe to call twice.

        An open :meth:`transaction` is rolled back.
        """
        with self._lock:
            conn, self._conn, self._db = self._conn, None, None
            if conn is not None:
                try:
                    conn.close()
                except sqlite3.Error as exc:  # pragma: no cover - close rarely fails
                    logger.warning("closing archive %s: %s", self.path, exc)
            fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                # Closing the descriptor drops the flock; the file stays so that
                # a concurrent opener never races on its creation.
                os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_conn", None) is not None:
            warnings.warn(f"Archive {self.path!r} was not closed", ResourceWarning, stacklevel=2)
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("readonly" if self.readonly else "open")
        return f"Archive({self.path!r}, {state})"

    def _check_path(self) -> None:
        p = Path(self.path)
        if p.is_dir():
            raise ArchiveError(f"{self.path}: is a directory, not an archive file")
        if self.readonly and not p.exists():
            raise ArchiveError(f"{self.path}: no such archive file")
        if not p.parent.exists():
            raise ArchiveError(f"{self.path}: directory {str(p.parent)!r} does not exist")

    def _acquire_file_lock(self) -> None:
        if fcntl is None:  # pragma: no cover - Windows
            logger.warning("no fcntl on this platform: %s is opened without an exclusive lock", self.path)
            return
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ArchiveError(f"{self.path}: cannot create lock file {self.lock_path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = ""
            try:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            except OSError:
                pass
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ArchiveError(f"{self.path}: cannot lock {self.lock_path}: {exc}") from exc
            who = f"pid {holder}" if holder.isdigit() else "another process"
            raise ArchiveError(
                f"{self.path} is in use by {who} (it holds {self.lock_path}); close the "
                "other pool/archive first, or open with readonly=True to read it"
            ) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._lock_fd = fd

    def _connect(self, synchronous: str, busy_timeout_ms: int) -> None:
        try:
            if self._memory:
                conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            elif self.readonly:
                uri = Path(self.path).resolve().as_uri() + "?mode=ro"
                conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            else:
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise ArchiveError(f"{self.path}: cannot open: {exc}") from exc
        self._conn = conn
        try:
            # isolation_level=None: no implicit transactions; sqlite-utils' atomic()
            # issues BEGIN/SAVEPOINT itself.
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            conn.execute("PRAGMA foreign_keys = ON")
            self._fts5 = _fts5_available(conn)  # probe before query_only forbids temp tables
            if self.readonly:
                conn.execute("PRAGMA query_only = ON")
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            else:
                if not self._memory:
                    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                    if str(mode).lower() != "wal":
                        logger.warning("%s: journal_mode is %s, not wal", self.path, mode)
                conn.execute(f"PRAGMA synchronous = {synchronous}")
                conn.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
        except sqlite3.DatabaseError as exc:
            name = getattr(exc, "sqlite_errorname", "")
            if name == "SQLITE_NOTADB" or "not a database" in str(exc):
                raise ArchiveError(f"{self.path}: file is not a database (not an agentmem archive)") from exc
            raise ArchiveError(f"{self.path}: cannot open: {exc}") from exc
        self._db = Database(conn, execute_plugins=False)

    def _open_schema(self) -> None:
        db = self._require_db()
        try:
            tables = set(db.table_names())
            if "meta" in tables:
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is None or not str(row[0]).isdigit():
                    raise ArchiveError(f"{self.path}: meta table has no valid schema_version ({row!r})")
                version = int(row[0])
            elif tables:
                raise ArchiveError(
                    f"{self.path}: a SQLite database but not an agentmem archive (tables: {', '.join(sorted(tables))})"
                )
            else:
                version = 0
        except sqlite3.DatabaseError as exc:
            raise ArchiveError(f"{self.path}: file is not a database or is corrupt: {exc}") from exc
        if version > SCHEMA_VERSION:
            raise ArchiveError(
                f"{self.path}: schema version {version} is newer than this agentmem "
                f"supports (version {SCHEMA_VERSION}); upgrade agentmem to open it"
            )
        if version < SCHEMA_VERSION:
            if self.readonly:
                raise ArchiveError(
                    f"{self.path}: schema version {version} needs migrating to version "
                    f"{SCHEMA_VERSION}; open it once without readonly=True"
                )
            self._migrate(version)
            version = SCHEMA_VERSION
        self._schema_version = version

    def _migrate(self, version: int) -> None:
        db = self._require_db()
        for step in range(version, SCHEMA_VERSION):
            migration = MIGRATIONS[step]
            try:
                with db.atomic():  # each step commits with its version bump, or not at all
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
                    f"{self.path}: migration {migration.__name__} (version {step} -> {step + 1}) failed: {exc}"
                ) from exc
            logger.info("%s: migrated schema to version %d (%s)", self.path, step + 1, migration.__name__)

    def _setup_fts(self) -> None:
        """Use FTS5 for evicted text when SQLite has it; keep the index in step."""
        db = self._require_db()
        available = self._fts5
        spans = db.table("evicted_spans")
        has_table = db.table("evicted_spans_fts").exists()
        has_triggers = {"evicted_spans_ai", "evicted_spans_ad", "evicted_spans_au"} <= {t.name for t in spans.triggers}
        if available and has_table and has_triggers:
            self._fts = True
            return
        if self.readonly:
            self._fts = available and has_table and has_triggers
            if not self._fts:
                logger.warning("%s: FTS5 index unusable; evicted-text search falls back to LIKE", self.path)
            return
        try:
            with db.atomic():
                if available:
                    if has_table:  # index left stale by a build without FTS5: rebuild it
                        spans.disable_fts()
                    spans.enable_fts(["text"], create_triggers=True, tokenize="porter unicode61")
                    self._fts = True
                    return
                if has_table:
                    # Without the FTS5 module the sync triggers would make every
                    # insert fail; drop them. A later open with FTS5 rebuilds.
                    for name in ("evicted_spans_ai", "evicted_spans_ad", "evicted_spans_au"):
                        db.execute(f'DROP TRIGGER IF EXISTS "{name}"')
        except sqlite3.Error as exc:
            raise ArchiveError(f"{self.path}: cannot set up full-text search: {exc}") from exc
        self._fts = False
        logger.warning("%s: SQLite has no FTS5; evicted-text search falls back to LIKE scans", self.path)

    # ------------------------------------------------------------------ plumbing

    def _require_db(self) -> Database:
        if self._db is None:
            raise ArchiveError(f"{self.path}: archive is closed")
        return self._db

    def _require_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ArchiveError(f"{self.path}: archive is closed")
        return self._conn

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[Database]:
        """Hold the lock and turn SQLite errors into ``ArchiveError`` naming the file."""
        with self._lock:
            db = self._require_db()
            try:
                yield db
            except sqlite3.Error as exc:
                raise ArchiveError(f"{self.path}: {what} failed: {exc}") from exc

    def _row(self, what: str, sql: str, params: Sequence[Any]) -> Any:
        """The first row of a read query (``None`` when there is none)."""
        with self._reading(what) as db:
            return db.execute(sql, list(params)).fetchone()

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[Database]:
        """Like :meth:`_reading`, inside a transaction (a savepoint when nested)."""
        with self._reading(what) as db:
            if self.readonly:
                raise ArchiveError(f"{self.path}: opened readonly; cannot {what}")
            with db.atomic():
                yield db

    def _touch_agent(self, db: Database, agent_id: str, now: float) -> None:
        db.execute(
            "INSERT INTO agents(id, created, updated) VALUES (?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET updated = excluded.updated",
            [agent_id, now, now],
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Archive]:
        """Group writes so they commit together or not at all.

        Nested calls become savepoints. Other threads wait until the outermost
        block ends. An exception inside the block rolls everything back and
        propagates.

        Example:
            >>> import numpy as np
            >>> with Archive(":memory:") as arc:
            ...     with arc.transaction():
            ...         arc.put_ledger("a", np.arange(4, dtype=np.int32), [])
            ...         _ = arc.put_state("a", b"kv", codec="f16", n_tokens=4, fingerprint={})
            ...     arc.get_ledger("a").n_tokens
            4
        """
        with self._writing("transaction") as _:
            yield self

    # ------------------------------------------------------------------ agents

    def put_agent(
        self,
        agent_id: str,
        *,
        priority: int | str | None = None,
        labels: Mapping[str, Any] | None = None,
    ) -> None:
        """Create or update an agent record.

        Args:
            agent_id: the agent's id.
            priority: stored as given; ``None`` keeps the current value (0 for a
                new agent).
            labels: JSON-serialisable labels replacing the current ones; ``None``
                keeps them (``{}`` for a new agent).

        Example:
            >>> with Archive(":memory:") as arc:
            ...     arc.put_agent("planner", priority="foreground", labels={"team": "a"})
            ...     arc.get_agent("planner").priority
            'foreground'
        """
        _check_agent_id(agent_id)
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, (int, str))):
            raise TypeError(f"priority must be an int or str, not {priority!r}")
        labels_json = None if labels is None else _json_dumps(dict(labels))
        now = time.time()
        with self._writing("put_agent") as db:
            db.execute(
                "INSERT INTO agents(id, priority, labels, created, updated) "
                "VALUES (?, coalesce(?, 0), coalesce(?, '{}'), ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET priority = coalesce(?, priority), "
                "labels = coalesce(?, labels), updated = excluded.updated",
                [agent_id, priority, labels_json, now, now, priority, labels_json],
            )

    _AGENT_SELECT = """
        SELECT a.id, a.priority, a.labels, a.created, a.updated,
               coalesce(l.n_tokens, 0),
               coalesce(l.n_bytes, 0),
               s.tier, s.codec, coalesce(s.n_tokens, 0), coalesce(s.n_bytes, 0)
        FROM agents a
        LEFT JOIN ledgers l ON l.agent_id = a.id
        LEFT JOIN states s ON s.agent_id = a.id
    """

    @staticmethod
    def _agent_from_row(row: Sequence[Any]) -> AgentRecord:
        return AgentRecord(
            agent_id=row[0],
            priority=row[1],
            labels=json.loads(row[2]),
            created=row[3],
            updated=row[4],
            ledger_tokens=row[5],
            ledger_bytes=row[6],
            tier=row[7],
            codec=row[8],
            state_tokens=row[9],
            state_bytes=row[10],
        )

    def get_agent(self, agent_id: str) -> AgentRecord | None:
        """The agent's record with ledger and state sizes, or ``None``."""
        with self._reading("get_agent") as db:
            row = db.execute(self._AGENT_SELECT + " WHERE a.id = ?", [agent_id]).fetchone()
        return None if row is None else self._agent_from_row(row)

    def list_agents(self) -> list[AgentRecord]:
        """Every agent, ordered by id, with tokens, tier, codec and bytes.

        Example:
            >>> with Archive(":memory:") as arc:
            ...     arc.put_agent("b"); arc.put_agent("a")
            ...     [r.agent_id for r in arc.list_agents()]
            ['a', 'b']
        """
        with self._reading("list_agents") as db:
            rows = db.execute(self._AGENT_SELECT + " ORDER BY a.id").fetchall()
        return [self._agent_from_row(r) for r in rows]

    def delete_agent(self, agent_id: str) -> bool:
        """Delete an agent with its ledger, state, evicted spans and events.

        Returns:
            Whether the agent existed.
        """
        with self._writing("delete_agent") as db:
            db.execute("DELETE FROM events WHERE agent_id = ?", [agent_id])
            cur = db.execute("DELETE FROM agents WHERE id = ?", [agent_id])
            return cur.rowcount > 0

    # ------------------------------------------------------------------ ledgers

    def put_ledger(
        self,
        agent_id: str,
        tokens: np.ndarray | Sequence[int],
        regions: Iterable[Region] | Iterable[Sequence[Any]],
        messages: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Store (replace) an agent's ledger; creates the agent record if needed.

        Args:
            agent_id: the agent's id.
            tokens: 1-D integer token ids (stored as int32 little-endian).
            regions: ``(start, end, region, flags)`` spans within ``tokens``.
            messages: the chat messages (JSON-serialisable dicts), or ``None``.

        Raises:
            ValueError, TypeError: malformed tokens, regions or messages.

        Example:
            >>> import numpy as np
            >>> with Archive(":memory:") as arc:
            ...     arc.put_ledger("a", np.array([1, 2, 3], np.int32), [(0, 3, "user", 0)],
            ...                    [{"role": "user", "content": "hi"}])
            ...     arc.get_ledger("a").regions
            [(0, 3, 'user', 0)]
        """
        _check_agent_id(agent_id)
        token_bytes, n_tokens = _tokens_to_bytes(tokens)
        regions_json = _json_dumps(_check_regions(regions, n_tokens))
        messages_json: str | None = None
        if messages is not None:
            try:
                messages_json = _json_dumps([dict(m) for m in messages])
            except (TypeError, ValueError) as exc:
                raise TypeError(f"messages of agent {agent_id!r} are not JSON-serialisable: {exc}") from exc
        n_bytes = (
            len(token_bytes)
            + len(regions_json.encode())
            + (len(messages_json.encode()) if messages_json is not None else 0)
        )
        now = time.time()
        with self._writing("put_ledger") as db:
            self._touch_agent(db, agent_id, now)
            db.table("ledgers").upsert(
                {
                    "agent_id": agent_id,
                    "n_tokens": n_tokens,
                    "n_bytes": n_bytes,
                    "updated": now,
                    "regions": regions_json,
                    "messages": messages_json,
                    "tokens": token_bytes,
                },
                pk="agent_id",
            )

    def get_ledger(self, agent_id: str) -> LedgerRecord | None:
        """The agent's ledger, or ``None`` if it has none.

        Raises:
            ArchiveError: the stored ledger is malformed.
        """
        row = self._row(
            "get_ledger", "SELECT tokens, regions, messages, n_tokens, updated FROM ledgers WHERE agent_id = ?", [agent_id]
        )
        if row is None:
            return None
        blob, regions_json, messages_json, n_tokens, updated = row
        if len(blob) != 4 * n_tokens:
            raise ArchiveError(
                f"{self.path}: ledger of agent {agent_id!r} is corrupt: {len(blob)} token bytes for {n_tokens} tokens"
            )
        try:
            regions = [(int(s), int(e), str(r), int(f)) for s, e, r, f in json.loads(regions_json)]
            messages = None if messages_json is None else json.loads(messages_json)
        except (TypeError, ValueError) as exc:
            raise ArchiveError(f"{self.path}: ledger of agent {agent_id!r} is corrupt: {exc}") from exc
        tokens = np.frombuffer(blob, dtype="<i4").astype(np.int32)
        return LedgerRecord(agent_id=agent_id, tokens=tokens, regions=regions, messages=messages, updated=updated)

    def delete_ledger(self, agent_id: str) -> bool:
        """Delete the agent's ledger; returns whether there was one."""
        with self._writing("delete_ledger") as db:
            return db.execute("DELETE FROM ledgers WHERE agent_id = ?", [agent_id]).rowcount > 0

    # ------------------------------------------------------------------ states

    def put_state(
        self,
        agent_id: str,
        blob: BlobLike,
        *,
        codec: str,
        n_tokens: int,
        fingerprint: Mapping[str, Any],
        tier: str = "cold",
        block_id: str | None = None,
        layout: BlobLike | None = None,
    ) -> StateInfo:
        """Store (replace) the agent's KV state with its checksum, in one transaction.

        The blob is written without an intermediate copy for ``bytes``,
        contiguous ``memoryview`` and numpy arrays; its SHA-256 costs about
        5 ms per 10 MB.

        Args:
            agent_id: the agent's id (created if needed).
            blob: the encoded state.
            codec: codec name the blob is encoded with.
            n_tokens: tokens the state covers.
            fingerprint: model and cache configuration (JSON-serialisable).
            tier: tier label to record.
            block_id: the shared block (see :meth:`put_shared_block`) the blob's
                missing cells are in; the block's refcount counts this state.
            layout: with ``block_id``, the order array that joins the two.

        Returns:
            The stored metadata.
        """
        if (block_id is None) != (layout is None):
            raise TypeError("block_id and layout go together")
        _check_agent_id(agent_id)
        if not isinstance(codec, str) or not codec:
            raise TypeError(f"codec must be a non-empty str, not {codec!r}")
        n_tokens = _check_count("n_tokens", n_tokens)
        fp = _normalise_fingerprint(fingerprint)
        buf = _as_buffer(blob)
        info = StateInfo(
            agent_id=agent_id,
            tier=tier,
            codec=codec,
            n_tokens=n_tokens,
            n_bytes=memoryview(buf).nbytes,
            checksum=checksum(buf),
            fingerprint=fp,
            created=time.time(),
        )
        with self._writing("put_state") as db:
            self._touch_agent(db, agent_id, info.created)
            db.execute(
                "INSERT INTO states(agent_id, tier, codec, n_tokens, n_bytes, checksum, "
                "fingerprint, blob, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(agent_id) DO UPDATE SET tier = excluded.tier, codec = excluded.codec, "
                "n_tokens = excluded.n_tokens, n_bytes = excluded.n_bytes, "
                "checksum = excluded.checksum, fingerprint = excluded.fingerprint, "
                "blob = excluded.blob, created = excluded.created",
                [agent_id, tier, codec, n_tokens, info.n_bytes, info.checksum, _json_dumps(fp), buf, info.created],
            )
            db.execute("DELETE FROM state_blocks WHERE agent_id = ?", [agent_id])
            db.execute("DELETE FROM state_checkpoints WHERE agent_id = ?", [agent_id])  # it belonged to the old state
            if block_id is not None:
                if db.execute("SELECT 1 FROM shared_blocks WHERE id = ?", [block_id]).fetchone() is None:
                    raise ArchiveError(f"{self.path}: no shared block {block_id!r} (put_shared_block first)")
                db.execute(
                    "INSERT INTO state_blocks(agent_id, block_id, layout) VALUES (?, ?, ?)",
                    [agent_id, block_id, _as_buffer(layout)],
                )
        return info

    _STATE_COLUMNS = "agent_id, tier, codec, n_tokens, n_bytes, checksum, fingerprint, created"

    def get_state_info(self, agent_id: str) -> StateInfo | None:
        """Metadata of the agent's state without reading the blob, or ``None``."""
        with self._reading("get_state_info") as db:
            row = db.execute(f"SELECT {self._STATE_COLUMNS} FROM states WHERE agent_id = ?", [agent_id]).fetchone()
        return None if row is None else self._state_info(row)

    def _state_info(self, row: Sequence[Any]) -> StateInfo:
        try:
            fp = json.loads(row[6])
        except ValueError:
            fp = {"_unparseable": row[6]}
        return StateInfo(
            agent_id=row[0],
            tier=row[1],
            codec=row[2],
            n_tokens=row[3],
            n_bytes=row[4],
            checksum=row[5],
            fingerprint=fp,
            created=row[7],
        )

    def get_state(self, agent_id: str, *, fingerprint: Mapping[str, Any] | None = None) -> StoredState | None:
        """The agent's state after verifying its length and checksum, or ``None``.

        Args:
            agent_id: the agent's id.
            fingerprint: when given, the stored fingerprint must equal it.

        Raises:
            CodecError: the blob is truncated, fails its checksum, or SQLite
                reports the page holding it as corrupt (a cache miss: re-prefill).
            FingerprintMismatch: ``fingerprint`` differs; the message names the keys.
        """
        try:
            with self._reading("get_state") as db:
                row = db.execute(
                    f"SELECT {self._STATE_COLUMNS}, blob FROM states WHERE agent_id = ?", [agent_id]
                ).fetchone()
        except ArchiveError as exc:
            cause = exc.__cause__
            if isinstance(cause, sqlite3.DatabaseError) and getattr(cause, "sqlite_errorname", "") in (
                "SQLITE_CORRUPT",
                "SQLITE_NOTADB",
            ):
                raise CodecError(f"{self.path}: state of agent {agent_id!r} is unreadable: {cause}") from cause
            raise
        if row is None:
            return None
        info = self._state_info(row)
        blob = row[8]
        if not isinstance(blob, bytes):
            raise CodecError(
                f"{self.path}: state of agent {agent_id!r} is corrupt: blob column holds "
                f"{type(blob).__name__}, not bytes"
            )
        if len(blob) != info.n_bytes:
            raise CodecError(
                f"{self.path}: state of agent {agent_id!r} is truncated: "
                f"{len(blob)} bytes stored, {info.n_bytes} expected"
            )
        actual = _verify_checksum(info.checksum, blob)
        if actual is not None:
            raise CodecError(
                f"{self.path}: state of agent {agent_id!r} is corrupt: checksum "
                f"{info.checksum[:23]}… stored, {actual[:23]}… computed"
            )
        if fingerprint is not None:
            self._check_fingerprint(agent_id, info.fingerprint, fingerprint)
        with self._reading("get_state") as db:
            ref = db.execute("SELECT block_id, layout FROM state_blocks WHERE agent_id = ?", [agent_id]).fetchone()
        return StoredState(
            **{f.name: getattr(info, f.name) for f in dataclasses.fields(info)},
            blob=blob,
            block_id=ref[0] if ref else None,
            layout=ref[1] if ref else None,
        )

    def _check_fingerprint(self, agent_id: str, stored: dict[str, Any], expected: Mapping[str, Any]) -> None:
        want = _normalise_fingerprint(expected)
        if stored == want:
            return
        keys = sorted(k for k in set(stored) | set(want) if stored.get(k) != want.get(k))
        detail = ", ".join(f"{k}: stored {stored.get(k)!r} != current {want.get(k)!r}" for k in keys[:6])
        raise FingerprintMismatch(f"{self.path}: state of agent {agent_id!r} belongs to another config ({detail})")

    def delete_state(self, agent_id: str) -> bool:
        """Delete the agent's state; returns whether there was one."""
        with self._writing("delete_state") as db:
            return db.execute("DELETE FROM states WHERE agent_id = ?", [agent_id]).rowcount > 0

    # ------------------------------------------------------------------ events

    def log_event(self, agent_id: str | None, kind: str, **data: Any) -> int:
        """Append an event; values that JSON cannot hold are stored as their repr.

        Returns:
            The event id.

        Example:
            >>> with Archive(":memory:") as arc:
            ...     _ = arc.log_event("coder", "demote", to="cold", codec="q8_0")
            ...     arc.events("coder")[0].data
            {'codec': 'q8_0', 'to': 'cold'}
        """
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"kind must be a non-empty str, not {kind!r}")
        payload = json.dumps(data, sort_keys=True, ensure_ascii=False, default=repr)
        with self._writing("log_event") as db:
            cur = db.execute(
                "INSERT INTO events(ts, agent_id, kind, data) VALUES (?, ?, ?, ?)",
                [time.time(), agent_id, kind, payload],
            )
            return int(cur.lastrowid or 0)

    def events(self, agent_id: str | None = None, *, kind: str | None = None, limit: int = 100) -> list[EventRecord]:
        """Recent events, newest first, optionally of one agent and/or kind."""
        where: list[str] = []
        params: list[Any] = []
        if agent_id is not None:
            where.append("agent_id = ?")
            params.append(agent_id)
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        sql = "SELECT id, ts, agent_id, kind, data FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(_check_count("limit", limit))
        with self._reading("events") as db:
            rows = db.execute(sql, params).fetchall()
        return [EventRecord(id=r[0], ts=r[1], agent_id=r[2], kind=r[3], data=json.loads(r[4])) for r in rows]

    def prune_events(self, keep_last: int) -> int:
        """Delete all but the newest ``keep_last`` events; returns how many went."""
        keep_last = _check_count("keep_last", keep_last)
        with self._writing("prune_events") as db:
            cur = db.execute(
                "DELETE FROM events WHERE id <= coalesce("
                "(SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?), -1)",
                [keep_last],
            )
            return cur.rowcount

    # ------------------------------------------------------------------ evicted text

    def add_evicted_span(self, agent_id: str, start: int, end: int, region: str, text: str) -> int:
        """Archive the text of one evicted span; returns its id.

        Example:
            >>> with Archive(":memory:") as arc:
            ...     _ = arc.add_evicted_span("a", 10, 42, "tool_result", "invoice total 1234 EUR")
            ...     [s.text for s in arc.search_evicted("a", "invoice?")]
            ['invoice total 1234 EUR']
        """
        return self.add_evicted_spans(agent_id, [(start, end, region, text)])[0]

    def add_evicted_spans(self, agent_id: str, spans: Iterable[tuple[int, int, str, str]]) -> list[int]:
        """Archive several evicted spans of one agent in one transaction; returns their ids."""
        _check_agent_id(agent_id)
        rows = []
        for start, end, region, text in spans:
            start, end = _check_count("start", start), _check_count("end", end)
            if end < start:
                raise ValueError(f"evicted span end {end} < start {start}")
            if not isinstance(region, str) or not isinstance(text, str):
                raise TypeError("region and text must be str")
            rows.append((start, end, region, text))
        now = time.time()
        ids: list[int] = []
        with self._writing("add_evicted_spans") as db:
            self._touch_agent(db, agent_id, now)
            for start, end, region, text in rows:
                cur = db.execute(
                    'INSERT INTO evicted_spans(agent_id, start, "end", region, text, ts) VALUES (?, ?, ?, ?, ?, ?)',
                    [agent_id, start, end, region, text, now],
                )
                ids.append(int(cur.lastrowid or 0))
        return ids

    _SPAN_COLUMNS = 's.id, s.agent_id, s.start, s."end", s.region, s.text, s.ts'

    def list_evicted(self, agent_id: str, *, limit: int | None = None) -> list[EvictedSpan]:
        """The agent's evicted spans, oldest first."""
        sql = f"SELECT {self._SPAN_COLUMNS}, 0.0 FROM evicted_spans s WHERE s.agent_id = ? ORDER BY s.id"
        params: list[Any] = [agent_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(_check_count("limit", limit))
        with self._reading("list_evicted") as db:
            return [EvictedSpan(*row) for row in db.execute(sql, params).fetchall()]

    def search_evicted(self, agent_id: str | None, query: str, k: int = 5) -> list[EvictedSpan]:
        """The ``k`` evicted spans best matching ``query``, best first.

        The query is reduced to its words, each matched literally and combined
        with OR, so any user text is safe (quotes, ``NEAR``, ``*``, ``-`` and
        other FTS5 syntax carry no meaning). Ranking is FTS5's BM25 with Porter
        stemming; without FTS5 it is the number of words found by a LIKE scan.

        Args:
            agent_id: restrict to one agent, or ``None`` for all agents.
            query: free text.
            k: maximum number of results.

        Returns:
            Spans with ``score`` set (higher is better); ``[]`` for a query
            without words.
        """
        k = _check_count("k", k)
        terms = _fts_terms(query if isinstance(query, str) else str(query))
        if not terms or k == 0:
            return []
        agent_sql, agent_params = ("", []) if agent_id is None else (" AND s.agent_id = ?", [agent_id])
        with self._reading("search_evicted") as db:
            if self._fts:
                match = " OR ".join(f'"{t}"' for t in terms)
                rows = db.execute(
                    f"SELECT {self._SPAN_COLUMNS}, -bm25(evicted_spans_fts) AS score "
                    "FROM evicted_spans_fts JOIN evicted_spans s ON s.id = evicted_spans_fts.rowid "
                    f"WHERE evicted_spans_fts MATCH ?{agent_sql} ORDER BY score DESC, s.id DESC LIMIT ?",
                    [match, *agent_params, k],
                ).fetchall()
            else:
                likes = ["%" + t.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for t in terms]
                hits = " + ".join("(s.text LIKE ? ESCAPE '\\')" for _ in likes)
                rows = db.execute(
                    f"SELECT * FROM (SELECT {self._SPAN_COLUMNS}, ({hits}) * 1.0 AS score "
                    f"FROM evicted_spans s WHERE 1{agent_sql}) WHERE score > 0 "
                    "ORDER BY score DESC, id DESC LIMIT ?",
                    [*likes, *agent_params, k],
                ).fetchall()
        return [EvictedSpan(*row) for row in rows]

    # ------------------------------------------------------------------ shared blocks

    def put_shared_block(
        self,
        block_id: str,
        blob: BlobLike,
        *,
        n_tokens: int,
        fingerprint: Mapping[str, Any],
    ) -> SharedBlockInfo:
        """Store a shared KV block; an existing block keeps its refcount.

        Example:
            >>> with Archive(":memory:") as arc:
            ...     _ = arc.put_shared_block("sys-prompt", b"kv", n_tokens=12, fingerprint={})
            ...     arc.incref_shared_block("sys-prompt"), arc.decref_shared_block("sys-prompt")
            (1, 0)
        """
        if not isinstance(block_id, str) or not block_id:
            raise TypeError(f"block_id must be a non-empty str, not {block_id!r}")
        n_tokens = _check_count("n_tokens", n_tokens)
        fp_json = _json_dumps(_normalise_fingerprint(fingerprint))
        buf = _as_buffer(blob)
        digest, n_bytes, now = checksum(buf), memoryview(buf).nbytes, time.time()
        with self._writing("put_shared_block") as db:
            db.execute(
                "INSERT INTO shared_blocks(id, refcount, n_tokens, n_bytes, checksum, fingerprint, "
                "blob, created, updated) VALUES (?, 0, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET n_tokens = excluded.n_tokens, "
                "n_bytes = excluded.n_bytes, checksum = excluded.checksum, "
                "fingerprint = excluded.fingerprint, blob = excluded.blob, updated = excluded.updated",
                [block_id, n_tokens, n_bytes, digest, fp_json, buf, now, now],
            )
            row = db.execute(f"SELECT {self._BLOCK_COLUMNS} FROM shared_blocks WHERE id = ?", [block_id]).fetchone()
        return self._block_info(row)

    _BLOCK_COLUMNS = "id, refcount, n_tokens, n_bytes, checksum, fingerprint, created, updated"

    @staticmethod
    def _block_info(row: Sequence[Any]) -> SharedBlockInfo:
        return SharedBlockInfo(
            block_id=row[0],
            refcount=row[1],
            n_tokens=row[2],
            n_bytes=row[3],
            checksum=row[4],
            fingerprint=json.loads(row[5]),
            created=row[6],
            updated=row[7],
        )

    def _change_refcount(self, block_id: str, delta: int, what: str) -> int:
        with self._writing(what) as db:
            row = db.execute("SELECT refcount FROM shared_blocks WHERE id = ?", [block_id]).fetchone()
            if row is None:
                raise ArchiveError(f"{self.path}: no shared block {block_id!r}")
            new = row[0] + delta
            if new < 0:
                raise ArchiveError(
                    f"{self.path}: shared block {block_id!r} has refcount {row[0]}; cannot drop {-delta} reference(s)"
                )
            db.execute("UPDATE shared_blocks SET refcount = ?, updated = ? WHERE id = ?", [new, time.time(), block_id])
            return int(new)

    def incref_shared_block(self, block_id: str, n: int = 1) -> int:
        """Add ``n`` references; returns the new count. Unknown id: ``ArchiveError``."""
        return self._change_refcount(block_id, _check_count("n", n), "incref_shared_block")

    def decref_shared_block(self, block_id: str, n: int = 1) -> int:
        """Drop ``n`` references; returns the new count, never below zero.

        Raises:
            ArchiveError: unknown id, or fewer than ``n`` references (nothing changes).
        """
        return self._change_refcount(block_id, -_check_count("n", n), "decref_shared_block")

    def get_shared_block(self, block_id: str) -> SharedBlock | None:
        """The verified block, or ``None``; ``CodecError`` if its checksum fails."""
        with self._reading("get_shared_block") as db:
            row = db.execute(
                f"SELECT {self._BLOCK_COLUMNS}, blob FROM shared_blocks WHERE id = ?", [block_id]
            ).fetchone()
        if row is None:
            return None
        info = self._block_info(row)
        blob = row[8]
        if not isinstance(blob, bytes):
            bad: str | None = f"blob column holds {type(blob).__name__}"
        elif len(blob) != info.n_bytes:
            bad = f"{len(blob)} bytes stored, {info.n_bytes} expected"
        else:
            computed = _verify_checksum(info.checksum, blob)
            bad = None if computed is None else f"checksum {computed[:23]}… computed"
        if bad is not None:
            raise CodecError(f"{self.path}: shared block {block_id!r} is corrupt: {bad}")
        return SharedBlock(**{f.name: getattr(info, f.name) for f in dataclasses.fields(info)}, blob=blob)

    def list_shared_blocks(self) -> list[SharedBlockInfo]:
        """Metadata of every shared block, by id."""
        with self._reading("list_shared_blocks") as db:
            rows = db.execute(f"SELECT {self._BLOCK_COLUMNS} FROM shared_blocks ORDER BY id").fetchall()
        return [self._block_info(r) for r in rows]

    def put_checkpoint(
        self, agent_id: str, blob: BlobLike, *, prompt_end: tuple[int, int], layout: BlobLike | None = None
    ) -> None:
        """Store the sliding-window checkpoint of the agent's stored state (after :meth:`put_state`).

        ``prompt_end`` is ``(history tokens, live tokens)`` at the prompt end the
        checkpoint was taken at; ``layout`` the order array when the blob was cut
        against the state's own sliding-window cells. A new ``put_state`` drops it.
        """
        buf = _as_buffer(blob)
        h, live = (_check_count("prompt_end", int(x)) for x in prompt_end)
        with self._writing("put_checkpoint") as db:
            if db.execute("SELECT 1 FROM states WHERE agent_id = ?", [agent_id]).fetchone() is None:
                raise ArchiveError(f"{self.path}: agent {agent_id!r} has no stored state to checkpoint")
            db.execute(
                "INSERT INTO state_checkpoints(agent_id, prompt_end_hist, prompt_end_live, checksum, layout, blob) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(agent_id) DO UPDATE SET prompt_end_hist = excluded.prompt_end_hist, "
                "prompt_end_live = excluded.prompt_end_live, checksum = excluded.checksum, layout = excluded.layout, "
                "blob = excluded.blob",
                [agent_id, h, live, checksum(buf), None if layout is None else _as_buffer(layout), buf],
            )

    def get_checkpoint(self, agent_id: str) -> tuple[bytes, bytes | None, tuple[int, int]] | None:
        """``(blob, layout, prompt_end)`` of the agent's checkpoint, or ``None``.

        Raises:
            CodecError: the blob fails its checksum.
        """
        row = self._row(
            "get_checkpoint",
            "SELECT prompt_end_hist, prompt_end_live, checksum, layout, blob FROM state_checkpoints WHERE agent_id = ?",
            [agent_id],
        )
        if row is None:
            return None
        bad = _verify_checksum(row[2], row[4]) if isinstance(row[4], bytes) else "not a blob"
        if bad is not None:
            raise CodecError(f"{self.path}: checkpoint of agent {agent_id!r} is corrupt")
        return row[4], row[3], (int(row[0]), int(row[1]))

    def checkpoint_prompt_ends(self) -> dict[str, tuple[int, int]]:
        """``{agent_id: (history tokens, live tokens)}`` of every stored checkpoint (no blobs read)."""
        with self._reading("checkpoint_prompt_ends") as db:
            rows = db.execute("SELECT agent_id, prompt_end_hist, prompt_end_live FROM state_checkpoints").fetchall()
        return {r[0]: (int(r[1]), int(r[2])) for r in rows}

    def has_shared_block(self, block_id: str) -> bool:
        """Whether the block is stored (without reading its blob)."""
        return self._row("has_shared_block", "SELECT 1 FROM shared_blocks WHERE id = ?", [block_id]) is not None

    def state_blocks(self) -> dict[str, str]:
        """``{agent_id: block_id}`` of every stored state that references a shared block."""
        with self._reading("state_blocks") as db:
            return dict(db.execute("SELECT agent_id, block_id FROM state_blocks").fetchall())

    def gc_shared_blocks(self) -> int:
        """Delete blocks with no references; returns how many were deleted."""
        with self._writing("gc_shared_blocks") as db:
            return db.execute("DELETE FROM shared_blocks WHERE refcount = 0").rowcount

    # ------------------------------------------------------------------ maintenance

    def _disk_bytes(self) -> tuple[int, int]:
        if self._memory:
            conn = self._require_conn()
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            return pages * conn.execute("PRAGMA page_size").fetchone()[0], 0
        wal = _file_size(self.path + "-wal")
        return _file_size(self.path) + wal, wal

    def stats(self) -> ArchiveStats:
        """Sizes and row counts; cheap (blob lengths come from record headers)."""
        with self._reading("stats") as db:
            conn = self._require_conn()
            tables = {}
            for name in _TABLES:
                rows, payload = db.execute(
                    f"SELECT count(*), coalesce(sum({_PAYLOAD_SQL[name]}), 0) FROM {name}"
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

        Not allowed inside :meth:`transaction`.

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
