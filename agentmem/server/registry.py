"""Which model serves a request, held loaded while it runs: a lease on one of the `MemoryPool`'s models.

The engine and the routes see one small object, `Models`, and one result per request,
a `Target`: the agent, a `ModelLease` on the engine of its model, and the
conversation-line claim when its prompt found one. `Target.release` ends both.

The server's pool holds one model or several (`agentmem serve --model A --model B`).
With one, it is the server as it always was: a request may name any model and gets the
one (its engine stays loaded while the server runs, so its lease is taken at once).
With several, a request's `model` picks the model (`UnknownModelError`: 404), an agent
is bound to the model of its first call (`ModelMismatchError`: 400 when a later call
names another), and the lease keeps the model loaded — never unloaded by the budget —
until the call's response has ended. Listings read loaded models under a lease taken
only if the model is loaded and unloaded models from their archive files
(`MemoryPool.agent_stats`, `tenant_usage`), so listing never loads or unloads a model.

Conversation lines are per model by construction: each model's `ModelEngine` keeps its
own lines, so a prompt on model B is matched only against B's lines. A new line's
derived id that another model's line already holds (two models with one tokenizer) is
derived again under `{scope}{model}/`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator

from agentmem.errors import UnknownAgentError
from agentmem.models import MemoryPool, ModelLease
from agentmem.models.seats import alease
from agentmem.pool import ModelEngine
from agentmem.pool.lines import Line
from agentmem.pool.tenants import TenantUsage

__all__ = ["Models", "Target"]


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
    def pool(self) -> ModelEngine:
        """The engine of the agent's model, held by the seat."""
        return self.seat.pool  # type: ignore[no-any-return]

    @property
    def kind(self) -> str:
        """How a request without an agent id found it (`Line.kind`; "" when it named one)."""
        return self.line.kind if self.line is not None else ""

    def release(self) -> None:
        """End the line's claim and the model's lease (idempotent)."""
        if self.line is not None and not self.pool.closed:
            self.pool.release_line(self.line.agent_id)
        self.seat.release()


class Models:
    """The models the engine serves: its `MemoryPool`'s, one or several (see the module docstring).

    Args:
        pool: returns the open pool (a 503 `ApiError` while none is).
        call: runs blocking work in a worker thread the server's shutdown waits for
            (`AgentQueue.call`); a model's load runs there.
        many: the pool holds several models: a request's `model` picks one. Otherwise it is
            the server as it always was: every request gets the one model, whatever it names.
        name: the one model's name in responses (`--model-name`, else the GGUF's stem); with
            `many`, each model's own name.
    """

    def __init__(self, pool: Callable[[], MemoryPool], call: Callable[..., Awaitable[Any]], *, many: bool,
                 name: Callable[[], str] | None = None) -> None:
        self.pool, self._call, self.many, self._name = pool, call, many, name

    @property
    def names(self) -> tuple[str, ...]:
        return self.pool().names

    @property
    def default(self) -> str:
        return self.pool().default

    def choose(self, model: str | None) -> str | None:
        """The model a request's `model` field names (`None`: the agent's or the default); 404 unknown."""
        if not model or not self.many:  # "": the default, as None; one model answers to any name
            return None
        if model.endswith(":latest") and model not in self.names and model[:-7] in self.names:
            return model[:-7]  # Ollama's clients name a model's default tag
        return self.pool().check_model(model)

    def per_key_model(self, model: str | None) -> str | None:
        """The model an `--anonymous per-key` agent id is suffixed with (`None`: no suffix)."""
        return (model or self.default) if self.many else None

    # ------------------------------------------------------------------ leases
    def shown(self, model: str) -> str:
        """The name responses and listings give `model`: its own, or the one model's server name."""
        return model if self.many or self._name is None else self._name()

    def _named(self, lease: ModelLease) -> ModelLease:
        lease.name = self.shown(lease.name)
        return lease

    async def _leased(self, agent_id: str | None, model: str | None) -> ModelLease:
        """A lease at once when the model is loaded, else taken in a worker thread (see `alease`)."""
        pool = self.pool()
        lease = pool.lease_if_loaded(model, agent_id=agent_id)
        if lease is None:
            lease = await alease(functools.partial(pool.lease, agent_id, model=model), call=self._call)
        return self._named(lease)

    async def seat(self, agent_id: str, model: str | None) -> ModelLease:
        """A lease on `agent_id`'s model (binding a new agent to `model`, else the default)."""
        return await self._leased(agent_id, model)

    async def model_seat(self, model: str | None) -> ModelLease:
        """A lease on `model` (`None`: the default), for a call whose agent is not known yet."""
        return await self._leased(None, model)

    async def agent_seat(self, agent_id: str) -> ModelLease:
        """A lease on the model `agent_id` is bound to, for an agent action (404 when unbound)."""
        name = self.pool().model_of(agent_id)
        if name is None:
            raise UnknownAgentError(f"unknown agent {agent_id!r}", agent_id=agent_id)
        return await self._leased(None, name)

    def bind(self, agent_id: str, model: str) -> None:
        """Bind `agent_id` to `model` before its first call (`ModelMismatchError` when bound elsewhere)."""
        self.pool().bind(agent_id, model)

    def forgotten(self, agent_id: str) -> None:
        """`agent_id` was forgotten: end its binding."""
        self.pool().bindings.drop(agent_id)

    def each_loaded(self) -> Iterator[ModelLease]:
        """A lease on each model loaded now, held while the loop body runs (nothing is loaded for this)."""
        for lease in self.pool().each_loaded():
            yield self._named(lease)

    # ------------------------------------------------------------------ what the models hold
    def entries(self, agent_id: str | None = None) -> dict[str, dict[str, Any]]:
        """Each agent's stats (blocking; `MemoryPool.agent_stats`), with its `model` when there are several."""
        entries = self.pool().agent_stats(agent_id)
        if not self.many:
            for v in entries.values():
                v.pop("model", None)
        return entries

    def tenant_usage(self, prefix: str) -> TenantUsage:
        """The agents under `prefix` and their parked bytes, over every model (blocking)."""
        return self.pool().tenant_usage(prefix)

    def stats(self) -> dict[str, dict[str, Any]]:
        """`ModelEngine.stats()` of each loaded model (blocking)."""
        return {lease.name: lease.pool.stats() for lease in self.each_loaded()}

    def storage_fault(self) -> str | None:
        """The first loaded model's archive storage fault (`None`: every archive takes writes)."""
        return self.pool().storage_fault

    def checkpoint(self) -> None:
        """Write every loaded model's agents to its archive (an unloaded model's are there already)."""
        self.pool().checkpoint()
