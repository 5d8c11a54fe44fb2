"""Opening a SQLite archive file: the SQLite backend of the archive core.

`ArchiveConnection` checks the path, takes the file lock, sets WAL and the other
pragmas, opens or migrates the schema, sets up full-text search (FTS5, or a LIKE
scan without it) and fills in the hooks of `ArchiveCore` (`agentmem.archive.core`),
which holds the locked reading/writing helpers, `transaction` and fencing.

Concurrency: one writer per file. A writable archive takes an exclusive advisory
lock (`flock` on `<path>-lock`, symlinks resolved) for as long as it is open, so a
second writer -- another pool, another process, a second `Archive` in the same
process, or one that names the file through a symlink -- fails at once with
`ArchiveError("… is in use by pid N …")`. Readers (`readonly=True`, used by
`agentmem archive ls`) take no lock and see consistent snapshots thanks
to WAL, so they work while a pool is running.

Durability: `synchronous=NORMAL` in WAL mode (the default) never corrupts the file
and loses no committed transaction when the *process* dies (SIGKILL, OOM); a
power cut may drop the last few commits, which is acceptable for a cache whose
ledger the application can resend. Pass `synchronous="FULL"` to fsync every
commit. Every blob carries a SHA-256 checksum written in the same transaction and
verified on read; a mismatch raises `CodecError`, which callers treat as a cache
miss.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from sqlite_utils import Database

from agentmem.archive import schema
from agentmem.archive.core import ArchiveCore
from agentmem.archive.postgres import is_postgres_url, redact_url
from agentmem.archive.values import SPAN_COLUMNS, checksum
from agentmem.errors import ArchiveError

try:  # POSIX only; elsewhere the archive opens without the cross-process lock
    import fcntl
except ImportError:  # pragma: no cover - exercised on Windows only
    fcntl = None  # type: ignore[assignment]

__all__ = ["ArchiveConnection", "checksum"]

logger = logging.getLogger(__name__)

_BUSY_TIMEOUT_MS = 5_000
_WAL_SIZE_LIMIT = 64 * 1024 * 1024  # truncate the WAL back to this after checkpoints


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


class ArchiveConnection(ArchiveCore):
    """The open SQLite file under an `Archive`: lifecycle, lock, schema and the SQLite hooks.

    Not used on its own: `Archive` (in `agentmem.archive.store`) adds the reads
    and writes by kind of data and documents the constructor's arguments.
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
        if is_postgres_url(path):
            raise ArchiveError(
                f"{redact_url(str(path))}: a PostgreSQL URL, not a SQLite file: use open_archive() or PostgresArchive"
            )
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
        except (UnicodeDecodeError, sqlite3.Error) as exc:  # a corrupt schema read outside the steps' own checks
            self.close()
            if isinstance(exc, UnicodeDecodeError) or "decode to UTF-8" in str(exc):
                raise ArchiveError(f"{self.path}: file is corrupt (its schema holds bytes that are not UTF-8)") from exc
            raise ArchiveError(f"{self.path}: cannot open: {exc}") from exc
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
        """The advisory lock file a writable archive holds: `<real path>-lock`.

        Keyed on the file itself (symlinks of the file or its directories
        resolved), so two openers of one file through different names take the
        same lock.
        """
        return os.path.realpath(self.path) + "-lock"

    @property
    def closed(self) -> bool:
        """Whether `close` has run."""
        return self._conn is None

    @property
    def fts_enabled(self) -> bool:
        """Whether `search_evicted` uses FTS5 (else a LIKE scan)."""
        return self._fts

    def close(self) -> None:
        """Close the connection and release the lock; safe to call twice.

        An open `transaction` is rolled back.
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
        if schema.needs_migration(self.path, version, readonly=self.readonly):
            schema.migrate(db, self.path, version)
            version = schema.SCHEMA_VERSION  # read at call time: tests stand in other migrations
        self._schema_version = version

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

    # ------------------------------------------------------------------ the core's hooks

    # UnicodeDecodeError: a text value (or an error message quoting the schema) with bytes that are not UTF-8
    _DRIVER_ERRORS: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.Error, UnicodeDecodeError)

    def _atomic(self, db: Database) -> contextlib.AbstractContextManager[Any]:
        return db.atomic()

    def _now(self, db: Database) -> float:
        """The lease clock: this process's (one writer per file, so one clock)."""
        return time.time()

    def _search(self, db: Database, agent_id: str | None, terms: list[str], k: int) -> list[Sequence[Any]]:
        """FTS5 with BM25 (`score = -bm25`) over `porter unicode61`, or a LIKE scan ranked by words found."""
        agent_sql, agent_params = ("", []) if agent_id is None else (" AND s.agent_id = ?", [agent_id])
        if self._fts:
            match = " OR ".join(f'"{t}"' for t in terms)
            return db.execute(
                f"SELECT {SPAN_COLUMNS}, -bm25(evicted_spans_fts) AS score "
                "FROM evicted_spans_fts JOIN evicted_spans s ON s.id = evicted_spans_fts.rowid "
                f"WHERE evicted_spans_fts MATCH ?{agent_sql} ORDER BY score DESC, s.id DESC LIMIT ?",
                [match, *agent_params, k],
            ).fetchall()
        likes = ["%" + t.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for t in terms]
        hits = " + ".join("(s.text LIKE ? ESCAPE '\\')" for _ in likes)
        return db.execute(
            f"SELECT * FROM (SELECT {SPAN_COLUMNS}, ({hits}) * 1.0 AS score "
            f"FROM evicted_spans s WHERE 1{agent_sql}) WHERE score > 0 "
            "ORDER BY score DESC, id DESC LIMIT ?",
            [*likes, *agent_params, k],
        ).fetchall()
