"""Embedding vectors of evicted text, beside the spans, and their exact cosine search.

`VectorsMixin` adds to `Archive` the `span_vectors` table: one unit vector per evicted
span (float32, little-endian, in a BLOB / `bytea`), tagged with the embedder's name so
vectors of two embedders never meet in one search. `add_evicted_spans(..., vectors=...)`
writes them in the span's own transaction; `add_span_vectors` fills in spans archived
without one (an older file, an embedder configured later).

Three paths, best first (`vector_search` names the archive's, `vector_stats` counts them):

* a hot partition: the agent's vectors already in RAM (`HotVectors`, recent and pinned
  agents, byte-bounded LRU, dropped on every write and on `delete_agent`), scored in
  numpy with no vector read from the database; a cold agent's are read once and kept;
* pgvector's HNSW index on a PostgreSQL archive whose database has the extension
  (`agentmem.archive.pgvector`), for a tenant-wide search or an agent too big for RAM;
* exact: the agent's (or tenant's) vectors selected in SQL and scored in one numpy
  matrix product. Neither `sqlite-vec` (Python's `sqlite3` here is built without
  extension loading) nor pgvector is needed; a few thousand spans per agent take
  well under a millisecond to score (`benchmarks/recall.py` measures it).

Every path filters by agent and tenant in SQL (a hot partition holds one agent's rows).

>>> import numpy as np
>>> from agentmem.archive import Archive
>>> with Archive(":memory:") as arc:
...     v = np.eye(3, dtype=np.float32)
...     _ = arc.add_evicted_spans("a", [(0, 4, "user", "red"), (4, 8, "user", "green"), (8, 9, "user", "blue")],
...                               vectors=v, model="toy")
...     [(s.text, round(s.score, 2)) for s in arc.search_vectors("a", np.array([0, 0.6, 0.8]), k=2, model="toy")]
[('blue', 0.8), ('green', 0.6)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agentmem.archive.core import ArchiveCore
from agentmem.archive.hotvectors import HotVectors
from agentmem.archive.records import EvictedSpan, Lease
from agentmem.archive.values import SPAN_COLUMNS, _check_agent_id, _check_count, _check_text
from agentmem.errors import ConfigError

__all__ = ["VectorsMixin", "unit_rows"]


def unit_rows(vectors: Any, *, n: int | None = None, field: str = "vectors") -> np.ndarray:
    """`vectors` as a C-contiguous float32 matrix of unit rows (`n` rows when given).

    Raises:
        ConfigError: not a 2-D finite matrix (of `n` rows), or a row of zeros.
    """
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] == 0 or (n is not None and arr.shape[0] != n):
        want = f"{n} rows" if n is not None else "rows"
        raise ConfigError(f"{field} must be a 2-D matrix of {want}, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ConfigError(f"{field} holds NaN or infinity")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ConfigError(f"{field} holds a zero vector (no direction to compare)")
    return np.ascontiguousarray(arr / norms, dtype="<f4")


def _scope_sql(agent_id: str | None, tenant: str | None) -> tuple[str, list[Any]]:
    """SQL conditions on `v.agent_id` for one agent and/or one tenant's id prefix."""
    if agent_id is None and tenant is None:
        raise ConfigError("a vector search needs agent_id or tenant (it never spans every agent)")
    sql, params = "", []
    if agent_id is not None:
        sql += " AND v.agent_id = ?"
        params.append(agent_id)
    if tenant:
        sql += " AND substr(v.agent_id, 1, ?) = ?"
        params += [len(tenant), tenant]
    return sql, params


