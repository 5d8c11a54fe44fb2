"""`Replica`: the cluster side of one `agentmem serve` — a lease around every call, fenced commits by durability.

The server's engine calls it at four points: `serving(agent_id)` around a call (claim
the lease, re-read the agent from the archive when another replica may have served
it), `commit` when the call's reply is complete, `released` after a park to the
archive or a forget, and `close` after the pool has stored its agents.

Durability in cluster mode:

* `call` (default): the ledger and the KV state are committed after every call,
  so another replica continues the agent from its last answered turn with its KV.
* `lazy`: the ledger is committed after every call; the KV state when the agent
  is parked to the archive, when its lease is released after `idle_s` without
  calls, and at shutdown. A replica killed in between loses no ledger, but the
  agent's next call on another replica re-prefills from the ledger's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, AsyncIterator

from agentmem.cluster.leases import LeaseKeeper
from agentmem.cluster.pool import ClusterPool
from agentmem.errors import ConfigError, LeaseHeldError, LeaseLostError
from agentmem.memory.tiers import HOT, WARM

__all__ = ["CLUSTER_DURABILITY", "Replica", "ReplicaHeader"]

logger = logging.getLogger(__name__)

#: Durability modes of a cluster replica (see the module docstring).
CLUSTER_DURABILITY = ("call", "lazy")


class Replica:
    """Leases and commits of one replica over its `ClusterPool`.

    Args:
        pool: the replica's pool (its archive is shared with the other replicas).
        keeper: the replica's leases (usually over `pool.archive`).
        durability: `call` or `lazy`.
        own_store: close the keeper's store at `close` (a connection of its own).
    """

    def __init__(self, pool: ClusterPool, keeper: LeaseKeeper, *, durability: str = "call", own_store: bool = False) -> None:
        if durability not in CLUSTER_DURABILITY:
            raise ConfigError(f"durability must be one of {', '.join(CLUSTER_DURABILITY)} in cluster mode, got {durability!r}")
        self.pool, self.keeper, self.durability, self.own_store = pool, keeper, durability, own_store
        pool.set_fence(keeper.fence)
        if durability == "lazy":
            keeper.before_release = self._store_state

    @property
    def owner(self) -> str:
        """This replica's id."""
        return self.keeper.owner

    def start(self) -> None:
        """Start renewing leases."""
        self.keeper.start()

    @contextlib.asynccontextmanager
    async def serving(self, agent_id: str) -> AsyncIterator[None]:
        """Hold `agent_id`'s lease for a call; a stale local copy is dropped and re-read first.

        Raises:
            LeaseHeldError: another replica holds the agent (after the keeper's bounded wait).
        """
        keeper = self.keeper
        deadline = keeper.clock() + keeper.wait_s
        while True:  # waiting here, not in a worker thread: many agents may wait for a killed replica at once
            try:
                stale = await asyncio.to_thread(keeper.try_claim, agent_id)
                break
            except LeaseHeldError as exc:
                pause = keeper.pause_s(exc, deadline)
                if pause is None:
                    raise
                await asyncio.sleep(pause)
        try:
            if stale:
                found = await asyncio.to_thread(self.pool.reload, agent_id)
                logger.info("replica %s took agent %r %s", self.owner, agent_id,
                            "from the archive" if found else "(new)")
            yield
        finally:
            self.keeper.done(agent_id)

    async def commit(self, agent_id: str) -> None:
        """Store the call's agent (`call`: ledger and state; `lazy`: ledger), fenced by its lease.

        Raises:
            LeaseLostError: another replica took the agent; its local copy here is
                dropped (the client may retry: the agent is served from the archive).
        """
        fn = self.pool.commit if self.durability == "call" else self.pool.commit_ledger
        try:
            await asyncio.to_thread(fn, agent_id)
        except LeaseLostError:
            self.keeper.lost(agent_id)
            await asyncio.to_thread(self.pool.reload, agent_id)
            raise

    async def released(self, agent_id: str) -> None:
        """The agent is parked in the archive or forgotten here: give its lease up."""
        await asyncio.to_thread(self.keeper.release, agent_id)

    def _store_state(self, agent_id: str) -> None:
        # lazy durability: an idle agent's KV state reaches the archive before its lease goes
        if self.pool.tier_of(agent_id) in (HOT, WARM):
            self.pool.commit(agent_id)

    def close(self) -> None:
        """Stop renewing and release every lease (after the pool closed, having stored its agents)."""
        try:
            self.keeper.close()
        finally:
            if self.own_store:
                self.keeper.store.close()


class ReplicaHeader:
    """ASGI middleware: every answer carries `X-Agentmem-Replica: <replica id>` (which replica served it)."""

    def __init__(self, app: Any, *, replica_id: str) -> None:
        self.app, self.header = app, (b"x-agentmem-replica", replica_id.encode())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, tagged)
