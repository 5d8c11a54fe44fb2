"""`MemoryPool`'s agent operations, each run on the agent's model: one API for one model or many.

Mixed into `agentmem.models.pool.MemoryPool`, which provides `bindings`, `tier`, `names`,
`default`, `lease`, `lease_if_loaded`, `each_loaded`, `model_of`, `config_of` and
`_check_open`. An operation on an existing agent runs on the model it is bound to
(`UnknownAgentError` for an agent no model holds); one that may create the agent
(`set_priority`, `set_budget`) binds it like a first call: to `model`, else the default.
What names no agent (`share`, `find_line`, `count_tokens`) runs on `model`, else the
default. Reads that span the pool (`agents`, `stats`, `tenant_usage`, `checkpoint`) visit
the loaded models and never load one. In a pool of one, every agent is its model's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from agentmem.archive import EvictedSpan
from agentmem.errors import ModelMismatchError, UnknownAgentError
from agentmem.memory.shared import HandoffCard
from agentmem.memory.tiers import WARM
from agentmem.models.hinting import HintRouting
from agentmem.models.listing import ArchivedAgents
from agentmem.models.pool_stats import merged
from agentmem.pool.lines import Line
from agentmem.pool.tenants import TenantScope, TenantUsage
from agentmem.tools.formats import ToolFormat

if TYPE_CHECKING:
    from agentmem.config import PoolConfig
    from agentmem.models.bindings import Bindings
    from agentmem.models.lease import ModelLease
    from agentmem.models.tier import ModelTier

__all__ = ["AgentOperations"]


class AgentOperations(HintRouting):
    """The agent operations of `MemoryPool` (see the module docstring)."""

    bindings: Bindings
    tier: ModelTier
    names: tuple[str, ...]
    default: str
    _check_open: Callable[[], None]
    lease: Callable[..., ModelLease]
    lease_if_loaded: Callable[[str], ModelLease | None]
    each_loaded: Callable[[], Iterator[ModelLease]]
    model_of: Callable[[str], str | None]
    config_of: Callable[..., PoolConfig]
    _archived: ArchivedAgents

    def _agent_lease(self, agent_id: str) -> ModelLease:
        """A lease on the model `agent_id` is bound to (no call counted).

        Raises:
            UnknownAgentError: no model holds the agent.
        """
        self._check_open()
        name = self.model_of(agent_id)
        if name is None:
            raise UnknownAgentError(f"no agent {agent_id!r}", agent_id=agent_id)
        return self.lease(model=name)

    # ------------------------------------------------------------------ one agent
    def forget(self, agent_id: str) -> None:
        """Drop everything kept for `agent_id` (sequence, parked states, ledger, archive rows) and its binding."""
        with self._agent_lease(agent_id) as lease:
            lease.pool.forget(agent_id)
        self.bindings.drop(agent_id)

    def park(self, agent_id: str, tier: str = WARM) -> None:
        """Move `agent_id`'s KV out of its live sequence into `tier` (`warm` or `cold`) now."""
        with self._agent_lease(agent_id) as lease:
            lease.pool.park(agent_id, tier)

    def set_priority(self, agent_id: str, priority: int | str, *, model: str | None = None) -> None:
        """`"foreground"`, `"normal"`, `"background"` or an int weight (creates the agent if new, on `model`)."""
        with self.lease(model=self.bindings.route(agent_id, model)) as lease:
            lease.pool.set_priority(agent_id, priority)

    def set_budget(self, agent_id: str, tokens: int, eviction: str | None = None, *, model: str | None = None) -> None:
        """Give `agent_id` its own live-token budget (`0` = the model's default) and eviction policy."""
        with self.lease(model=self.bindings.route(agent_id, model)) as lease:
            lease.pool.set_budget(agent_id, tokens, eviction)

    def pin(self, agent_id: str, message_index: int, pinned: bool = True) -> int:
        """Pin (never evict) the tokens of message `message_index` of `agent_id`; returns their count."""
        with self._agent_lease(agent_id) as lease:
            return lease.pool.pin(agent_id, message_index, pinned)  # type: ignore[no-any-return]

    def recall(self, agent_id: str, query: str, k: int = 5, *, mode: str | None = None) -> list[EvictedSpan]:
        """The `k` evicted spans of `agent_id` that best match `query`, by meaning or keyword
        (`ModelEngine.recall`; `[]`: an agent bound to no model yet)."""
        if self.model_of(agent_id) is None:
            return []
        with self._agent_lease(agent_id) as lease:
            return lease.pool.recall(agent_id, query, k, mode=mode)  # type: ignore[no-any-return]

    def pin_recall(self, agent_id: str, pinned: bool = True) -> None:
        """`ModelEngine.pin_recall`: keep `agent_id`'s span vectors in RAM ahead of other agents'
        (no-op for an agent bound to no model yet)."""
        if self.model_of(agent_id) is None:
            return
        with self._agent_lease(agent_id) as lease:
            lease.pool.pin_recall(agent_id, pinned)

    def set_recall_embedder(self, embedder: Any, *, mode: str | None = None, model: str | None = None) -> None:
        """`ModelEngine.set_recall_embedder` on `model` (default: the default model; loads it)."""
        self._check_open()
        with self.lease(model=model or self.default) as lease:
            lease.pool.set_recall_embedder(embedder, mode=mode)

    @property
    def recall_embedder(self) -> Any:
        """The default model's embedder of recall by meaning (`None`: keyword only, or that model is not loaded)."""
        lease = self.lease_if_loaded(self.default)
        if lease is None:
            return None
        with lease:
            return lease.pool.recall_embedder

    def recall_stats(self, *, model: str | None = None) -> dict[str, Any]:
        """`ModelEngine.recall_stats` of `model` (default: the default model; loads it)."""
        self._check_open()
        with self.lease(model=model or self.default) as lease:
            return lease.pool.recall_stats()  # type: ignore[no-any-return]

    def tokens(self, agent_id: str) -> list[int]:
        """The tokens whose KV `agent_id` holds (live ledger tokens, in KV order)."""
        with self._agent_lease(agent_id) as lease:
            return lease.pool.tokens(agent_id)  # type: ignore[no-any-return]

    def history_tokens(self, agent_id: str) -> list[int]:
        """Every token of `agent_id`'s history, evicted ones included."""
        with self._agent_lease(agent_id) as lease:
            return lease.pool.history_tokens(agent_id)  # type: ignore[no-any-return]

    def commit(self, agent_id: str) -> bool:
        """Write `agent_id`'s ledger and state to its model's archive now (False while it is generating)."""
        with self._agent_lease(agent_id) as lease:
            return lease.pool.commit(agent_id)  # type: ignore[no-any-return]

    def has_agent(self, agent_id: str) -> bool:
        """Whether a loaded model knows `agent_id` (an unloaded model's agents: whether it is bound to one)."""
        name = self.model_of(agent_id)
        if name is None:
            return False
        lease = self.lease_if_loaded(name)
        if lease is None:
            return self.bindings.of(agent_id) is not None
        with lease:
            return lease.pool.has_agent(agent_id)  # type: ignore[no-any-return]

    def tenant_of(self, agent_id: str) -> str:
        """The tenant `agent_id` belongs to (`""`: the default scope); see `agentmem.pool.tenants`."""
        return TenantScope(self.config_of(self.model_of(agent_id)).tenants).of(agent_id)

    # ------------------------------------------------------------------ two agents, shares, lines
    def share(self, name: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None) -> int:
        """Declare a shared prefix on `model` (else the default): see `ModelEngine.share`; returns its tokens."""
        with self.lease(model=model) as lease:
            return lease.pool.share(name, messages)  # type: ignore[no-any-return]

    def handoff(self, src: str, dst: str, upto: int | None = None, *, model: str | None = None) -> HandoffCard:
        """Start `dst`'s context as `src`'s (its first `upto` history tokens), on `src`'s model, without recompute.

        `model` names the model of a source no binding knows (a declared share); `dst` is bound to it.

        Raises:
            ModelMismatchError: `dst` is bound to another model than `src`.
        """
        name = self.model_of(src) or self.check_model(model) or self.default
        bound = self.bindings.of(dst)
        if bound is not None and bound != name:
            raise ModelMismatchError(f"model: agent {dst!r} is bound to model {bound!r}; a handoff from {src!r} "
                                     f"runs on {name!r}", agent_id=dst, bound=bound, asked=name)
        with self.lease(model=name) as lease:
            card = lease.pool.handoff(src, dst, upto)
        self.bindings.bind(dst, name)
        return card  # type: ignore[no-any-return]

    def find_line(self, messages: Iterable[Mapping[str, Any]] | None = None, *, prompt: str | None = None,
                  tools: Sequence[Mapping[str, Any]] | None = None, scope: str = "", claim: bool = True,
                  model: str | None = None) -> Line:
        """The agent a call without an agent id should run as, among `model`'s lines (`ModelEngine.find_line`)."""
        with self.lease(model=model) as lease:
            return lease.pool.find_line(messages, prompt=prompt, tools=tools, scope=scope,  # type: ignore[no-any-return]
                                        claim=claim)

    def release_line(self, agent_id: str) -> None:
        """End the claim `find_line` took on `agent_id` (no-op when there is none); takes no pool lock."""
        for name in self.tier.loaded():
            engine = self.tier.slots[name].pool
            if engine is not None:
                engine.release_line(agent_id)

    def count_tokens(self, messages: Iterable[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
                     model: str | None = None) -> int:
        """Prompt tokens the messages (and `tools`) render to on `model` (else the default), chat template included."""
        with self.lease(model=model) as lease:
            return lease.pool.count_tokens(messages, tools=tools)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ the whole pool
    def agents(self) -> list[str]:
        """Ids of the agents the pool knows: every loaded model's, and those bound to an unloaded one."""
        self._check_open()
        out: dict[str, None] = {}
        for lease in self.each_loaded():
            out.update(dict.fromkeys(lease.pool.agents()))
        for name in self.names:
            if self.tier.slots[name].state != "loaded":
                out.update(dict.fromkeys(self.bindings.agents(name)))
        return list(out)

    def stats(self) -> dict[str, Any]:
        """Where every agent's KV lives and what the pool did: one shape for one model or many.

        `agents`, `tiers`, `totals`, `shared` and `hints` pool-wide (as `ModelEngine.stats()`
        has them; merged over the loaded models, each agent tagged with its `model`, see
        `agentmem.models.pool_stats`), plus `models` (`models()`), `pools` (each loaded model's
        `ModelEngine.stats()`), `budget` and `workflow`.
        """
        models: list[dict[str, Any]] = self.models()  # type: ignore[attr-defined]
        pools = {lease.name: lease.pool.stats() for lease in self.each_loaded()}
        return {**merged(pools), "models": models, "pools": pools,
                "budget": {"ram_budget_bytes": self.tier.ram_budget, "vram_budget_bytes": self.tier.vram_budget,
                           "policy": self.tier.policy.name},
                "workflow": self.workflow.stats()}

    def agent_stats(self, agent_id: str | None = None) -> dict[str, dict[str, Any]]:
        """Each agent's entry of `ModelEngine.stats()["agents"]` with its `model`, over every model.

        A loaded model's from its engine, an unloaded one's from its archive file (tier `cold`;
        the counters the archive does not keep are `None`): nothing is loaded for this. With
        `agent_id`: the entries of that agent's model only (`{}`: bound to no model).
        """
        names = self.names if agent_id is None else [n for n in [self.model_of(agent_id)] if n is not None]
        out: dict[str, dict[str, Any]] = {}
        for name in names:
            lease = self.lease_if_loaded(name)
            if lease is None:
                entries = self._archived.entries(self.tier.slots[name])
            else:
                with lease:
                    entries = {k: {**v, "model": name} for k, v in lease.pool.stats()["agents"].items()}
            for k, v in entries.items():
                out.setdefault(k, v)
        return out

    def agent_uses(self, prefix: str) -> dict[str, tuple[float, str]]:
        """`ModelEngine.agent_uses` over every loaded model (an unloaded model's agents are idle in its archive)."""
        out: dict[str, tuple[float, str]] = {}
        for lease in self.each_loaded():
            out.update(lease.pool.agent_uses(prefix))
        return out

    def tenant_usage(self, prefix: str) -> TenantUsage:
        """The agents under `prefix` and the bytes of their parked states, over every model.

        An unloaded model's from its archive file (nothing is loaded for this). A binding alone
        is not an agent: a new agent's first call binds it before a quota is checked.
        """
        agents: set[str] = set()
        parked = 0
        for name in self.names:
            lease = self.lease_if_loaded(name)
            if lease is None:
                ids, stored = self._archived.usage(self.tier.slots[name], prefix)
                agents |= ids
                parked += stored
                continue
            with lease:
                usage = lease.pool.tenant_usage(prefix)
            agents |= usage.agents
            parked += usage.parked_bytes
        return TenantUsage(frozenset(agents), parked)

    def add_tenants(self, prefixes: Iterable[str]) -> tuple[str, ...]:
        """Add tenant prefixes to every model (`ModelEngine.add_tenants`; the unloaded ones get them at load)."""
        prefixes = tuple(prefixes)
        with self.tier.cond:
            for slot in self.tier.slots.values():
                if slot.pool is not None and not slot.pool.closed:
                    slot.pool.add_tenants(prefixes)
                slot.config = slot.config.replace(tenants=tuple(dict.fromkeys(slot.config.tenants + prefixes)))
        return self.config_of().tenants

    def checkpoint(self) -> None:
        """Write every loaded model's agents to its archive (an unloaded model's are there already)."""
        for lease in self.each_loaded():
            lease.pool.checkpoint()

    @property
    def storage_fault(self) -> str | None:
        """Why an archive refused the last write for lack of space (the first loaded model's that did; else None)."""
        return next((f for f in (lease.pool.storage_fault for lease in self.each_loaded()) if f), None)

    # ------------------------------------------------------------------ the default model's engine
    @property
    def tool_format(self) -> ToolFormat:
        """The default model's tool-call syntax (`agentmem.tools.formats`); `engine(model).tool_format` for another."""
        return self.engine().tool_format  # type: ignore[attr-defined,no-any-return]

    @property
    def capacity(self) -> int:
        """The default model's context capacity in tokens."""
        return self.engine().capacity  # type: ignore[attr-defined,no-any-return]

    @property
    def model_path(self) -> Any:
        """The default model's GGUF file (`pathlib.Path`)."""
        return self.tier.slots[self.default].model_path

    @property
    def renderer(self) -> Any:
        """The default model's chat renderer."""
        return self.engine().renderer  # type: ignore[attr-defined]

    @property
    def batch_wait_s(self) -> float:
        """How long a decode-batch leader of the default model waits for other generating agents (seconds)."""
        return self.engine().batch_wait_s  # type: ignore[attr-defined,no-any-return]

    @batch_wait_s.setter
    def batch_wait_s(self, seconds: float) -> None:
        for lease in self.each_loaded():
            lease.pool.batch_wait_s = seconds
