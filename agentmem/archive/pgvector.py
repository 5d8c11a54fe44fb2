"""pgvector on the PostgreSQL archive: span vectors in a `vector` column, searched through HNSW.

When the database has the `vector` extension, or lets the archive create it
(`CREATE EXTENSION IF NOT EXISTS vector`), `span_vectors` gains an `embedding`
column beside the portable `vec` blob, every write fills both (in the span's
transaction), and each embedder gets a partial HNSW index on its own dimension:

    CREATE INDEX span_vectors_hnsw_<hash> ON span_vectors
        USING hnsw ((embedding::vector(384)) vector_cosine_ops) WHERE model = 'minilm-l6-v2'

(pgvector's way of indexing vectors of several dimensions in one column). A search
is one query, `ORDER BY embedding::vector(d) <=> $q LIMIT k`, with the agent (and
tenant) filter in its `WHERE`: a stranger's span can never come back, whatever plan
the server picks. `hnsw.iterative_scan = strict_order` (pgvector >= 0.8) lets the
index scan go on until `k` rows pass that filter; with an older pgvector a scan that
returns fewer than `k` rows is redone exactly.

Where the extension is absent and cannot be created (Debian's PostgreSQL, a role
without the right), the archive logs it once at INFO and searches exactly as on
SQLite: `vec` blobs scored in numpy. `vector_search` names the path in use. The
extra column changes no schema version: an archive migrated here stays readable by
agentmem versions that only know `vec`, and one opened later by a server with
pgvector gets its column, its missing embeddings and its indexes then.

Names of the extension's type and operators are schema-qualified, so the archive
works whatever schema the extension lives in and whatever `search_path` it runs under.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentmem.archive.core import ArchiveCore

__all__ = ["PgVectorMixin", "PGVECTOR_PATH", "EXACT_PATH"]

logger = logging.getLogger(__name__)

PGVECTOR_PATH = "pgvector-hnsw"
"""`vector_search` where pgvector's HNSW index answers."""
EXACT_PATH = "exact-numpy"
"""`vector_search` where the vectors are scored in numpy (SQLite, PostgreSQL without pgvector)."""
_BACKFILL_ROWS = 1000
_fallback_logged = False


@dataclass(frozen=True)
class _Ann:
    """The extension as this archive uses it: its schema (quoted) and version."""

    schema: str
    version: str


def _vec_text(row: np.ndarray) -> str:
    """pgvector's text input, `[x,y,...]`, each float32 exactly (`repr` of its float64 value)."""
    return "[" + ",".join(map(repr, row.astype(np.float64).tolist())) + "]"


def _version(text: str) -> tuple[int, ...]:
    """`"0.8.5"` as `(0, 8, 5)` (non-numeric parts as 0)."""
    return tuple(int(p) if p.isdigit() else 0 for p in text.split("."))


def index_name(model: str, dim: int) -> str:
    """The HNSW index of `model`'s `dim`-d vectors (a hash: model names may hold any character)."""
    return "span_vectors_hnsw_" + hashlib.sha1(f"{model}\x00{dim}".encode()).hexdigest()[:16]


