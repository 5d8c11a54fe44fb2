"""Which model each agent belongs to: set on an agent's first call, read back from the archives.

An agent's KV — live, parked, archived, its shared blocks — is computed by one model
and means nothing to another, so an agent is *bound* to one model for life: by the
`model` its first call names, an explicit `bind`, or the model pool's default. A
later call that names another model is refused (`ModelMismatchError`); `forget` ends
the binding.

Each model keeps its agents in its own archive file, so the bindings are durable by
construction: at open, every agent listed in a model's archive is bound to it (read
without loading the model). An id found in two archives (files copied by hand) stays
with the first model listed and is logged.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Iterable

import agentmem.validation as check
from agentmem.archive import open_archive
from agentmem.errors import ModelMismatchError, UnknownModelError

__all__ = ["Bindings"]

logger = logging.getLogger(__name__)


class Bindings:
    """`agent id -> model name`, thread-safe."""

    def __init__(self, models: Iterable[str], default: str) -> None:
        self.models = tuple(models)
        self.default = default
        self._of: dict[str, str] = {}
        self._lock = threading.Lock()

    def check_model(self, model: str) -> str:
        if not isinstance(model, str) or model not in self.models:
            shown = model if isinstance(model, str) and len(model) <= 64 else "(not a model name)"
            raise UnknownModelError(f"model: no model {shown!r} in this pool; it holds {', '.join(self.models)}")
        return model

    def resume(self, model: str, archive_path: Path) -> int:
        """Bind every agent stored in `model`'s archive file; returns how many."""
        if not archive_path.exists():
            return 0
        arc = open_archive(archive_path, readonly=True)
        try:
            ids = [r.agent_id for r in arc.list_agents()]
        finally:
            arc.close()
        n = 0
        with self._lock:
            for agent_id in ids:
                other = self._of.setdefault(agent_id, model)
                if other != model:
                    logger.warning("agent %r is in the archives of %s and %s; it stays with %s",
                                   agent_id, other, model, other)
                else:
                    n += 1
        return n

    def route(self, agent_id: str, model: str | None) -> str:
        """The model that serves `agent_id`'s call naming `model` (binding a new agent)."""
        check.agent_id(agent_id)
        if model is not None:
            self.check_model(model)
        with self._lock:
            bound = self._of.get(agent_id)
            if bound is None:
                bound = self._of[agent_id] = model or self.default
                return bound
        if model is not None and model != bound:
            raise ModelMismatchError(
                f"model: agent {agent_id!r} is bound to model {bound!r}; its KV cannot be used by {model!r} "
                "(forget the agent to start it over on another model)", agent_id=agent_id, bound=bound, asked=model)
        return bound

    def bind(self, agent_id: str, model: str) -> None:
        """Bind `agent_id` to `model` before its first call (the same model again is a no-op)."""
        self.route(agent_id, self.check_model(model))

    def of(self, agent_id: str) -> str | None:
        with self._lock:
            return self._of.get(agent_id)

    def drop(self, agent_id: str) -> None:
        with self._lock:
            self._of.pop(agent_id, None)

    def agents(self, model: str) -> list[str]:
        with self._lock:
            return sorted(a for a, m in self._of.items() if m == model)

    def __len__(self) -> int:
        with self._lock:
            return len(self._of)
