"""The lifecycle of anonymous conversations: parked when idle, then forgotten; a per-key cap with LRU forgetting.

A request that names no agent runs as the conversation line its history continues, or a new
one (`agentmem.pool.lines`): every new conversation, retry, branch or side request of a client
that never names agents is an agent. Before #33 (F3) none was ever forgotten: after 256 the
key got 429 on every route until someone called `DELETE /agents/{id}`, which default clients
never do, and without keys nothing bounded them. Now, by policy (`ServerSettings`):

| state of an anonymous conversation | when | setting (flag) |
|---|---|---|
| parked (to the archive's cold tier when there is one, else warm) | idle `line_park_s` | 300 s (`--line-park`) |
| forgotten | idle `line_idle_s` | 3600 s (`--line-idle`) |
| forgotten, least recently used first | a new one would make more than `max_lines_per_key` | 64 (`--max-lines`) |
| forgotten, least recently used first | a new one would pass the key's `max_agents` | 256 (`--max-agents`) |

so a key used normally never hits a wall: its 257th conversation forgets its least recently
used one instead of getting a 429 (quotas count what is kept). The cap holds per key on a
server with keys, for the admin keys too, and for the one principal of a server without keys.
Only conversations that are neither generating nor claimed by a request are forgotten.

**Which agents are conversations.** Those the server named for a request without an agent
id: `{scope}conv-<16 hex digits>` (`is_line`; older `conv-<12 hex>` ids too). An agent named
by its client (`X-Agent-Id`, `user`, `agent_id`) is never parked or forgotten by this policy:
it is kept until it is forgotten (`DELETE /agents/{id}`); the pool's budget still parks it.

**Where a key's conversations live** (`key_space`): under a scoped key's prefix; under
`@admin/<key name>/` for an admin key (no scoped key may hold a prefix that overlaps it:
`auth.ApiKey.make`), so no tenant can list or continue them (#33 F5); at the top level on a
server without keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Any, Awaitable, Callable, Iterator

from agentmem.errors import AgentMemError
from agentmem.memory.tiers import COLD, HOT, WARM
from agentmem.server.auth import Principal, key_space
from agentmem.server.quotas import Quotas, UsageSource
from agentmem.server.registry import Target
from agentmem.server.settings import ServerSettings

__all__ = ["Lifecycle", "is_line"]

logger = logging.getLogger(__name__)

_LINE = re.compile(r"(?:^|/)conv-[0-9a-f]{12,}(?:-\d+)?$")


def is_line(agent_id: str) -> bool:
    """Whether `agent_id` is an anonymous conversation the server named (`{scope}conv-<hex>`).

    >>> is_line("team-a/conv-3f9c0a1b2c3d4e5f"), is_line("conv-8b1afe8cc950-2"), is_line("team-a/planner")
    (True, True, False)
    """
    return _LINE.search(agent_id) is not None


class Lifecycle:
    """Parks and forgets the anonymous conversations of a server by policy (see the module docstring).

    Args:
        settings: the policy (`max_lines_per_key`, `line_park_s`, `line_idle_s`).
        quotas: the keys' quotas (`max_agents`, and which agents are a key's own).
        usage: what every model keeps (`Models.tenant_usage`, blocking).
        pools: each loaded model's pool, held while the loop body runs (blocking).
        call: runs blocking work in a worker thread (`AgentQueue.call`).
        forget: forgets an agent the way `DELETE /agents/{id}` does (`Engine.forget`).
        park: parks an agent in a tier (`Engine.park`).
        observe: counts each action (`parked`, `forgotten_idle`, `forgotten_cap`; `/metrics`'
            `agentmem_conversations_total`).
    """

    def __init__(self, settings: ServerSettings, *, quotas: Quotas, usage: UsageSource,
                 pools: Callable[[], Iterator[Any]], call: Callable[..., Awaitable[Any]],
                 forget: Callable[[str], Awaitable[Any]], park: Callable[[str, str], Awaitable[Any]],
                 observe: Callable[[str], None] = lambda action: None) -> None:
        self.settings, self.quotas, self.usage = settings, quotas, usage
        self._pools, self._call, self._forget_agent, self._park = pools, call, forget, park
        self._observe = observe
        self._started = time.monotonic()  # an agent not used since this start counts as used at it
        self._task: asyncio.Task[None] | None = None
        self.forgotten = 0
        self.parked = 0

    def _uses(self, prefix: str) -> dict[str, tuple[float, str, Any]]:
        """`{line: (last used, tier, pool)}` of the forgettable conversations under `prefix` (blocking)."""
        out: dict[str, tuple[float, str, Any]] = {}
        for pool in self._pools():
            for aid, (used, tier) in pool.agent_uses(prefix).items():
                if is_line(aid):
                    out[aid] = (max(used, self._started), tier, pool)
        return out

    def _survey(self, principal: Principal) -> tuple[int, int, list[str]]:
        """`(conversations, agents, forgettable conversations least recently used first)` of a key (blocking)."""
        space = key_space(principal)
        kept = self.quotas.own_agents(principal, self.usage.tenant_usage(space).agents)
        uses = {a: u for a, u in self._uses(space).items() if a in kept}
        return (sum(1 for a in kept if is_line(a)), len(kept), sorted(uses, key=lambda a: (uses[a][0], a)))

    async def make_room(self, principal: Principal, target: Target) -> None:
        """Before a new conversation's first call: forget the key's least recently used ones past its caps."""
        if target.kind not in ("new", "branched"):
            return
        cap = self.settings.max_lines_per_key
        max_agents, _ = self.quotas.limits(principal)
        if not (cap or max_agents):
            return
        n_lines, n_agents, lru = await self._call(self._survey, principal)
        excess = max(n_lines + 1 - cap if cap else 0, n_agents + 1 - max_agents if max_agents else 0)
        for aid in lru:
            if excess <= 0:
                break
            if aid != target.agent_id and await self._forget(aid, "forgotten_cap"):
                excess -= 1

    async def _forget(self, agent_id: str, why: str) -> bool:
        try:
            await self._forget_agent(agent_id)
        except AgentMemError as exc:  # it started generating, or is gone already
            logger.debug("lifecycle: %s kept (%s)", agent_id, exc)
            return False
        self.forgotten += 1
        self._observe(why)
        return True

    # ------------------------------------------------------------------ idle conversations
    async def sweep(self) -> None:
        """Park the conversations idle `line_park_s`, forget those idle `line_idle_s` (every key's)."""
        park_s, idle_s = self.settings.line_park_s, self.settings.line_idle_s
        now = time.monotonic()
        for aid, (used, tier, pool) in sorted((await self._call(self._uses, "")).items()):
            idle = now - used
            if idle_s and idle >= idle_s:
                await self._forget(aid, "forgotten_idle")
            elif park_s and idle >= park_s and tier in (HOT, WARM):
                cold = bool(pool.config.archive_path or getattr(pool.config, "archive_url", None))
                if tier == WARM and not cold:
                    continue
                with contextlib.suppress(AgentMemError):
                    await self._park(aid, COLD if cold else WARM)
                    self.parked += 1
                    self._observe("parked")

    @property
    def period_s(self) -> float:
        """How often `sweep` runs: a quarter of the shorter idle time, within [0.05, 60] s (0: never)."""
        times = [t for t in (self.settings.line_park_s, self.settings.line_idle_s) if t]
        return min(60.0, max(0.05, min(times) / 4)) if times else 0.0

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad sweep must not end the policy
                logger.exception("lifecycle: sweep failed")

    def start(self) -> None:
        """Run `sweep` every `period_s` on the event loop (no-op when both idle times are 0)."""
        if self.period_s and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="agentmem-lifecycle")

    async def stop(self) -> None:
        """Stop the sweeps (before the pool closes)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