class VectorsMixin(ArchiveCore):
    """Span vectors and their cosine search (part of `Archive`)."""

    def _write_vectors(self, db: Any, agent_id: str, ids: Sequence[int], vectors: np.ndarray, model: str) -> None:
        """Insert (or replace) one vector per span id, inside the caller's transaction."""
        for span_id, row in zip(ids, vectors):
            db.execute(
                "INSERT INTO span_vectors(span_id, agent_id, model, vec) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(span_id) DO UPDATE SET model = excluded.model, vec = excluded.vec",
                [int(span_id), agent_id, model, row.tobytes()],
            )
        self._ann_write(db, ids, vectors, model)
        self._vectors_changed(agent_id)

    def _vectors_changed(self, agent_id: str) -> None:
        self.hot_vectors.invalidate(agent_id)

    @property
    def hot_vectors(self) -> HotVectors:
        """The hot partitions in RAM (created on first use; `resize(max_bytes=0)` turns them off)."""
        hot = self.__dict__.get("_hot_vectors")
        if hot is None:
            hot = self.__dict__.setdefault("_hot_vectors", HotVectors())
        return hot

    @property
    def vector_search(self) -> str:
        """How span vectors are searched beyond RAM: `"pgvector-hnsw"` or `"exact-numpy"`."""
        return self._ann_path()

    def pin_vectors(self, agent_id: str, pinned: bool = True) -> None:
        """Keep `agent_id`'s vectors in RAM ahead of other agents' once searched (`pinned=False` unpins)."""
        _check_agent_id(agent_id)
        self.hot_vectors.pin(agent_id, pinned)

    def vector_stats(self) -> dict[str, Any]:
        """`vector_search` (the path) and the hot partitions' `hot_hits`, `hot_misses`, `hot_bytes`, ..."""
        return {"vector_search": self.vector_search,
                **{f"hot_{key}": value for key, value in self.hot_vectors.stats().items()}}

    def add_span_vectors(
        self, agent_id: str, ids: Sequence[int], vectors: Any, *, model: str, fence: Lease | None = None
    ) -> int:
        """Store vectors for spans of `agent_id` already archived (ids from `spans_without_vectors`).

        A span of another agent, or one deleted meanwhile, is skipped.

        Returns:
            How many vectors were written.
        """
        _check_agent_id(agent_id)
        _check_text("model", model)
        mat = unit_rows(vectors, n=len(ids))
        self._ann_prepare(model, int(mat.shape[1]))
        with self._writing("add_span_vectors", fence=fence, agent_id=agent_id) as db:
            rows = db.execute(
                f"SELECT id FROM evicted_spans WHERE agent_id = ? AND id IN ({', '.join('?' * len(ids))})",
                [agent_id, *map(int, ids)],
            ).fetchall() if ids else []
            mine = {int(r[0]) for r in rows}
            keep = [i for i, span_id in enumerate(ids) if int(span_id) in mine]
            self._write_vectors(db, agent_id, [ids[i] for i in keep], mat[keep], model)
        return len(keep)

    def spans_without_vectors(self, agent_id: str, *, model: str, limit: int = 256) -> list[tuple[int, str]]:
        """`(id, text)` of the agent's spans that have no vector of `model`, oldest first."""
        with self._reading("spans_without_vectors") as db:
            rows = db.execute(
                "SELECT s.id, s.text FROM evicted_spans s LEFT JOIN span_vectors v "
                "ON v.span_id = s.id AND v.model = ? WHERE s.agent_id = ? AND v.span_id IS NULL "
                "ORDER BY s.id LIMIT ?",
                [model, agent_id, _check_count("limit", limit)],
            ).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def search_vectors(
        self,
        agent_id: str | None,
        vector: Any,
        *,
        k: int = 5,
        model: str,
        tenant: str | None = None,
        min_similarity: float = -1.0,
    ) -> list[EvictedSpan]:
        """The `k` spans whose vectors are nearest `vector` (cosine), best first.

        Args:
            agent_id: the agent whose spans are searched (`None`: every agent of `tenant`).
            vector: the query's embedding (any length-`dim` sequence; normalised here).
            k: results at most.
            model: the embedder's name; only its vectors are compared.
            tenant: an agent-id prefix the spans must be under (`None`: no such filter).
            min_similarity: spans less similar than this are left out.

        Returns:
            Spans with `score` set to the cosine similarity.

        Raises:
            ConfigError: neither `agent_id` nor `tenant`, or a zero/non-finite `vector`.
        """
        k = _check_count("k", k)
        q = unit_rows(vector, n=1, field="vector")[0]
        scope, params = _scope_sql(agent_id, tenant)
        if k == 0 or (agent_id is not None and tenant and not agent_id.startswith(tenant)):
            return []
        with self._reading("search_vectors") as db:
            scored = None if agent_id is None else self._search_hot(db, agent_id, q, k, model)
            if scored is None:
                scored = self._ann_search(db, agent_id, tenant, q, k, model)
            if scored is None:
                rows = db.execute(f"SELECT v.span_id, v.vec FROM span_vectors v WHERE v.model = ?{scope}",
                                  [model, *params]).fetchall()
                scored = _top([int(r[0]) for r in rows], _matrix(rows, q.size, model), q, k)
            scored = [(i, sim) for i, sim in scored if sim >= min_similarity]
            if not scored:
                return []
            ids = [i for i, _ in scored]
            by_id = {
                int(r[0]): r for r in db.execute(
                    f"SELECT {SPAN_COLUMNS} FROM evicted_spans s WHERE s.id IN ({', '.join('?' * len(ids))})", ids
                ).fetchall()
            }
        return [EvictedSpan(*by_id[i], score=sim) for i, sim in scored if i in by_id]

    def _search_hot(self, db: Any, agent_id: str, q: np.ndarray, k: int, model: str) -> list[tuple[int, float]] | None:
        """The agent's best `k` from its partition in RAM (read and kept on a miss); `None` when it does not fit."""
        hot = self.hot_vectors
        if hot.max_bytes == 0:
            return None
        token = None
        if self._SHARED_WRITERS:  # another replica may have written the agent's vectors since they were cached
            count, last = db.execute("SELECT count(*), coalesce(max(v.span_id), 0) FROM span_vectors v "
                                     "WHERE v.model = ? AND v.agent_id = ?", [model, agent_id]).fetchone()
            token = (int(count), int(last))
        part = hot.get(agent_id, model, token=token)
        if part is None:
            if token is None:
                (count,) = db.execute("SELECT count(*) FROM span_vectors v WHERE v.model = ? AND v.agent_id = ?",
                                      [model, agent_id]).fetchone()
            if 4 * (q.size + 2) * int(count) > hot.max_bytes:
                return None
            rows = db.execute("SELECT v.span_id, v.vec FROM span_vectors v WHERE v.model = ? AND v.agent_id = ? "
                              "ORDER BY v.span_id", [model, agent_id]).fetchall()
            ids, mat = np.array([int(r[0]) for r in rows], dtype=np.int64), _matrix(rows, q.size, model)
            if not self._tx_depth:  # rows a rollback may yet undo are not cached
                hot.put(agent_id, model, ids, mat, token=token)
            return _top(ids, mat, q, k)
        if part.matrix.shape[1] != q.size:
            raise ConfigError(f"vectors of {model!r} in the archive are not {q.size}-d like the query")
        return _top(part.ids, part.matrix, q, k)


def _matrix(rows: Sequence[Any], dim: int, model: str) -> np.ndarray:
    """The `(span_id, vec)` rows' blobs as an `n x dim` float32 matrix."""
    blobs = [bytes(r[1]) for r in rows]
    if any(len(b) != 4 * dim for b in blobs):
        raise ConfigError(f"vectors of {model!r} in the archive are not {dim}-d like the query")
    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(rows), dim)


def _top(ids: Sequence[int] | np.ndarray, mat: np.ndarray, q: np.ndarray, k: int) -> list[tuple[int, float]]:
    """`(span_id, cosine)` of the `k` rows of `mat` nearest `q`, best first (ties: the earlier row).

    Only the `k` chosen ids are read (a hot partition's id array is not copied per search).
    """
    if not len(ids):
        return []
    sims = mat @ q
    return [(int(ids[i]), float(sims[i])) for i in np.argsort(-sims, kind="stable")[:k]]
