"""What an unloaded model holds, read from its archive file: listing agents never loads a model.

A loaded model answers from its engine (`ModelEngine.stats`, `tenant_usage`); an unloaded
one keeps its agents in its archive file, which `ArchivedAgents` reads once per unload
(the rows change only while the model is loaded). An unloaded agent's entry is in tier
`cold`; the counters the archive does not keep are `None`, not a made-up 0.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from agentmem.archive import open_archive
from agentmem.memory.shared import SHARE_PREFIX
from agentmem.memory.tiers import COLD
from agentmem.models.tier import ModelSlot

__all__ = ["ArchivedAgents"]

#: what an unloaded model's archive does not say of its agents (`None`, not a made-up 0)
_UNKNOWN_UNLOADED = dict.fromkeys(("budget", "calls", "restores", "parks", "cached_tokens", "prefill_tokens",
                                   "evictions"))


class ArchivedAgents:
    """The agents of unloaded models, from their archive files (cached per unload; thread-safe)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[int, int], list[Any]]] = {}  # model -> (its load counts, rows)
        self._lock = threading.Lock()

    def rows(self, slot: ModelSlot) -> list[Any]:
        """The `AgentRecord`s in `slot`'s archive file (`[]`: none yet), read once per unload."""
        name, stamp = slot.spec.name, (slot.loads, slot.unloads)
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        path = Path(slot.config.archive_path or "")
        rows: list[Any] = []
        if path.is_file():
            arc = open_archive(path, readonly=True)
            try:
                rows = arc.list_agents()
            finally:
                arc.close()
        if slot.state == "unloaded":
            with self._lock:
                self._cache[name] = (stamp, rows)
        return rows

    def entries(self, slot: ModelSlot) -> dict[str, dict[str, Any]]:
        """Each archived agent of `slot` as `ModelEngine.stats()["agents"]` lists one, with its `model`."""
        name = slot.spec.name
        return {r.agent_id: {"model": name, "tier": COLD, "tokens": r.ledger_tokens, "live_tokens": 0,
                             "bytes": r.state_bytes, "codec": r.codec, "priority": r.priority,
                             "share": r.agent_id.startswith(SHARE_PREFIX), **_UNKNOWN_UNLOADED}
                for r in self.rows(slot)}

    def usage(self, slot: ModelSlot, prefix: str) -> tuple[set[str], int]:
        """`(agents under prefix, their stored bytes)` in `slot`'s archive (declared shares left out)."""
        rows = [r for r in self.rows(slot) if r.agent_id.startswith(prefix) and not r.agent_id.startswith(SHARE_PREFIX)]
        return {r.agent_id for r in rows}, sum(r.state_bytes for r in rows)
