"""Embedding vectors of evicted text, beside the spans, and their exact cosine search.

`VectorsMixin` adds to `Archive` the `span_vectors` table: one unit vector per evicted
span (float32, little-endian, in a BLOB / `bytea`), tagged with the embedder's name so
vectors of two embedders never meet in one search. `add_evicted_spans(..., vectors=...)`
writes them in the span's own transaction; `add_span_vectors` fills in spans archived
without one (an older file, an embedder configured later).

The search is exact: the agent's (or tenant's) vectors are selected in SQL, the cosine
is one numpy matrix product, and the best rows are read back. Neither `sqlite-vec`
(Python's `sqlite3` here is built without extension loading) nor pgvector (Debian
bookworm ships none) is needed; a few thousand spans per agent take well under a
millisecond to score (`benchmarks/recall.py` measures it).

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
        if k == 0:
            return []
        with self._reading("search_vectors") as db:
            rows = db.execute(f"SELECT v.span_id, v.vec FROM span_vectors v WHERE v.model = ?{scope}",
                              [model, *params]).fetchall()
            if not rows:
                return []
            blobs = [bytes(r[1]) for r in rows]
            if any(len(b) != 4 * q.size for b in blobs):
                raise ConfigError(f"vectors of {model!r} in the archive are not {q.size}-d like the query")
            mat = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(rows), q.size)
            sims = mat @ q
            top = np.argsort(-sims, kind="stable")[:k]
            top = [i for i in top if sims[i] >= min_similarity]
            if not top:
                return []
            ids = [int(rows[i][0]) for i in top]
            by_id = {
                int(r[0]): r for r in db.execute(
                    f"SELECT {SPAN_COLUMNS} FROM evicted_spans s WHERE s.id IN ({', '.join('?' * len(ids))})", ids
                ).fetchall()
            }
        return [EvictedSpan(*by_id[i], score=float(sims[j])) for i, j in zip(ids, top) if i in by_id]
