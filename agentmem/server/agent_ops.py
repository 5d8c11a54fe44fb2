"""The agents API's operations on the engine: list, show, park, forget, pin, budget, hints, handoff, recall.

`AgentOps` is mixed into `Engine` (which provides `models`, `queue`, `quotas`,
`replica`, `_pool` and `_owned`). Each operation runs on the pool that holds its agent:
the one pool, or — with several models — the pool of the model the agent is bound to,
held loaded by a lease for the operation (an agent no model knows is a 404). Every
operation checks the key's scope first (403) and never creates an agent, except a
handoff's destination (counted in the key's `max_agents`, bound to the source's model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from agentmem import validation as check
from agentmem.errors import ConfigError, UnknownAgentError
from agentmem.memory.tiers import COLD
from agentmem.pool import ModelEngine
from agentmem.server.auth import Principal
from agentmem.server.http_errors import ApiError
from agentmem.server.identity import authorize
from agentmem.server.metrics import note_model

if TYPE_CHECKING:
    from agentmem.models import MemoryPool
    from agentmem.server.queue import AgentQueue
    from agentmem.server.quotas import Quotas
    from agentmem.server.registry import Models

__all__ = ["AgentOps"]

_INFO_FIELDS = ("tier", "tokens", "live_tokens", "bytes", "codec", "priority", "budget", "calls", "restores", "parks",
                "cached_tokens", "prefill_tokens", "evictions")


class AgentOps:
    """The agent operations of `Engine` (see the module docstring)."""

    models: Models
    queue: AgentQueue
    quotas: Quotas
    replica: Any
    team: MemoryPool | None
    _pool: Callable[[], MemoryPool]
    """The one model's pool (`Engine._pool`)."""
    _owned: Callable[[str], Any]
    """The agent's lease in cluster mode, else `None` (`Engine._owned`)."""

    @contextlib.asynccontextmanager
    async def _on(self, agent_id: str) -> AsyncIterator[ModelEngine]:
        """The engine of `agent_id`'s model, held loaded for the block (404 for an agent no model holds)."""
        seat = await self.models.agent_seat(agent_id)
        note_model(seat.name)
        try:
            yield seat.pool
        finally:
            seat.release()

    async def _known(self, pool: ModelEngine, agent_id: str) -> None:
        """404 unless `pool` knows `agent_id`: actions other than a call never create agents."""
        if not await self.queue.call(pool.has_agent, agent_id):
            raise UnknownAgentError(f"unknown agent {agent_id!r}", agent_id=agent_id)

    @staticmethod
    def _info(agent_id: str, raw: dict[str, Any]) -> dict[str, Any]:
        model = {"model": raw["model"]} if "model" in raw else {}  # several models: the agent's
        return {"id": agent_id, **model, **{k: raw.get(k, 0) for k in _INFO_FIELDS}}

    async def list_agents(self, principal: Principal) -> list[dict[str, Any]]:
        """The agents `principal` may see (declared shares only for admin keys)."""
        self._pool()
        entries = await self.queue.call(self.models.entries)
        return [self._info(k, v) for k, v in sorted(entries.items())
                if principal.allows(k) and (principal.admin or not v.get("share"))]

    async def show_agent(self, principal: Principal, agent_id: str) -> dict[str, Any]:
        """One agent's entry (403 out of scope, 404 unknown)."""
        authorize(principal, agent_id)
        self._pool()
        raw = (await self.queue.call(self.models.entries, agent_id)).get(agent_id)
        if raw is None:
            raise UnknownAgentError(f"unknown agent {agent_id!r}", agent_id=agent_id)
        info = self._info(agent_id, raw)
        info.update(regions=raw.get("regions", {}), evicted_regions=raw.get("evicted_regions", {}),
                    seq=raw.get("seq"), block=raw.get("block"))
        return info

    async def park(self, principal: Principal, agent_id: str, tier: str) -> dict[str, Any]:
        authorize(principal, agent_id)
        async with self._owned(agent_id), self._on(agent_id) as pool:
            await self.queue.call(pool.park, agent_id, tier)
        if self.replica is not None and tier == COLD:
            await self.replica.released(agent_id)
        return await self.show_agent(principal, agent_id)

    async def forget(self, principal: Principal, agent_id: str) -> None:
        authorize(principal, agent_id)
        async with self._owned(agent_id), self._on(agent_id) as pool:
            try:
                await self.queue.call(pool.forget, agent_id)
            except UnknownAgentError:  # bound by a first call that was refused: no KV, only the binding
                self.models.forgotten(agent_id)
                raise
            self.models.forgotten(agent_id)
        if self.replica is not None:
            await self.replica.released(agent_id)

    async def pin(self, principal: Principal, agent_id: str, message_index: int, pinned: bool) -> int:
        authorize(principal, agent_id)
        async with self._on(agent_id) as pool:
            return int(await self.queue.call(pool.pin, agent_id, message_index, pinned))

    async def set_budget(self, principal: Principal, agent_id: str, tokens: int, eviction: str | None) -> None:
        authorize(principal, agent_id)
        async with self._on(agent_id) as pool:
            await self._known(pool, agent_id)
            await self.queue.call(pool.set_budget, agent_id, tokens, eviction)

    async def set_priority(self, principal: Principal, agent_id: str, priority: int | str) -> None:
        authorize(principal, agent_id)
        async with self._on(agent_id) as pool:
            await self._known(pool, agent_id)
            await self.queue.call(pool.set_priority, agent_id, priority)

    async def hold(self, principal: Principal, agent_id: str, ttl_s: float | None) -> None:
        authorize(principal, agent_id)
        async with self._on(agent_id) as pool:
            await self.queue.call(functools.partial(pool.hold, agent_id, ttl_s=ttl_s))

    async def unhold(self, principal: Principal, agent_id: str) -> None:
        authorize(principal, agent_id)
        async with self._on(agent_id) as pool:
            await self.queue.call(pool.unhold, agent_id)

    async def expect(self, principal: Principal, order: list[str | list[str]], soon: bool) -> None:
        """The workflow's expected order (every id must be in the key's scope); one order per key.

        With several models the order is the model pool's (one for the server): each loaded
        model gets its own agents' part, and the model of the first one is loaded ahead.
        """
        for i, item in enumerate(order):
            for x in [item] if isinstance(item, str) else item:
                authorize(principal, check.agent_id(x, field=f"order[{i}]"), field=f"order[{i}]")
        if self.team is not None:
            await self.queue.call(functools.partial(self.team.expect, order, soon=soon))
            return
        await self.queue.call(functools.partial(self._pool().expect, order, soon=soon, scope=f"key:{principal.name}"))

    async def handoff(self, principal: Principal, src: str, dst: str, upto: int | None) -> dict[str, Any]:
        authorize(principal, src)
        authorize(principal, dst, field="to")
        async with self._on(src) as pool:
            await self._known(pool, src)
            settle = await self.quotas.reserve(principal, dst, self.models)  # a new destination is a new agent
            try:
                if self.team is not None:
                    self.models.bind(dst, self.team.model_of(src) or "")  # the destination reads src's KV
                return _plain(await self.queue.call(pool.handoff, src, dst, upto))
            finally:
                settle()

    async def recall(self, principal: Principal, agent_id: str, query: str, k: int) -> list[dict[str, Any]]:
        authorize(principal, agent_id)
        async with self._on(agent_id) as pool:
            spans = await self.queue.call(pool.recall, agent_id, query, k)
        return [_plain(s) for s in spans]

    async def checkpoint(self, principal: Principal) -> None:
        if not principal.admin:
            raise ApiError(403, "checkpointing the pool needs an admin key", code="forbidden")
        pool = self._pool()
        if not pool.durable:
            raise ConfigError("checkpoint needs a server started with --archive (or --archive-url)")
        await self.queue.call(pool.checkpoint)


def _plain(obj: Any) -> Any:
    """A dataclass (or a plain value) as JSON-friendly data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
