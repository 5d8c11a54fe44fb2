"""`ResponseStore`: the stored responses of `POST /v1/responses`, in memory, per scope, bounded.

A stored response keeps what `previous_response_id` needs: the response body, its
whole conversation as items (the previous responses' input and output, then its own
input), the index where its own input starts, and its agent. Lookups are per *scope*
(a scoped key's agent-id prefix — its tenant — or, for an admin key, the key itself):
an id stored under another scope is not found, exactly like an unknown one.

Each scope is an LRU bounded by a count and by bytes (the JSON size of its entries,
each entry counting its whole conversation); the least recently used responses go
first. Nothing survives a restart: a `previous_response_id` from before it is a 404.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentmem.server.auth import Principal

__all__ = ["ResponseStore", "StoredResponse", "scope_of"]


def scope_of(who: Principal) -> str:
    """The store scope of a caller: its tenant (agent-id prefix), or the key itself for an admin key."""
    return f"prefix:{who.prefix}" if who.prefix else f"key:{who.name}"


@dataclass
class StoredResponse:
    """One stored response.

    Attributes:
        response: the response body (`object: response`).
        items: the whole conversation: previous input and output items, its own input, its output.
        input_start: where its own input starts in `items`.
        output_start: where its output starts in `items`.
        agent_id: the agent that served it (a `previous_response_id` continues it).
        size: its bytes as the store counts them.
    """

    response: dict[str, Any]
    items: list[dict[str, Any]]
    input_start: int
    output_start: int
    agent_id: str
    size: int = field(default=0)

    @property
    def own_input(self) -> list[dict[str, Any]]:
        """The input items this response was sent (not those of its previous responses)."""
        return self.items[self.input_start:self.output_start]


class ResponseStore:
    """Stored responses, per scope, each scope an LRU of at most `max_items` and `max_bytes`.

    Thread-safe (one lock); every method is O(1) but `put`, which measures the entry.

    Args:
        max_items: responses kept per scope.
        max_bytes: bytes kept per scope (an entry larger than this is not kept at all).
    """

    def __init__(self, *, max_items: int = 10_000, max_bytes: int = 64 * 2**20) -> None:
        if max_items < 1 or max_bytes < 1:
            raise ValueError(f"max_items and max_bytes must be >= 1, got {max_items}, {max_bytes}")
        self.max_items, self.max_bytes = max_items, max_bytes
        self._scopes: dict[str, OrderedDict[str, StoredResponse]] = {}
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, scope: str, entry: StoredResponse) -> bool:
        """Keep `entry` under `scope` (evicting the least recently used); False when it is too large to keep."""
        entry.size = len(json.dumps([entry.response, entry.items], ensure_ascii=False, separators=(",", ":")))
        if entry.size > self.max_bytes:
            return False
        rid = entry.response["id"]
        with self._lock:
            kept = self._scopes.setdefault(scope, OrderedDict())
            old = kept.pop(rid, None)
            used = self._bytes.get(scope, 0) - (old.size if old is not None else 0)
            kept[rid] = entry
            used += entry.size
            while len(kept) > self.max_items or used > self.max_bytes:
                _, gone = kept.popitem(last=False)
                used -= gone.size
            self._bytes[scope] = used
        return True

    def get(self, scope: str, rid: str) -> StoredResponse | None:
        """The response `rid` stored under `scope` (now the most recently used), or None."""
        with self._lock:
            kept = self._scopes.get(scope)
            entry = kept.get(rid) if kept is not None else None
            if entry is not None:
                kept.move_to_end(rid)  # type: ignore[union-attr]
            return entry

    def delete(self, scope: str, rid: str) -> bool:
        """Forget `rid` under `scope`; False when it was not there."""
        with self._lock:
            kept = self._scopes.get(scope)
            entry = kept.pop(rid, None) if kept is not None else None
            if entry is None:
                return False
            self._bytes[scope] -= entry.size
            return True

    def stats(self, scope: str) -> tuple[int, int]:
        """(responses, bytes) kept under `scope`."""
        with self._lock:
            return len(self._scopes.get(scope, ())), self._bytes.get(scope, 0)
