"""Tenant scopes: whose KV an agent may start from (prefix sharing, shared blocks, handoffs).

A shared prefix is visible to the agent that receives it: the call reports it
(`usage.cached_tokens`, `kv == "shared"`) and it is faster than a prefill. In a pool
that serves several tenants (a server's API keys, each scoped to an agent-id prefix)
a tenant could therefore test guesses of another tenant's system prompt token by
token (#23 finding 3). `PoolConfig(tenants=("team-a/", "team-b/"))` draws the walls,
like vLLM's per-request `cache_salt` keeps prefix-cache hits inside one tenant:

* an agent's **tenant** is the longest configured prefix its id starts with; an id
  under none is in the default scope `""`. Without `tenants` every agent is in the
  default scope: one scope for all, the pool's behaviour before tenants existed.
* a **declared share** `pool.share(name, ...)` (agent `"share:" + name`) belongs to the
  tenant of `name`: `pool.share("team-a/brief", ...)` serves team-a's agents only. A share
  whose name is under no tenant (`pool.share("style-guide", ...)`) is **public**: every
  scope may start from it. Only the pool's owner declares shares (the server never lets a
  key name a `share:` agent), so a public share is text its owner chose to publish.
* an agent takes a prefix (automatic sharing, `seq_cp` from a live donor, a restore from
  a parked one, and so the shared block made from it) only from an agent of its own
  tenant or from a share it may use (`TenantScope.may_take`). A handoff's source and
  destination follow the same rule; a handoff across tenants is a `ConfigError`.
* an **end user's scope** is a tenant too, without configuring it: an id
  `{tenant}@u/{name}/...` (`END_USER_MARK`) is in the tenant `{tenant}@u/{name}/`. A server
  started with `--end-users` puts each end user's conversations there, so lines, prefix
  sharing and `cached_tokens` never cross two end users of one key (#33 F4).
* recall searches one named agent's evicted text (never several agents'), and a parked
  agent links only the block it was stored with, so neither crosses tenants once the
  blocks do not. Blocks made before the walls existed (an archive written by a pool
  without `tenants`) keep their members: each member's tokens are its own, so they reveal
  nothing new.

`TenantMethods` is the public face on `MemoryPool` (`tenant_of`, `add_tenants`,
`tenant_usage`, `has_agent`); the server passes its keys' prefixes to `add_tenants`.

>>> scope = TenantScope(("team-a/", "team-a/red/", "team-b/"))
>>> scope.of("team-a/red/planner"), scope.of("team-b/x"), scope.of("admin-bot")
('team-a/red/', 'team-b/', '')
>>> scope.may_take("team-a/planner", "team-b/coder"), scope.may_take("team-b/planner", "team-b/coder")
(False, True)
>>> scope.may_take("share:style-guide", "team-b/coder"), scope.may_take("share:team-a/brief", "team-b/coder")
(True, False)
>>> TenantScope(()).may_take("team-a/planner", "team-b/coder")  # no tenants: one scope for all
True
>>> scope.of("team-a/@u/4f2a/conv-1"), TenantScope(()).may_take("@u/4f2a/conv-1", "@u/9b0c/conv-2")
('team-a/@u/4f2a/', False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

import agentmem.validation as check
from agentmem.config import check_tenants
from agentmem.errors import ConfigError
from agentmem.memory.shared import SHARE_PREFIX

if TYPE_CHECKING:
    from agentmem.config import PoolConfig

__all__ = ["END_USER_MARK", "TenantMethods", "TenantScope", "TenantUsage"]

END_USER_MARK = "@u/"
"""`{tenant}@u/{name}/...`: an agent in the scope of one end user `name` of the tenant (a tenant itself)."""


class TenantScope:
    """Which agent may take KV cells from which (see the module docstring).

    Args:
        prefixes: the tenants' agent-id prefixes (`()`: one scope for all).
    """

    def __init__(self, prefixes: Iterable[str] = ()) -> None:
        self.prefixes = check_tenants(prefixes)
        self._longest_first = sorted(self.prefixes, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self.prefixes)

    def of(self, agent_id: str) -> str:
        """The tenant of `agent_id` (its longest configured prefix, or its end user's scope under it:
        `END_USER_MARK`; `""`: the default scope).

        A declared share `share:NAME` is in the tenant of `NAME`.
        """
        if agent_id.startswith(SHARE_PREFIX):
            agent_id = agent_id[len(SHARE_PREFIX):]
        tenant = next((p for p in self._longest_first if agent_id.startswith(p)), "")
        if agent_id.startswith(END_USER_MARK, len(tenant)):  # an end user's scope inside the tenant
            end = agent_id.find("/", len(tenant) + len(END_USER_MARK))
            if end > 0:
                return agent_id[: end + 1]
        return tenant

    def may_take(self, donor: str, receiver: str) -> bool:
        """Whether `receiver` may start from cells `donor` holds.

        True inside one tenant, and from a public share (a declared share under no tenant).
        """
        if not self._longest_first and END_USER_MARK not in donor and END_USER_MARK not in receiver:
            return True
        t = self.of(donor)
        return t == self.of(receiver) or (t == "" and donor.startswith(SHARE_PREFIX))


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """What the agents under one prefix keep in a pool (`MemoryPool.tenant_usage`).

    Attributes:
        agents: ids of the agents under the prefix (declared shares not included).
        parked_bytes: bytes of their parked states (WARM and COLD; private cells only
            for an agent with a shared block).
    """

    agents: frozenset[str]
    parked_bytes: int


class TenantMethods:
    """`MemoryPool`'s tenant methods (mixed into the facade; it provides `_core`, `config`, `_check_open`)."""

    _core: Any  # the facade's PoolCore (not imported: state.py imports this module)
    config: PoolConfig
    _check_open: Callable[[], None]  # the facade's method

    def tenant_of(self, agent_id: str) -> str:
        """The tenant `agent_id` belongs to (`""`: the default scope); see `agentmem.pool.tenants`."""
        return self._core.tenants.of(check.agent_id(agent_id, internal=True))

    def add_tenants(self, prefixes: Iterable[str]) -> tuple[str, ...]:
        """Add tenant prefixes to the pool's scope (`PoolConfig.tenants`); the tenants now configured.

        Prefixes already configured are ignored. Agents that already share a block keep
        it; every prefix taken from now on stays inside the new walls. A server adds its
        API keys' prefixes here at start.

        Raises:
            ConfigError: an invalid prefix (see `check_tenants`).
        """
        self._check_open()
        new = check_tenants(prefixes)
        core = self._core
        with core.lock:
            merged = core.tenants.prefixes + tuple(p for p in new if p not in core.tenants.prefixes)
            if merged != core.tenants.prefixes:
                core.tenants = TenantScope(merged)
                core.config = self.config = self.config.replace(tenants=merged)
            return merged

    def tenant_usage(self, prefix: str) -> TenantUsage:
        """The agents under `prefix` (`""`: every agent) and the bytes of their parked states."""
        self._check_open()
        if not isinstance(prefix, str):
            raise ConfigError(f"prefix must be a string, got {type(prefix).__name__}")
        core = self._core
        with core.lock:
            ids = [a for a in core.agents if a.startswith(prefix) and not a.startswith(SHARE_PREFIX)]
            parked = sum(t.nbytes(a) for a in ids for t in core.tiers.values())
        return TenantUsage(frozenset(ids), parked)

    def agent_uses(self, prefix: str) -> dict[str, tuple[float, str]]:
        """`{agent: (last_used, tier)}` of the agents under `prefix` that may be parked or forgotten now.

        `last_used` is `time.monotonic()` at the agent's last call (`0.0`: none since this pool
        opened); agents generating, or claimed by a line lookup, are left out, as are declared
        shares. The server's conversation lifecycle (`agentmem.server.lifecycle`) reads it.
        """
        self._check_open()
        core = self._core
        with core.lock:
            return {aid: (a.last_used, core.where(a)[0]) for aid, a in core.agents.items()
                    if aid.startswith(prefix) and not aid.startswith(SHARE_PREFIX) and not a.held
                    and aid not in core.lines.claims}

    def has_agent(self, agent_id: str) -> bool:
        """Whether the pool knows `agent_id` (without creating it)."""
        self._check_open()
        with self._core.lock:
            return agent_id in self._core.agents
