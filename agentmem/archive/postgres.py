"""Opening a PostgreSQL archive: the shared backend of the archive core (psycopg 3).

`PostgresConnection` connects to a `postgresql://` URL, opens or migrates the
schema (`pg_schema`) under an advisory lock so replicas starting together
migrate once, and fills in the hooks of `ArchiveCore`: `?` placeholders become
psycopg's `%s`, transactions are psycopg transactions (savepoints when nested),
row locks are `FOR UPDATE` / `FOR SHARE`, the lease clock is the server's
`clock_timestamp()`, evicted text is searched with a `tsvector`, and span
vectors with pgvector's HNSW index where the database has the extension
(`PgVectorMixin`; exact numpy search where it has not).

Concurrency: unlike the SQLite file, many processes (replicas) may open one
database at once; each `PostgresArchive` holds one connection, used by one
thread at a time (the core's lock). Writes that change refcounts or leases lock
the rows they read, so concurrent replicas queue instead of losing updates.

The URL is a secret: `path`, messages and logs show it with the password
replaced by `***` (`redact_url`).

A connection the server dropped (a restart, a failover, an idle timeout) fails
the call that finds out with `ArchiveError`; the next call outside a
transaction reconnects, so a replica outlives a database restart.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from agentmem.archive import schema
from agentmem.archive.core import ArchiveCore
from agentmem.archive.pg_schema import PG_MIGRATIONS
from agentmem.archive.pgvector import PgVectorMixin
from agentmem.archive.values import SPAN_COLUMNS
from agentmem.errors import ArchiveError

__all__ = ["PostgresConnection", "is_postgres_url", "redact_url"]

logger = logging.getLogger(__name__)

_SCHEMES = ("postgresql://", "postgres://")
_MIGRATION_LOCK = 0x61676D6D  # "agmm": advisory lock key (with the schema's hash) taken while migrating


def is_postgres_url(target: object) -> bool:
    """Whether `target` is a `postgresql://` (or `postgres://`) URL."""
    return isinstance(target, str) and target.lower().startswith(_SCHEMES)


def redact_url(url: str) -> str:
    """`url` with its password (in the netloc or a `password=` parameter) replaced by `***`.

    Examples:
        >>> redact_url("postgresql://app:s3cret@db:5432/agents?sslmode=require&password=x")
        'postgresql://app:***@db:5432/agents?sslmode=require&password=%2A%2A%2A'
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.split(':', 1)[0]}:***@{host}"
        query = parts.query
        if "password" in query.lower():
            query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in parse_qsl(query)])
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "postgresql://(unparseable URL)"


@functools.lru_cache(maxsize=512)
def _pg_sql(sql: str) -> str:
    """The core's `?` placeholders as psycopg's `%s` (literal `%` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _PgDB:
    """What the mixins call `db`: `execute(sql, params)` with `?` placeholders, binary results."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(_pg_sql(sql), list(params), binary=True)


