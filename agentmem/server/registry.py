"""Which model serves a request, held loaded while it runs: one `MemoryPool`, or a `ModelPool`'s models.

The engine and the routes see one small interface, `Models`, and one result per
request, a `Target`: the agent, a `ModelLease` on the pool of its model, and the
conversation-line claim when its prompt found one. `Target.release` ends both.

* `OneModel` is the server as it always was: one `MemoryPool`; a request may name any
  model and gets that one (the lease holds nothing: the pool stays open while the
  server runs).
* `ManyModels` serves a `ModelPool` (`agentmem serve --model A --model B`): a request's
  `model` picks the model (`UnknownModelError`: 404), an agent is bound to the model of
  its first call (`ModelMismatchError`: 400 when a later call names another), and the
  lease keeps the model loaded — never unloaded by the budget — until the call's
  response has ended. Listings read loaded models under a lease taken only if the model
  is loaded (`ModelPool.lease_if_loaded`) and unloaded models from their archive files
  (tier `cold`; the counters the archive does not keep are `None`), so listing never
  loads or unloads a model.

Conversation lines are per model by construction: each model's `MemoryPool` keeps its
own lines, so a prompt on model B is matched only against B's lines. A new line's
derived id that another model's line already holds (two models with one tokenizer) is
derived again under `{scope}{model}/`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Protocol

from agentmem.archive import open_archive
from agentmem.errors import UnknownAgentError
from agentmem.memory.shared import SHARE_PREFIX
from agentmem.memory.tiers import COLD
from agentmem.models import ModelLease, ModelPool
from agentmem.models.seats import alease
from agentmem.pool import MemoryPool
from agentmem.pool.lines import Line
from agentmem.pool.tenants import TenantUsage

__all__ = ["ManyModels", "Models", "OneModel", "Target"]

#: what an unloaded model's archive does not say of its agents (`null` in `/agents`, not a made-up 0)
_UNKNOWN_UNLOADED = dict.fromkeys(("budget", "calls", "restores", "parks", "cached_tokens", "prefill_tokens",
                                   "evictions"))


@dataclass(eq=False)
class Target:
    """Who a call runs as and on which model: its agent, the model's lease, the line it continues.

    Attributes:
        agent_id: the agent.
        seat: the lease on the agent's model (`seat.pool` is the pool the call runs on).
        line: the claim `find_line` took when the request named no agent (`None`: named).
    """

    agent_id: str
    seat: ModelLease
    line: Line | None = None

    @property
    def model(self) -> str:
        """The model's name (what responses carry in `model`)."""
        return self.seat.name

    @property
    def pool(self) -> MemoryPool:
        return self.seat.pool

    @property
    def kind(self) -> str:
        """How a request without an agent id found it (`Line.kind`; "" when it named one)."""
        return self.line.kind if self.line is not None else ""

    def release(self) -> None:
        """End the line's claim and the model's lease (idempotent)."""
        if self.line is not None and not self.pool.closed:
            self.pool.release_line(self.line.agent_id)
        self.seat.release()


class Models(Protocol):
    """What the engine asks of the models it serves (`OneModel` or `ManyModels`)."""

    many: bool

    def choose(self, model: str | None) -> str | None:
        """The model a request's `model` field names (`None`: the agent's or the default); 404 unknown."""

    def per_key_model(self, model: str | None) -> str | None:
        """The model an `--anonymous per-key` agent id is suffixed with (`None`: no suffix)."""

    async def seat(self, agent_id: str, model: str | None) -> ModelLease:
        """A lease on `agent_id`'s model (binding a new agent to `model`, else the default)."""

    async def model_seat(self, model: str | None) -> ModelLease:
        """A lease on `model` (`None`: the default), for a call whose agent is not known yet."""

    async def agent_seat(self, agent_id: str) -> ModelLease:
        """A lease on the model `agent_id` is bound to, for an agent action (404 when unbound)."""

    def bind(self, agent_id: str, model: str) -> None:
        """Bind `agent_id` to `model` before its first call (`ModelMismatchError` when bound elsewhere)."""

    def forgotten(self, agent_id: str) -> None:
        """`agent_id` was forgotten: end its binding."""

    def entries(self, agent_id: str | None = None) -> dict[str, dict[str, Any]]:
        """`MemoryPool.stats()["agents"]` of every model (blocking), or of `agent_id`'s model only."""

    def tenant_usage(self, prefix: str) -> TenantUsage:
        """The agents under `prefix` and their parked bytes, over every model (blocking)."""


class OneModel:
    """One `MemoryPool`, today's server: every request gets it, whatever model it names.

    Args:
        pool: returns the open pool (a 503 `ApiError` while none is).
        name: returns the model's name (`--model-name` or the GGUF's stem).
    """

    many = False

    def __init__(self, pool: Callable[[], MemoryPool], name: Callable[[], str]) -> None:
        self._pool, self._name = pool, name

    def choose(self, model: str | None) -> str | None:
        return None

    def per_key_model(self, model: str | None) -> str | None:
        return None

    def _lease(self, agent_id: str | None = None) -> ModelLease:
        return ModelLease(name=self._name(), pool=self._pool(), agent_id=agent_id)

    async def seat(self, agent_id: str, model: str | None) -> ModelLease:
        return self._lease(agent_id)

    async def model_seat(self, model: str | None) -> ModelLease:
        return self._lease()

    async def agent_seat(self, agent_id: str) -> ModelLease:
        return self._lease(agent_id)

    def bind(self, agent_id: str, model: str) -> None:
        return None

    def forgotten(self, agent_id: str) -> None:
        return None

    def entries(self, agent_id: str | None = None) -> dict[str, dict[str, Any]]:
        return self._pool().stats()["agents"]

    def tenant_usage(self, prefix: str) -> TenantUsage:
        return self._pool().tenant_usage(prefix)


