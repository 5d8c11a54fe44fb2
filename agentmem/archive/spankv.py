"""An evicted span's KV cells, kept beside its text for recall as KV (issue #34).

`SpanKVMixin` adds to `Archive` the `span_kv` table (schema v7): at most one row per
evicted span — its cells as a one-sequence state blob (`agentmem.engine.splice.SpanKV`),
the position of its first cell in that blob, and its token ids (a state blob keeps no
tokens; a recall that splices the cells must put exactly these ids in the prompt).
`model` is the fingerprint of the model and cache layout that wrote the blob: a read
for another fingerprint finds nothing, so a blob never loads where it does not fit.
The row is deleted with its span (`ON DELETE CASCADE`).

>>> import numpy as np
>>> from agentmem.archive import Archive
>>> with Archive(":memory:") as arc:
...     (sid,) = arc.add_evicted_spans("a", [(0, 3, "user", "red fox")])
...     _ = arc.put_span_kv("a", sid, blob=np.arange(8, dtype=np.uint8), pos0=5, tokens=[7, 8, 9], model="m1")
...     row = arc.get_span_kv("a", sid, model="m1")
...     (row.pos0, row.tokens, row.blob.size), arc.get_span_kv("a", sid, model="m2")
((5, (7, 8, 9), 8), None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentmem.archive.core import ArchiveCore
from agentmem.archive.records import Lease
from agentmem.archive.values import _check_agent_id, _check_text
from agentmem.errors import ConfigError

__all__ = ["SpanKVMixin", "StoredSpanKV"]


@dataclass(frozen=True, slots=True)
class StoredSpanKV:
    """One archived span's cells, as `Archive.get_span_kv` returns them.

    Attributes:
        span_id: the evicted span's row id.
        pos0: position of the span's first cell in `blob`.
        tokens: the span's token ids, one per cell.
        blob: the one-sequence state blob (bytes as llama.cpp wrote them).
    """

    span_id: int
    pos0: int
    tokens: tuple[int, ...]
    blob: np.ndarray


def _token_bytes(tokens: Sequence[int]) -> bytes:
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1 or arr.size == 0 or (arr < 0).any() or (arr > np.iinfo(np.int32).max).any():
        raise ConfigError(f"tokens must be a non-empty list of token ids, got {len(arr.reshape(-1))} values")
    return arr.astype("<i4").tobytes()


class SpanKVMixin(ArchiveCore):
    """Evicted spans' KV cells (part of `Archive`)."""

    def put_span_kv(self, agent_id: str, span_id: int, *, blob: Any, pos0: int, tokens: Sequence[int],
                    model: str, fence: Lease | None = None) -> bool:
        """Keep the cells of the evicted span `span_id` of `agent_id` (replacing any kept before).

        Args:
            agent_id: the span's agent.
            span_id: its id (from `add_evicted_spans`).
            blob: the one-sequence state blob (`SpanKV.blob`).
            pos0: position of the span's first cell in the blob (>= 0).
            tokens: the span's token ids, one per cell.
            model: fingerprint of the model and cache layout that wrote the blob.
            fence: the writer's lease, when the archive is shared.

        Returns:
            False when the span is not `agent_id`'s or no longer exists (nothing written).

        Raises:
            ConfigError: an empty blob, bad `pos0` or `tokens`.
        """
        _check_agent_id(agent_id)
        _check_text("model", model)
        if isinstance(pos0, bool) or not isinstance(pos0, int) or pos0 < 0:
            raise ConfigError(f"pos0 must be an int >= 0, got {pos0!r}")
        raw = np.ascontiguousarray(blob, dtype=np.uint8).reshape(-1)
        if raw.size == 0:
            raise ConfigError("blob must not be empty")
        toks = _token_bytes(tokens)
        with self._writing("put_span_kv", fence=fence, agent_id=agent_id) as db:
            row = db.execute("SELECT 1 FROM evicted_spans WHERE id = ? AND agent_id = ?",
                             [int(span_id), agent_id]).fetchone()
            if row is None:
                return False
            db.execute(
                "INSERT INTO span_kv(span_id, agent_id, model, pos0, n_tokens, tokens, blob) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(span_id) DO UPDATE SET model = excluded.model, "
                "pos0 = excluded.pos0, n_tokens = excluded.n_tokens, tokens = excluded.tokens, blob = excluded.blob",
                [int(span_id), agent_id, model, pos0, len(toks) // 4, toks, raw.tobytes()],
            )
        return True

    def span_kv_tokens(self, agent_id: str, *, model: str) -> list[tuple[int, tuple[int, ...]]]:
        """`(span_id, token ids)` of every span of `agent_id` whose cells `model` wrote (no blob is read), oldest first."""
        _check_agent_id(agent_id)
        with self._reading("span_kv_tokens") as db:
            rows = db.execute("SELECT span_id, tokens FROM span_kv WHERE agent_id = ? AND model = ? "
                              "ORDER BY span_id", [agent_id, model]).fetchall()
        return [(int(r[0]), tuple(int(t) for t in np.frombuffer(bytes(r[1]), dtype="<i4"))) for r in rows]

    def get_span_kv(self, agent_id: str, span_id: int, *, model: str) -> StoredSpanKV | None:
        """The kept cells of span `span_id` of `agent_id` written by `model`, or None (none kept, another model)."""
        _check_agent_id(agent_id)
        with self._reading("get_span_kv") as db:
            row = db.execute("SELECT pos0, tokens, blob FROM span_kv WHERE span_id = ? AND agent_id = ? AND model = ?",
                             [int(span_id), agent_id, model]).fetchone()
        if row is None:
            return None
        toks = tuple(int(t) for t in np.frombuffer(bytes(row[1]), dtype="<i4"))
        return StoredSpanKV(span_id=int(span_id), pos0=int(row[0]), tokens=toks,
                            blob=np.frombuffer(bytes(row[2]), dtype=np.uint8).copy())