class PostgresConnection(PgVectorMixin, ArchiveCore):
    """The open database under a `PostgresArchive`: connection, schema and the PostgreSQL hooks.

    Not used on its own: `PostgresArchive` (in `agentmem.archive.store`) adds the
    reads and writes and documents the constructor's arguments.
    """

    _FOR_UPDATE: ClassVar[str] = " FOR UPDATE"
    _FOR_SHARE: ClassVar[str] = " FOR SHARE"
    _PRIORITY_DEFAULT: ClassVar[Any] = "0"
    _SHARED_WRITERS: ClassVar[bool] = True

    def __init__(
        self, url: str, *, readonly: bool = False, connect_timeout_s: float = 10.0, application_name: str = "agentmem"
    ) -> None:
        if not is_postgres_url(url):
            raise ArchiveError(f"{redact_url(str(url))}: not a postgresql:// URL")
        self.path = redact_url(url)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._conn: Any = None
        self._db: _PgDB | None = None
        try:
            import psycopg
        except ImportError as exc:
            raise ArchiveError(
                f'{self.path}: the PostgreSQL archive needs psycopg 3: pip install "agentmem-kv[postgres]"'
            ) from exc
        self._DRIVER_ERRORS = (psycopg.Error,)  # type: ignore[misc]
        self._connect_args = (url, max(1, round(connect_timeout_s)), application_name)  # the URL: never logged
        self._connect()
        try:
            self._open_schema()
        except BaseException:
            self.close()
            raise
        logger.debug("opened archive %s (schema v%d, %s)", self.path, self._schema_version,
                     "readonly" if readonly else "read-write")

    def _connect(self) -> None:
        import psycopg

        url, timeout, name = self._connect_args
        try:
            self._conn = psycopg.connect(url, autocommit=True, connect_timeout=timeout, application_name=name)
        except psycopg.Error as exc:
            raise ArchiveError(f"{self.path}: cannot connect: {exc}") from exc
        self._db = _PgDB(self._conn)

    # ------------------------------------------------------------------ lifecycle

    @property
    def closed(self) -> bool:
        """Whether `close` has run."""
        return self._conn is None

    @property
    def fts_enabled(self) -> bool:
        """Always true: evicted text is searched through a `tsvector` with a GIN index."""
        return True

    def close(self) -> None:
        """Close the connection; safe to call twice. An open `transaction` is rolled back."""
        with self._lock:
            conn, self._conn, self._db = self._conn, None, None
            if conn is not None:
                try:
                    conn.close()
                except Exception as exc:  # noqa: BLE001 - pragma: no cover - close rarely fails
                    logger.warning("closing archive %s: %s", self.path, exc)

    def _open_schema(self) -> None:
        db = self._require_db()
        try:
            version = self._read_version(db)
            if schema.needs_migration(self.path, version, readonly=self.readonly):
                version = self._migrate(db, schema.SCHEMA_VERSION)
            self._schema_version = version
            self._open_ann(self._conn)
        except self._DRIVER_ERRORS as exc:
            raise ArchiveError(f"{self.path}: cannot open the schema: {exc}") from exc
        self._schema_version = version

    def _read_version(self, db: _PgDB) -> int:
        current = db.execute("SELECT current_schema()").fetchone()[0]
        if current is None:
            raise ArchiveError(f"{self.path}: the search_path names no existing schema")
        tables = {
            r[0]
            for r in db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            ).fetchall()
        }
        if "meta" not in tables:
            if tables:
                raise ArchiveError(
                    f"{self.path}: a PostgreSQL schema ({current}) but not an agentmem archive "
                    f"(tables: {', '.join(sorted(tables))})"
                )
            return 0
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or not str(row[0]).isdigit():
            raise ArchiveError(f"{self.path}: meta table has no valid schema_version ({row!r})")
        return int(row[0])

    def _migrate(self, db: _PgDB, newest: int) -> int:
        """Apply the missing steps, each committed with its version; replicas wait on an advisory lock."""
        version = 0
        for step in range(newest):
            name, script = PG_MIGRATIONS[step]
            with self._conn.transaction():
                db.execute("SELECT pg_advisory_xact_lock(?, hashtext(current_schema()))", [_MIGRATION_LOCK])
                version = self._read_version(db)  # another replica may have migrated meanwhile
                if version > step:
                    continue
                try:
                    with self._conn.transaction():
                        self._conn.execute(script)
                        db.execute(
                            "INSERT INTO meta(key, value) VALUES ('schema_version', ?) "
                            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                            [str(step + 1)],
                        )
                        if step == 0:
                            db.execute(
                                "INSERT INTO meta(key, value) VALUES ('application', 'agentmem'), "
                                "('created', extract(epoch FROM clock_timestamp())::text)"
                            )
                except self._DRIVER_ERRORS as exc:
                    raise ArchiveError(
                        f"{self.path}: migration {name} (version {step} -> {step + 1}) failed: {exc}"
                    ) from exc
                version = step + 1
            logger.info("%s: migrated schema to version %d (%s)", self.path, step + 1, name)
        return version

    # ------------------------------------------------------------------ the core's hooks

    def _require_db(self) -> _PgDB:
        if self._db is None:
            raise ArchiveError(f"{self.path}: archive is closed")
        if self._conn.broken and not self._tx_depth:  # dropped by the server: reconnect between transactions
            logger.warning("%s: the connection was lost; reconnecting", self.path)
            old = self._conn
            self._connect()
            old.close()
        return self._db

    def _atomic(self, db: _PgDB) -> contextlib.AbstractContextManager[Any]:
        return db.conn.transaction()

    def _now(self, db: _PgDB) -> float:
        """The lease clock: the database server's, shared by every replica."""
        return float(db.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0])

    def _span_text_in(self, text: str) -> str:
        """NUL as a space: `text` cannot hold NUL, detokenized model output may contain it, and as a
        separator (as FTS5 reads it) the words on either side stay searchable."""
        return text.replace("\x00", " ") if "\x00" in text else text

    def _priority_in(self, priority: int | str | None) -> str | None:
        return None if priority is None else json.dumps(priority, ensure_ascii=False)

    def _priority_out(self, stored: Any) -> int | str:
        try:
            value = json.loads(stored)
        except (TypeError, ValueError):
            return stored
        return value if isinstance(value, (int, str)) and not isinstance(value, bool) else stored

    def _search(self, db: _PgDB, agent_id: str | None, terms: list[str], k: int) -> list[Sequence[Any]]:
        """`tsvector @@ tsquery` (the words OR-ed, English stemming), ranked by `ts_rank`."""
        query = " || ".join("plainto_tsquery('english', ?)" for _ in terms)
        agent_sql, agent_params = ("", []) if agent_id is None else (" AND s.agent_id = ?", [agent_id])
        return db.execute(
            f"SELECT {SPAN_COLUMNS}, ts_rank(s.tsv, q.q)::float8 AS score "
            f"FROM evicted_spans s, (SELECT {query} AS q) q "
            f"WHERE s.tsv @@ q.q{agent_sql} ORDER BY score DESC, s.id DESC LIMIT ?",
            [*terms, *agent_params, k],
        ).fetchall()
