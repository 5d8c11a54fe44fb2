"""Agent records and their token ledgers.

`AgentsMixin` adds to `Archive` the reads and writes of the `agents` table
(priority, labels) and of the `ledgers` table (tokens, region spans, messages).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from agentmem.archive.core import ArchiveCore
from agentmem.archive.records import AgentRecord, Lease, LedgerRecord, Region
from agentmem.archive.values import (
    _check_agent_id,
    _check_int64,
    _check_key,
    _check_text,
    _json_dumps,
    _json_text,
)
from agentmem.errors import ArchiveError

__all__ = ["AgentsMixin"]

logger = logging.getLogger(__name__)

_INT32 = np.iinfo(np.int32)


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
        _check_text(f"regions[{i}]: region", region)
        start, end, flags = int(start), int(end), int(flags)
        if not 0 <= start <= end <= n_tokens:
            raise ValueError(f"regions[{i}] = {span!r} is outside 0..{n_tokens} or reversed")
        out.append([start, end, region, flags])
    return out


class AgentsMixin(ArchiveCore):
    """Reads and writes of agent records and ledgers (part of `Archive`)."""

    def put_agent(
        self,
        agent_id: str,
        *,
        priority: int | str | None = None,
        labels: Mapping[str, Any] | None = None,
        fence: Lease | None = None,
    ) -> None:
        """Create or update an agent record.

        Args:
            agent_id: the agent's id.
            priority: stored as given; `None` keeps the current value (0 for a
                new agent).
            labels: JSON-serialisable labels replacing the current ones; `None`
                keeps them (`{}` for a new agent).
            fence: write only while this lease of the agent is current
                (else `LeaseLostError`, nothing written).

        Examples:
            >>> from agentmem.archive import Archive
            >>> with Archive(":memory:") as arc:
            ...     arc.put_agent("planner", priority="foreground", labels={"team": "a"})
            ...     arc.get_agent("planner").priority
            'foreground'
        """
        _check_agent_id(agent_id)
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, (int, str))):
            raise TypeError(f"priority must be an int or str, not {priority!r}")
        if isinstance(priority, str):
            _check_text("priority", priority)
        elif priority is not None:
            priority = _check_int64("priority", priority)
        labels_json = None if labels is None else _json_text("labels", dict(labels))
        now = time.time()
        stored = self._priority_in(priority)
        with self._writing("put_agent", fence=fence, agent_id=agent_id) as db:
            db.execute(
                "INSERT INTO agents(id, priority, labels, created, updated) "
                "VALUES (?, coalesce(?, ?), coalesce(?, '{}'), ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET priority = coalesce(?, agents.priority), "
                "labels = coalesce(?, agents.labels), updated = excluded.updated",
                [agent_id, stored, self._PRIORITY_DEFAULT, labels_json, now, now, stored, labels_json],
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

    def _agent_from_row(self, row: Sequence[Any]) -> AgentRecord:
        return AgentRecord(
            agent_id=row[0],
            priority=self._priority_out(row[1]),
            labels=self._labels(row[0], row[2]),
            created=row[3],
            updated=row[4],
            ledger_tokens=row[5],
            ledger_bytes=row[6],
            tier=row[7],
            codec=row[8],
            state_tokens=row[9],
            state_bytes=row[10],
        )

    def _labels(self, agent_id: str, stored: Any) -> dict[str, Any]:
        """The stored labels; a corrupt value reads as `{}` (logged) so one bad row never hides the rest."""
        try:
            labels = json.loads(stored)
        except (TypeError, ValueError) as exc:
            problem = f"not JSON ({exc})"
        else:
            if isinstance(labels, dict):
                return labels
            problem = f"a JSON {type(labels).__name__}, not an object"
        logger.warning(
            "%s: labels of agent %r are corrupt (%s); reading them as empty labels", self.path, agent_id, problem
        )
        return {}

    def get_agent(self, agent_id: str) -> AgentRecord | None:
        """The agent's record with ledger and state sizes, or `None`."""
        with self._reading("get_agent") as db:
            row = db.execute(self._AGENT_SELECT + " WHERE a.id = ?", [agent_id]).fetchone()
        return None if row is None else self._agent_from_row(row)

    def list_agents(self) -> list[AgentRecord]:
        """Every agent, ordered by id, with tokens, tier, codec and bytes.

        Examples:
            >>> from agentmem.archive import Archive
            >>> with Archive(":memory:") as arc:
            ...     arc.put_agent("b"); arc.put_agent("a")
            ...     [r.agent_id for r in arc.list_agents()]
            ['a', 'b']
        """
        with self._reading("list_agents") as db:
            rows = db.execute(self._AGENT_SELECT + " ORDER BY a.id").fetchall()
        return [self._agent_from_row(r) for r in rows]

    def delete_agent(self, agent_id: str, *, fence: Lease | None = None) -> bool:
        """Delete an agent with its ledger, state, evicted spans and events (its lease row stays).

        Args:
            agent_id: the agent's id.
            fence: delete only while this lease of the agent is current.

        Returns:
            Whether the agent existed.
        """
        _check_key("agent_id", agent_id)
        with self._writing("delete_agent", fence=fence, agent_id=agent_id) as db:
            db.execute("DELETE FROM events WHERE agent_id = ?", [agent_id])
            cur = db.execute("DELETE FROM agents WHERE id = ?", [agent_id])
            self._vectors_changed(agent_id)  # its spans and their vectors went with it (ON DELETE CASCADE)
            self._span_tokens_drop(agent_id)  # and their kept cells
            return cur.rowcount > 0

    # ------------------------------------------------------------------ ledgers

    def put_ledger(
        self,
        agent_id: str,
        tokens: np.ndarray | Sequence[int],
        regions: Iterable[Region] | Iterable[Sequence[Any]],
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        fence: Lease | None = None,
    ) -> None:
        """Store (replace) an agent's ledger; creates the agent record if needed.

        Args:
            agent_id: the agent's id.
            tokens: 1-D integer token ids (stored as int32 little-endian).
            regions: `(start, end, region, flags)` spans within `tokens`.
            messages: the chat messages (JSON-serialisable dicts), or `None`.
            fence: write only while this lease of the agent is current.

        Raises:
            ValueError, TypeError: malformed tokens, regions or messages.
            LeaseLostError: `fence` is no longer current (nothing written).

        Examples:
            >>> import numpy as np
            >>> from agentmem.archive import Archive
            >>> with Archive(":memory:") as arc:
            ...     arc.put_ledger("a", np.array([1, 2, 3], np.int32), [(0, 3, "user", 0)],
            ...                    [{"role": "user", "content": "hi"}])
            ...     arc.get_ledger("a").regions
            [(0, 3, 'user', 0)]
        """
        _check_agent_id(agent_id)
        token_bytes, n_tokens = _tokens_to_bytes(tokens)
        regions_json = _json_text("regions", _check_regions(regions, n_tokens))
        messages_json: str | None = None
        if messages is not None:
            try:
                messages_json = _json_dumps([dict(m) for m in messages])
            except (TypeError, ValueError) as exc:
                raise TypeError(f"messages of agent {agent_id!r} are not JSON-serialisable: {exc}") from exc
            _check_text("messages", messages_json)
        n_bytes = (
            len(token_bytes)
            + len(regions_json.encode())
            + (len(messages_json.encode()) if messages_json is not None else 0)
        )
        now = time.time()
        with self._writing("put_ledger", fence=fence, agent_id=agent_id) as db:
            self._touch_agent(db, agent_id, now)
            db.execute(
                "INSERT INTO ledgers(agent_id, n_tokens, n_bytes, updated, regions, messages, tokens) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(agent_id) DO UPDATE SET n_tokens = excluded.n_tokens, "
                "n_bytes = excluded.n_bytes, updated = excluded.updated, regions = excluded.regions, "
                "messages = excluded.messages, tokens = excluded.tokens",
                [agent_id, n_tokens, n_bytes, now, regions_json, messages_json, token_bytes],
            )

    def get_ledger(self, agent_id: str) -> LedgerRecord | None:
        """The agent's ledger, or `None` if it has none.

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

    def delete_ledger(self, agent_id: str, *, fence: Lease | None = None) -> bool:
        """Delete the agent's ledger (fenced by `fence` when given); returns whether there was one."""
        _check_key("agent_id", agent_id)
        with self._writing("delete_ledger", fence=fence, agent_id=agent_id) as db:
            return db.execute("DELETE FROM ledgers WHERE agent_id = ?", [agent_id]).rowcount > 0
