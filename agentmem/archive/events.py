"""The event log and the evicted text kept for recall.

`EventsMixin` adds to `Archive` the append-only `events` log and the
`evicted_spans` table with its full-text search (the backend's `_search`: FTS5
with BM25 on SQLite, a LIKE scan where SQLite lacks FTS5, `tsvector` on PostgreSQL);
the spans' vectors and their search come from `VectorsMixin`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from typing import Any

from agentmem.archive.records import EventRecord, EvictedSpan, Lease
from agentmem.archive.vectors import VectorsMixin, unit_rows
from agentmem.archive.values import SPAN_COLUMNS, _check_agent_id, _check_count, _check_key, _check_text
from agentmem.errors import ConfigError

__all__ = ["EventsMixin"]

_MAX_QUERY_TERMS = 64


def _fts_terms(query: str) -> list[str]:
    """Words of `query`; FTS5 operators and quotes never survive this."""
    return re.findall(r"\w+", query, flags=re.UNICODE)[:_MAX_QUERY_TERMS]


class EventsMixin(VectorsMixin):
    """The event log and evicted-text recall (part of `Archive`)."""

    def log_event(self, agent_id: str | None, kind: str, *, fence: Lease | None = None, **data: Any) -> int:
        """Append an event; values that JSON cannot hold are stored as their repr.

        With `fence` (an agent's event only) the event is written only while that
        lease of the agent is current; `fence` is never part of `data`.

        Returns:
            The event id.

        Examples:
            >>> from agentmem.archive import Archive
            >>> with Archive(":memory:") as arc:
            ...     _ = arc.log_event("coder", "demote", to="cold", codec="q8_0")
            ...     arc.events("coder")[0].data
            {'codec': 'q8_0', 'to': 'cold'}
        """
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"kind must be a non-empty str, not {kind!r}")
        _check_text("kind", kind)
        _check_key("agent_id", agent_id)
        payload = _check_text("data", json.dumps(data, sort_keys=True, ensure_ascii=False, default=repr))
        if fence is not None and agent_id is None:
            raise ConfigError("fence needs an agent's event, not a pool-wide one (agent_id=None)")
        with self._writing("log_event", fence=fence, agent_id=agent_id) as db:
            row = db.execute(
                "INSERT INTO events(ts, agent_id, kind, data) VALUES (?, ?, ?, ?) RETURNING id",
                [time.time(), agent_id, kind, payload],
            ).fetchall()
            return int(row[0][0])

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
        """Delete all but the newest `keep_last` events; returns how many went."""
        keep_last = _check_count("keep_last", keep_last)
        with self._writing("prune_events") as db:
            cur = db.execute(
                "DELETE FROM events WHERE id <= coalesce("
                "(SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?), -1)",
                [keep_last],
            )
            return cur.rowcount

    # ------------------------------------------------------------------ evicted text

    def add_evicted_span(
        self, agent_id: str, start: int, end: int, region: str, text: str, *, fence: Lease | None = None
    ) -> int:
        """Archive the text of one evicted span (fenced by `fence` when given); returns its id.

        Examples:
            >>> from agentmem.archive import Archive
            >>> with Archive(":memory:") as arc:
            ...     _ = arc.add_evicted_span("a", 10, 42, "tool_result", "invoice total 1234 EUR")
            ...     [s.text for s in arc.search_evicted("a", "invoice?")]
            ['invoice total 1234 EUR']
        """
        return self.add_evicted_spans(agent_id, [(start, end, region, text)], fence=fence)[0]

    def add_evicted_spans(
        self,
        agent_id: str,
        spans: Iterable[tuple[int, int, str, str]],
        *,
        fence: Lease | None = None,
        vectors: Any = None,
        model: str | None = None,
    ) -> list[int]:
        """Archive several evicted spans of one agent in one transaction; returns their ids.

        With `fence` they are written only while that lease of the agent is current.
        With `vectors` (one embedding per span, a matrix) and `model` (the embedder's
        name) each span's vector is written in the same transaction (`VectorsMixin`):
        a span is never archived without the vector it was given, nor a vector without its span.

        Raises:
            ConfigError: a bad field (named), or `vectors` without `model` or of the wrong shape.
        """
        _check_agent_id(agent_id)
        spans = list(spans)
        mat = None
        if vectors is not None:
            if not isinstance(model, str) or not model:
                raise ConfigError("vectors need model, the embedder's name")
            _check_text("model", model)
            mat = unit_rows(vectors, n=len(spans))
        rows = []
        for start, end, region, text in spans:
            start, end = _check_count("start", start), _check_count("end", end)
            if end < start:
                raise ValueError(f"evicted span end {end} < start {start}")
            if not isinstance(region, str) or not isinstance(text, str):
                raise TypeError("region and text must be str")
            _check_text("region", region)
            _check_text("text", text)
            rows.append((start, end, region, self._span_text_in(text)))
        now = time.time()
        ids: list[int] = []
        if mat is not None:
            self._ann_prepare(model or "", int(mat.shape[1]))
        with self._writing("add_evicted_spans", fence=fence, agent_id=agent_id) as db:
            self._touch_agent(db, agent_id, now)
            for start, end, region, text in rows:
                row = db.execute(
                    'INSERT INTO evicted_spans(agent_id, start, "end", region, text, ts) '
                    "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                    [agent_id, start, end, region, text, now],
                ).fetchall()
                ids.append(int(row[0][0]))
            if mat is not None and ids:
                self._write_vectors(db, agent_id, ids, mat, model or "")
        return ids

    def list_evicted(self, agent_id: str, *, limit: int | None = None) -> list[EvictedSpan]:
        """The agent's evicted spans, oldest first."""
        sql = f"SELECT {SPAN_COLUMNS}, 0.0 FROM evicted_spans s WHERE s.agent_id = ? ORDER BY s.id"
        params: list[Any] = [agent_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(_check_count("limit", limit))
        with self._reading("list_evicted") as db:
            return [EvictedSpan(*row) for row in db.execute(sql, params).fetchall()]

    def search_evicted(self, agent_id: str | None, query: str, k: int = 5) -> list[EvictedSpan]:
        """The `k` evicted spans best matching `query`, best first.

        The query is reduced to its words, each matched literally and combined
        with OR, so any user text is safe (quotes, `NEAR`, `*`, `-` and
        other FTS5 syntax carry no meaning). On SQLite, ranking is FTS5's BM25
        with Porter stemming (without FTS5, the number of words found by a LIKE
        scan); on PostgreSQL, `ts_rank` over an English `tsvector`.

        Args:
            agent_id: restrict to one agent, or `None` for all agents.
            query: free text.
            k: maximum number of results (0 gives `[]`).

        Returns:
            Spans with `score` set (higher is better); `[]` for a query
            without words.

        Raises:
            ConfigError: `k` is not a non-negative int.
        """
        k = _check_count("k", k)
        terms = _fts_terms(query if isinstance(query, str) else str(query))
        if not terms or k == 0:
            return []
        with self._reading("search_evicted") as db:
            rows = self._search(db, agent_id, terms, k)
        return [EvictedSpan(*row) for row in rows]