class ManyModels:
    """The models of a `ModelPool` (see the module docstring).

    Args:
        team: the open model pool.
        call: runs blocking work in a worker thread the server's shutdown waits for
            (`AgentQueue.call`); a model's load runs there.
    """

    many = True

    def __init__(self, team: ModelPool, call: Callable[..., Awaitable[Any]]) -> None:
        self.team, self._call = team, call
        self._archived: dict[str, tuple[tuple[int, int], list[Any]]] = {}  # model -> (its load counts, rows)

    @property
    def names(self) -> tuple[str, ...]:
        return self.team.names

    @property
    def default(self) -> str:
        return self.team.bindings.default

    def choose(self, model: str | None) -> str | None:
        if not model:  # "": the default, as None
            return None
        if model.endswith(":latest") and model not in self.names and model[:-7] in self.names:
            return model[:-7]  # Ollama's clients name a model's default tag
        return self.team.bindings.check_model(model)

    def per_key_model(self, model: str | None) -> str | None:
        return model or self.default

    # ------------------------------------------------------------------ leases
    async def _leased(self, take: Callable[[], ModelLease]) -> ModelLease:
        """`take()` in a worker thread the shutdown waits for (it may load a model); see `alease`."""
        return await alease(take, call=self._call)

    async def seat(self, agent_id: str, model: str | None) -> ModelLease:
        return await self._leased(functools.partial(self.team.lease, agent_id, model=model))

    async def model_seat(self, model: str | None) -> ModelLease:
        return await self._leased(functools.partial(self.team.lease, model=model))

    async def agent_seat(self, agent_id: str) -> ModelLease:
        name = self.team.model_of(agent_id)
        if name is None:
            raise UnknownAgentError(f"unknown agent {agent_id!r}", agent_id=agent_id)
        return await self._leased(functools.partial(self.team.lease, model=name))

    def bind(self, agent_id: str, model: str) -> None:
        self.team.bind(agent_id, model)

    def forgotten(self, agent_id: str) -> None:
        self.team.bindings.drop(agent_id)

    def each_loaded(self) -> Iterator[ModelLease]:
        """A lease on each model loaded now, held while the loop body runs (nothing is loaded for this)."""
        for name in self.names:
            lease = self.team.lease_if_loaded(name)
            if lease is not None:
                with lease:
                    yield lease

    # ------------------------------------------------------------------ what the models hold
    def _archive_rows(self, name: str) -> list[Any]:
        """The agents in an unloaded model's archive file (`AgentRecord`s), read once per unload."""
        slot = self.team.tier.slots[name]
        stamp = (slot.loads, slot.unloads)
        cached = self._archived.get(name)
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
            self._archived[name] = (stamp, rows)
        return rows

    def _model_entries(self, name: str) -> dict[str, dict[str, Any]]:
        lease = self.team.lease_if_loaded(name)
        if lease is not None:
            with lease:
                agents = lease.pool.stats()["agents"]
            return {k: {**v, "model": name} for k, v in agents.items()}
        return {r.agent_id: {"model": name, "tier": COLD, "tokens": r.ledger_tokens, "live_tokens": 0,
                             "bytes": r.state_bytes, "codec": r.codec, "priority": r.priority,
                             "share": r.agent_id.startswith(SHARE_PREFIX), **_UNKNOWN_UNLOADED}
                for r in self._archive_rows(name)}

    def entries(self, agent_id: str | None = None) -> dict[str, dict[str, Any]]:
        """Each agent's stats with its `model`: a loaded model's from its pool, an unloaded one's from its archive."""
        if agent_id is not None:
            name = self.team.model_of(agent_id)
            return {} if name is None else self._model_entries(name)
        out: dict[str, dict[str, Any]] = {}
        for name in self.names:
            for k, v in self._model_entries(name).items():
                out.setdefault(k, v)
        return out

    def tenant_usage(self, prefix: str) -> TenantUsage:
        """The agents every model keeps under `prefix` and their parked bytes (an unloaded model's: its archive's).

        A binding alone is not an agent: a new agent's first call binds it before the quota check.
        """
        agents: set[str] = set()
        parked = 0
        for name in self.names:
            lease = self.team.lease_if_loaded(name)
            if lease is not None:
                with lease:
                    usage = lease.pool.tenant_usage(prefix)
                agents |= usage.agents
                parked += usage.parked_bytes
                continue
            rows = [r for r in self._archive_rows(name)
                    if r.agent_id.startswith(prefix) and not r.agent_id.startswith(SHARE_PREFIX)]
            agents.update(r.agent_id for r in rows)
            parked += sum(r.state_bytes for r in rows)
        return TenantUsage(frozenset(agents), parked)

    def stats(self) -> dict[str, dict[str, Any]]:
        """`MemoryPool.stats()` of each loaded model (blocking)."""
        out = {}
        for lease in self.each_loaded():
            out[lease.name] = lease.pool.stats()
        return out

    def storage_fault(self) -> str | None:
        """The first loaded model's archive storage fault (`None`: every archive takes writes)."""
        faults = [lease.pool.storage_fault for lease in self.each_loaded()]
        return next((f for f in faults if f), None)

    def checkpoint(self) -> None:
        """Write every loaded model's agents to its archive (an unloaded model's are there already)."""
        for lease in self.each_loaded():
            lease.pool.checkpoint()
