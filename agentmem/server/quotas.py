"""Per-key quotas: how many agents, and how many bytes of parked KV, one API key may keep.

The third quota, requests in flight, is `AgentQueue.admit`'s. Without these, one
tenant could start agents until the pool's RAM and archive are full, and every
call slows down as agents accumulate (#23 finding 10: 265 agents added 105 MiB).

| quota (key-file field) | server default (flag) | over it: 429 for |
|---|---|---|
| `max_agents`: agents under the key's prefix (its own: not a nested key's) | 256 (`--max-agents`) | a call that would start one more named agent (a new anonymous conversation forgets the key's least recently used one instead: `lifecycle`) |
| `max_parked_bytes`: their parked states (WARM + COLD) | 1 GiB (`--max-parked-bytes`) | every call of the key |
| `max_concurrent`: requests in flight | 8 (`--max-concurrent`) | one more request |

A key's own value overrides the default (`0` in the key file: the default; `0` as
the default: no limit). Admin keys are not tenants: they have no agent or byte quota
unless their entry sets one (it then counts every agent). The 429 body names the
limit in `param` and counts only the key's own agents:

```json
{"error": {"message": "this API key may keep at most 2 agents and has 2: forget one (DELETE /agents/{id})
            before starting another", "type": "rate_limit_error", "param": "max_agents", "code": "quota_exceeded"}}
```

Agents are counted from the pool (`MemoryPool.tenant_usage`, read in a worker thread;
with several models, over every model: `MemoryPool.tenant_usage`)
plus the new agents whose first call is admitted but not finished, so concurrent first
calls cannot overshoot `max_agents`. A handoff's new destination counts as a new agent;
the other agent actions never create agents (`Engine`: 404 for an unknown one).
"""

from __future__ import annotations

import asyncio
from typing import Callable, Protocol

from agentmem.pool.tenants import TenantUsage
from agentmem.server.auth import Principal
from agentmem.server.http_errors import ApiError
from agentmem.server.settings import ServerSettings

__all__ = ["Quotas"]


class UsageSource(Protocol):
    """What the quotas read: a `MemoryPool`, or the server's `Models` (every model's agents)."""

    def tenant_usage(self, prefix: str) -> TenantUsage: ...


def _nothing() -> None:
    return None


class Quotas:
    """The agent and parked-byte quotas of every key (see the module docstring).

    Args:
        settings: the server-wide defaults (`max_agents_per_key`, `max_parked_bytes_per_key`).
        prefixes: the scoped keys' prefixes: a key's quota counts its own agents, not those of a
            key nested in its prefix (`team-a/red/` inside `team-a/`).
    """

    def __init__(self, settings: ServerSettings, prefixes: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.prefixes = prefixes
        self._pending: dict[str, set[str]] = {}  # key name -> new agents whose first call is running

    def _nested(self, prefix: str) -> list[str]:
        """The other keys' prefixes inside `prefix` (`team-a/red/` inside `team-a/`), outermost only."""
        inner = [q for q in self.prefixes if q != prefix and q.startswith(prefix)]
        return [q for q in inner if not any(q != o and q.startswith(o) for o in inner)]

    def own_agents(self, principal: Principal, agents: frozenset[str]) -> frozenset[str]:
        """Of `agents` (under the principal's prefix), those of its own key: a nested key's are not (#33 F7)."""
        if principal.admin:
            return agents
        nested = tuple(self._nested(principal.prefix))
        return frozenset(a for a in agents if not a.startswith(nested)) if nested else agents

    def usage(self, principal: Principal, pool: UsageSource) -> TenantUsage:
        """What `principal`'s own key keeps: its prefix's agents and bytes, less nested keys' (blocking)."""
        usage = pool.tenant_usage(principal.prefix)
        if principal.admin:
            return usage
        for q in self._nested(principal.prefix):
            inner = pool.tenant_usage(q)
            usage = TenantUsage(usage.agents - inner.agents, usage.parked_bytes - inner.parked_bytes)
        return usage

    def limits(self, principal: Principal) -> tuple[int, int]:
        """`(max_agents, max_parked_bytes)` of `principal` (`0`: no limit)."""
        if principal.admin:
            return principal.max_agents, principal.max_parked_bytes
        return (principal.max_agents or self.settings.max_agents_per_key,
                principal.max_parked_bytes or self.settings.max_parked_bytes_per_key)

    async def reserve(self, principal: Principal, agent_id: str, pool: UsageSource) -> Callable[[], None]:
        """Admit a call of `agent_id` under `principal`'s quotas; returns what ends its reservation.

        Raises:
            ApiError: 429 `quota_exceeded`, `param` naming the limit.
        """
        max_agents, max_bytes = self.limits(principal)
        if not (max_agents or max_bytes):
            return _nothing
        usage = await asyncio.to_thread(self.usage, principal, pool)
        # no await from here on: the check and the reservation are one step of the event loop
        pending = self._pending.setdefault(principal.name, set())
        known = agent_id in usage.agents or agent_id in pending
        n = len(usage.agents | pending)
        if max_agents and not known and n >= max_agents:
            raise ApiError(429, f"this API key may keep at most {max_agents} agents and has {n}: forget one "
                                "(DELETE /agents/{id}) before starting another",
                           code="quota_exceeded", param="max_agents")
        if max_bytes and usage.parked_bytes >= max_bytes:
            raise ApiError(429, f"this API key's agents keep {usage.parked_bytes} bytes of parked KV state, at or over "
                                f"its limit of {max_bytes}: forget agents (DELETE /agents/{{id}}) to free them",
                           code="quota_exceeded", param="max_parked_bytes")
        if known:
            return _nothing
        pending.add(agent_id)

        def settle() -> None:
            pending.discard(agent_id)
            if not pending:
                self._pending.pop(principal.name, None)

        return settle
