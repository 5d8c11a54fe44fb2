"""The agent record, the pool's counters and the core every collaborator of a call shares.

`AgentState` is what the pool knows of one agent; `PoolCore` holds the native
context, the tiers, the registries and the lock, and answers the small questions
every phase asks (where an agent's state is, its budget, its codec).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable


from agentmem.errors import UnknownAgentError
from agentmem.memory.ledger import Ledger
from agentmem.memory.parking import ParkCodec, make_park_codec
from agentmem.memory.prefetch import TransitionPredictor
from agentmem.memory.shared import BlockStore, PrefixIndex
from agentmem.memory.tiers import EMPTY, HOT, TIER_NAMES, TierChain
from agentmem.policy.placement import AgentInfo, PlacementPolicy
from agentmem.pool.lines import LineIndex
from agentmem.pool.residence import Residence
from agentmem.pool.tenants import TenantScope
from agentmem.recall.index import RecallIndex

if TYPE_CHECKING:
    from pathlib import Path

    from agentmem.pool.sequence import AgentSeq

    from agentmem.config import PoolConfig
    from agentmem.engine.renderer import ChatRenderer
    from agentmem.engine.context import LlamaContext, LlamaModel
    from agentmem.archive import Archive

__all__ = ["AGENT_COUNTERS", "MISS", "POOL_TOTALS", "AgentState", "PoolCore"]

#: Per-agent counters (also reported under ``stats()["agents"][id]``).
AGENT_COUNTERS = (
    "calls", "restores", "restore_failures", "parks", "demotions", "prefill_tokens", "cached_tokens",
    "evictions", "evicted_tokens",
)
#: The `tier_hits` key of calls whose agent had nothing kept anywhere.
MISS = "miss"
#: Pool-wide counters (``stats()["totals"]``).
POOL_TOTALS = (
    "calls", "restores", "restore_failures", "parks", "demotions", "drops", "prefill_tokens", "cached_tokens",
    "evictions", "evicted_tokens", "recalls", "recall_hits", "prefetches", "prefetch_hits", "prefetch_misses",
    "prefetch_wasted", "resumed_agents", "batched_steps", "batched_tokens", "max_batch",
    "shared_prefix_tokens", "shared_prefix_hits", "handoffs", "blocks_created", "blocks_freed",
    "block_splits", "block_split_misses", "privatized", "seq_waits", "linked_restores", "canonical_calls",
    "closed_calls", "canonical_tokens", "recall_kv_stored", "recall_kv_spliced_tokens",
)


@dataclass(slots=True)
class AgentState:
    """What the pool keeps for one agent.

    Where it lives is its `residence` (`agentmem.pool.residence.Residence`),
    read here through `kv`, `seq`, `tier`, `codec` and `held`, and written only
    by the functions of `agentmem.pool.residence`.

    Invariants (checked by `check`, which the pool calls where a call ends; the
    first and the third hold by construction):

    * `seq` is set exactly while the agent is *hot*: it is `kv.id`, and `kv` (the
      door to its sequence, `agentmem.pool.sequence.AgentSeq`) exists only from the
      sequence's assignment to its release. A hot agent's `tier` is EMPTY (its
      state lives in the sequence, not in a tier).
    * `tier` is EMPTY or the name of a tier of the pool's chain: where the parked state is.
    * `0 <= ledger.n_live <= len(ledger)`; the live cells of `seq` are exactly
      the ledger's live tokens, in order, at positions `0 .. n_live - 1`: only `kv`
      cuts, evicts or loads cells, and it changes the ledger with them (the decoder
      extends both as it decodes).
    * the residence's `calls` (the call running on the agent) and `pins` (holders
      that need it kept in place: a handoff, a donor, a linked restore) are never
      negative; a `held` agent is never parked, forgotten or evicted by another thread.
    * `block`, when set, names a block in the pool's `BlockStore` whose `refs`
      include this agent, and its first `block_tokens` history tokens are the
      block's tokens.
    """

    id: str
    ledger: Ledger = field(default_factory=Ledger)
    residence: Residence = field(default_factory=Residence)
    last_used: float = 0.0
    priority: int = 1
    budget: int = 0
    eviction: str = ""
    n_messages: int = 0
    prefetched: bool = False
    labels: dict[str, Any] = field(default_factory=dict)
    # end of the last prompt (history index, live position), before its reply was generated
    prompt_end: tuple[int, int] = (0, 0)
    # shared KV block its first cells belong to (parked states then keep only the rest)
    block: str | None = None
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(AGENT_COUNTERS, 0))
    evicted_regions: dict[str, int] = field(default_factory=dict)

    @property
    def kv(self) -> AgentSeq | None:
        """The door to its sequence while it is resident, else None."""
        return self.residence.kv

    @property
    def seq(self) -> int | None:
        """Its sequence id while it is resident, else None."""
        kv = self.residence.kv
        return None if kv is None else kv.id

    @property
    def tier(self) -> str:
        """The tier its parked state is in, else EMPTY (a resident agent's state is in its sequence)."""
        return self.residence.tier

    @property
    def held(self) -> bool:
        """Whether a call or a pin holds it (see `agentmem.pool.residence.Residence`)."""
        return self.residence.held

    def check(self) -> None:
        """Assert the invariants that are cheap to check (see the class docstring)."""
        self.residence.check(self.id)
        assert 0 <= self.ledger.n_live <= len(self.ledger), f"{self.id=}, {self.ledger.n_live=}, {len(self.ledger)=}"


class PoolCore:
    """The state every collaborator of a call shares: context, tiers, registries, counters.

    It owns no policy of its own; it answers the questions every phase asks:
    `agent`, `where`, `info`, `budget`, `codec`, `eviction_policy`. All of it
    is guarded by `lock` (the context's re-entrant lock) and `cond`.
    """

    def __init__(
        self,
        *,
        config: PoolConfig,
        model_path: Path,
        model: LlamaModel,
        ctx: LlamaContext,
        renderer: ChatRenderer,
        tiers: TierChain,
        archive: Archive | None,
        recall_store: Archive,
        placement: PlacementPolicy,
        fingerprint: dict[str, Any],
        capacity: int,
    ) -> None:
        self.config = config
        self.model_path = model_path
        self.model = model
        self.ctx = ctx
        self.renderer = renderer
        self.tiers = tiers
        self.archive = archive
        self.recall_store = recall_store
        self.recall = RecallIndex(recall_store, embedder=config.recall_embedder, mode=config.recall_mode,
                                  eager=config.recall_embed == "evict")
        self.placement = placement
        self.fingerprint = fingerprint
        self.capacity = capacity
        self.lock = ctx.lock
        self.cond = threading.Condition(self.lock)
        self.agents: dict[str, AgentState] = {}
        self.tenants = TenantScope(config.tenants)  # who may take KV from whom (`MemoryPool.add_tenants` widens it)
        self.blocks = BlockStore()
        self.prefixes = PrefixIndex()  # radix tree over agents' shareable tokens (refreshed lazily)
        self.lines = LineIndex()  # per-tenant trees over conversation lines (`MemoryPool.find_line`)
        self.predictor = TransitionPredictor()
        self.totals: dict[str, int] = dict.fromkeys(POOL_TOTALS, 0)
        # calls that found their agent in each place (HOT, each tier), or nowhere ("miss")
        self.tier_hits: dict[str, int] = dict.fromkeys((HOT, *TIER_NAMES, *tiers, MISS), 0)
        self.codecs: dict[str, ParkCodec] = {}
        self.closed = False
        # cluster mode: the lease an agent's archive writes must carry (raises when it is not held)
        self.fence: Callable[[str], Any] | None = None

    def agent(self, agent_id: str) -> AgentState:
        """The record of a known agent; `UnknownAgentError` otherwise.

        The message counts the known agents but never names them: another tenant's ids
        must not reach a caller who mistyped its own (#23 finding 2).
        """
        a = self.agents.get(agent_id)
        if a is None:
            raise UnknownAgentError(
                f"unknown agent {agent_id!r} (the pool knows {len(self.agents)} agent(s); "
                "MemoryPool.agents() lists them)",
                agent_id=agent_id,
            )
        return a

    def codec(self, spec: str) -> ParkCodec:
        """The park codec for `spec` (`"f16"`, `"q8_0"`, `"q8_0/q4_0"`…), built once."""
        c = self.codecs.get(spec)
        if c is None:
            c = self.codecs[spec] = make_park_codec(spec, rotate=self.config.park_rotate)
        return c

    @staticmethod
    def eviction_policy(name: str, **params: Any) -> Any:
        """The eviction strategy registered as `name` (`PolicyError` lists the valid names)."""
        from agentmem.policy.eviction import get_policy as get_eviction_policy

        return get_eviction_policy(name, **params)

    def budget(self, a: AgentState) -> int:
        """`a`'s live-token budget (its own, else the pool default; 0 = unlimited)."""
        return a.budget or self.config.agent_budget_tokens

    def where(self, a: AgentState) -> tuple[str, int, str | None]:
        """(place, bytes there, codec) of `a`'s state: HOT, a tier's name, or EMPTY."""
        r = a.residence
        if r.kv is not None:
            return HOT, (self.ctx.state_size(r.kv.id) if a.ledger.n_live else 0), None
        if r.tier in self.tiers:
            return r.tier, self.tiers[r.tier].nbytes(a.id), r.codec
        return EMPTY, 0, None

    def info(self, a: AgentState) -> AgentInfo:
        """What the placement policy sees of `a`."""
        tier, nbytes, _ = self.where(a) if a.seq is None else (HOT, a.ledger.n_live * 20_000, None)
        return AgentInfo(
            id=a.id, tier=tier, nbytes=nbytes, n_tokens=a.ledger.n_live, priority=a.priority,
            idle_s=max(0.0, time.monotonic() - a.last_used), uses=a.counters["calls"],
            next_in=self.predictor.distance(a.id),
        )
