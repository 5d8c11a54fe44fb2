"""`ClusterPool`: a `MemoryPool` whose archive other replicas share — fenced writes, one agent re-read at a time.

Three things a replica needs that one process alone does not: every archive write
of an agent carries the agent's lease (`set_fence`), so a replica that lost the
lease writes nothing; `reload` drops the local copy of an agent and registers it as
the shared archive holds it now (another replica may have served it); and
`commit_ledger` stores only the ledger (lazy durability: the KV state follows when
the agent is parked or its lease is released).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from agentmem.errors import AgentBusyError, ArchiveError, ConfigError
from agentmem.memory.tiers import ColdTier
from agentmem.pool import ModelEngine

__all__ = ["ClusterPool"]

logger = logging.getLogger(__name__)


class ClusterPool(ModelEngine):
    """A `MemoryPool` for one replica of a cluster (same constructor; an archive is required).

    Unlike a lone pool it does not register every archived agent when it opens:
    the other replicas own most of them, and each agent is read when this replica
    first claims it (`reload`). At `close` it stores only the agents whose lease it
    holds or can take back at its last token; the others' local copies are dropped.

    Raises:
        ConfigError: the configuration has no archive.
    """

    _resume_on_open = False

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        if self._core.archive is None:
            self.close()
            raise ConfigError("a cluster replica needs a shared archive (archive_url)")

    def close(self, timeout_s: float = 30.0) -> None:
        """Store the agents this replica may still write (see the class docstring), then close (`ModelEngine.close`)."""
        core = self._core
        if not self.closed and core.fence is not None:
            with core.lock:
                for a in list(core.agents.values()):
                    if a.held:
                        continue
                    try:
                        core.fence(a.id)
                    except ArchiveError as exc:  # LeaseLostError, or the archive is unreachable
                        logger.debug("agent %r not stored at close: %s", a.id, exc)
                        self._mover.discard(a)
        super().close(timeout_s)

    @property
    def archive(self) -> Any:
        """The shared archive (its lease calls are the replica's lease store)."""
        return self._core.archive

    def set_fence(self, fence: Callable[[str], Any] | None) -> None:
        """`fence(agent_id)` gives the lease an archive write of that agent carries (raising when none is held)."""
        self._core.fence = fence
        durable = self._core.tiers.durable
        assert isinstance(durable, ColdTier), "a cluster replica needs a shared archive"
        durable.fence = fence

    def reload(self, agent_id: str) -> bool:
        """Drop the local copy of idle `agent_id` and register it as the archive holds it now.

        Returns whether the archive has the agent (if not, its next call starts it
        fresh). Its state is read from the archive on its next call (COLD).

        Raises:
            AgentBusyError: the agent is generating (or pinned).
        """
        self._check_open()
        core = self._core
        with core.lock:
            a = core.agents.get(agent_id)
            if a is not None:
                if a.held:
                    raise AgentBusyError(f"agent {agent_id!r} is {a.residence.hold}; cannot reload it now")
                self._mover.discard(a)
            got = self._persist.load(agent_id)
            logger.debug("agent %r re-read from the archive: %s", agent_id, got.tier if got else "absent")
            return got is not None

    def commit_ledger(self, agent_id: str) -> bool:
        """Write `agent_id`'s ledger now (a stored state it no longer matches is dropped); False while it generates."""
        self._check_open()
        core = self._core
        with core.lock:
            a = core.agent(agent_id)
            if a.held:
                return False
            self._mover.save(a, state=False)
            return True

    def tier_of(self, agent_id: str) -> str | None:
        """`hot`, `warm`, `cold` or `empty` for a known agent, None for an unknown one (cheap: no archive read)."""
        core = self._core
        with core.lock:
            a = core.agents.get(agent_id)
            if a is None:
                return None
            return a.residence.place