class PgVectorMixin(ArchiveCore):
    """The pgvector path of `PostgresArchive` (a part of `PostgresConnection`)."""

    _ann: _Ann | None = None
    _ann_dims: dict[str, int]
    _ann_indexed: set[tuple[str, int]]

    def _ann_path(self) -> str:
        return PGVECTOR_PATH if self._ann is not None else EXACT_PATH

    def _open_ann(self, conn: Any) -> None:
        """Find (or create) pgvector, add and fill the `embedding` column, index each embedder's vectors."""
        global _fallback_logged
        self._ann, self._ann_dims, self._ann_indexed = None, {}, set()
        if self._schema_version < 6:
            return
        ann = self._find_extension(conn)
        if ann is None and not self.readonly:
            try:
                with conn.transaction():
                    self._setup_lock(conn, "extension")  # replicas starting together create it once
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except self._DRIVER_ERRORS as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                if not _fallback_logged:
                    logger.info("%s: pgvector is not available (%s); span vectors are searched exactly in numpy",
                                self.path, reason)
                    _fallback_logged = True
                return
            ann = self._find_extension(conn)
        if ann is None:
            return
        if not self._has_embedding_column(conn):
            if self.readonly:
                return
            with conn.transaction():
                self._setup_lock(conn, "column")
                conn.execute(f"ALTER TABLE span_vectors ADD COLUMN IF NOT EXISTS embedding {ann.schema}.vector")
        self._ann = ann
        if not self.readonly:
            self._ann_backfill(conn)
        logger.info("%s: span vectors are searched with pgvector %s (HNSW)", self.path, ann.version)

    def _setup_lock(self, conn: Any, what: str) -> None:
        """Serialise a set-up step (`what`) of this schema across replicas until the transaction ends."""
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('agentmem pgvector ' || %s), hashtext(current_schema()))",
                     [what])

    def _find_extension(self, conn: Any) -> _Ann | None:
        row = conn.execute(
            "SELECT quote_ident(n.nspname), e.extversion FROM pg_extension e "
            "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
        ).fetchone()
        return None if row is None else _Ann(schema=str(row[0]), version=str(row[1]))

    def _has_embedding_column(self, conn: Any) -> bool:
        return conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = 'span_vectors' AND column_name = 'embedding'"
        ).fetchone() is not None

    def _ann_backfill(self, conn: Any) -> None:
        """Fill `embedding` from `vec` where an older agentmem (or a server without pgvector) left it empty."""
        filled = 0
        while True:
            with conn.transaction():
                rows = conn.execute(
                    "SELECT span_id, model, vec FROM span_vectors WHERE embedding IS NULL "
                    "ORDER BY span_id LIMIT %s FOR UPDATE", [_BACKFILL_ROWS]
                ).fetchall()
                for span_id, model, vec in rows:
                    row = np.frombuffer(bytes(vec), dtype="<f4")
                    conn.execute(f"UPDATE span_vectors SET embedding = %s::{self._ann.schema}.vector "
                                 "WHERE span_id = %s", [_vec_text(row), span_id])
                    self._ann_index(conn, str(model), row.size)
            filled += len(rows)
            if len(rows) < _BACKFILL_ROWS:
                break
        if filled:
            logger.info("%s: %d span vector(s) copied into the pgvector column", self.path, filled)

    def _ann_index(self, conn: Any, model: str, dim: int) -> None:
        """Create `model`'s HNSW index on `dim`-d vectors unless it exists (once per process and model)."""
        if (model, dim) in self._ann_indexed:
            return
        from psycopg import sql

        s = self._ann.schema
        self._setup_lock(conn, index_name(model, dim))  # two replicas' first vectors of a new embedder: one index
        conn.execute(sql.SQL(
            "CREATE INDEX IF NOT EXISTS {name} ON span_vectors USING hnsw "
            "((embedding::{s}.vector({dim})) {s}.vector_cosine_ops) WHERE model = {model}"
        ).format(name=sql.Identifier(index_name(model, dim)), s=sql.SQL(s), dim=sql.Literal(dim),
                 model=sql.Literal(model)))
        self._ann_indexed.add((model, dim))
        self._ann_dims[model] = dim

    def _ann_prepare(self, model: str, dim: int) -> None:
        """Create `model`'s index in a transaction of its own, before the write that needs it.

        Inside the write, `CREATE INDEX` (which waits for every open writer of the table)
        and another replica's write (holding the table, waiting for the index's lock)
        would deadlock. Inside a caller's `transaction` it is created there after all.
        """
        if self._ann is None or (model, dim) in self._ann_indexed or self.readonly:
            return
        with self._reading("create the pgvector index") as db:
            if self._tx_depth:
                return
            with db.conn.transaction():
                self._ann_index(db.conn, model, dim)

    def _ann_write(self, db: Any, ids: Sequence[int], vectors: np.ndarray, model: str) -> None:
        """Fill `embedding` of the rows just written to `vec` (same transaction)."""
        if self._ann is None or not len(ids):
            return
        self._ann_index(db.conn, model, int(vectors.shape[1]))
        with db.conn.cursor() as cur:
            cur.executemany(f"UPDATE span_vectors SET embedding = %s::{self._ann.schema}.vector WHERE span_id = %s",
                            [(_vec_text(row), int(i)) for i, row in zip(ids, vectors)])

    def _ann_search(self, db: Any, agent_id: str | None, tenant: str | None, q: np.ndarray, k: int,
                    model: str) -> list[tuple[int, float]] | None:
        """`(span_id, cosine)` of the `k` nearest vectors through HNSW; `None` where pgvector is not in use."""
        if self._ann is None:
            return None
        conn = db.conn
        dim = self._ann_dims.get(model)
        if dim is None:
            row = conn.execute("SELECT octet_length(vec) / 4 FROM span_vectors WHERE model = %s LIMIT 1",
                               [model]).fetchone()
            if row is None:
                return []
            dim = self._ann_dims.setdefault(model, int(row[0]))
        if dim != q.size:
            return None  # the exact path names the mismatch
        query, params = self.ann_query(agent_id, tenant, q, k, model)
        iterative = _version(self._ann.version) >= (0, 8)
        with conn.transaction():
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", [str(min(1000, max(40, k)))])
            if iterative:  # an older pgvector reserves the `hnsw.` prefix without this setting: setting it fails
                conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
            rows = conn.execute(query, params).fetchall()
        if not iterative and len(rows) < k:
            return None  # the filter may have dropped rows the one scan found: search exactly
        return [(int(r[0]), float(r[1])) for r in rows]

    def ann_query(self, agent_id: str | None, tenant: str | None, q: np.ndarray, k: int,
                  model: str) -> tuple[Any, list[Any]]:
        """The HNSW search as SQL and parameters (public so tests and operators can `EXPLAIN` it).

        The agent and tenant filters are in the `WHERE`; the model is a literal so the
        planner can match the partial index.
        """
        from psycopg import sql

        s, dim = self._ann.schema, int(q.size)
        where, params = [], []
        if agent_id is not None:
            where.append("v.agent_id = %s")
            params.append(agent_id)
        if tenant:
            where.append("substr(v.agent_id, 1, %s) = %s")
            params += [len(tenant), tenant]
        dist = "(v.embedding::{s}.vector({dim}) OPERATOR({s}.<=>) %s::{s}.vector)"
        query = sql.SQL(
            "SELECT v.span_id, 1 - " + dist + " FROM span_vectors v WHERE v.model = {model}"
            + "".join(f" AND {w}" for w in where) + " ORDER BY " + dist + " LIMIT %s"
        ).format(s=sql.SQL(s), dim=sql.Literal(dim), model=sql.Literal(model))
        text = _vec_text(q)
        return query, [text, *params, text, k]
