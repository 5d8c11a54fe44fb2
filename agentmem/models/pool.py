"""`ModelPool`: agents on several models, one memory budget for weights and KV.

Each model is a `MemoryPool` of its own (its context, sequences, parked KV, shared
blocks, fingerprints and archive file); the model pool binds every agent to one model
(`agentmem.models.bindings`), loads and unloads models within one budget
(`agentmem.models.tier`), and prefetches the model of the agent expected next — from
the workflow hints (`expect`), else from the order calls came in before — in the
background, off the critical path.

Real output on the two bundled models, 2 CPU cores, a budget that holds one model at a
time (`benchmarks/models.py` measures it at scale):

>>> from agentmem.models import ModelPool
>>> team = ModelPool({"planner": "gemma-3-270m", "coder": "qwen2.5-coder-0.5b-instruct"},  # doctest: +SKIP
...                  ram_budget_bytes=600 << 20, archive_dir="team-archive", n_ctx=2048, resident_agents=2)
>>> msgs = [{"role": "user", "content": "Name a colour."}]  # the coder's call unloads the planner, and back
>>> team.chat("plan", msgs, model="planner", max_tokens=4).kv  # doctest: +SKIP
'prefilled'
>>> team.chat("code", msgs, model="coder", max_tokens=4).kv  # doctest: +SKIP
'prefilled'
>>> team.chat("plan", msgs, max_tokens=4).kv  # doctest: +SKIP
'restored'
>>> team.chat("plan", msgs, model="coder")  # doctest: +SKIP
Traceback (most recent call last):
...
agentmem.errors.ModelMismatchError: model: agent 'plan' is bound to model 'planner'; its KV cannot be used by 'coder' ...
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

from agentmem.config import PoolConfig
from agentmem.errors import ConfigError, PoolClosedError, UnknownAgentError
from agentmem.memory.tiers import WARM
from agentmem.model import resolve_model_path
from agentmem.models.bindings import Bindings
from agentmem.models.lease import ModelLease
from agentmem.models import policy as _policy
from agentmem.models.specs import ModelSpec, specs_of
from agentmem.models.tier import ModelSlot, ModelTier
from agentmem.models.workflow import Workflow
from agentmem.pool import ChatResult, ChatStream, MemoryPool
from agentmem.pool.results import drive_async

__all__ = ["ModelPool"]

logger = logging.getLogger(__name__)


class _Cancel:
    """`ChatStream`'s cancel hook, forwarded to the model's own stream."""

    def __init__(self, inner: ChatStream) -> None:
        self.inner = inner

    def set(self, reason: str) -> None:
        del reason
        self.inner.cancel()


class ModelPool:
    """Agents driven by different models, in one memory budget (see the module docstring).

    Args:
        models: `{name: bundled model name | GGUF path | ModelSpec}`.
        default: the model of an agent whose first call names none (default: the first).
        ram_budget_bytes: host RAM for the loaded models' weights and contexts and all
            parked KV together (`0` = unlimited: every model stays loaded once used).
        vram_budget_bytes: VRAM for the weights and live KV of models with
            `n_gpu_layers != 0` (CUDA/Metal builds; `0` = unlimited).
        archive_dir: a directory with one archive file per model (`<name>.db`): agents
            survive unloads and restarts. Default: a temporary directory removed at
            `close` (unloads still lose nothing; restarts start empty).
        config: the base `PoolConfig` of every model; `options` override its fields and a
            `ModelSpec`'s options override both, for its model.
        unload_policy: `cost` (reload time × likelihood of next use) or `lru`.
        prefetch_models: load the model of the agent expected next in the background.
        preload: models to load at open (default: none; the first call loads its model).
        load_wait_s: how long a call waits for models in use to free the budget it needs.
    """

    def __init__(self, models: Mapping[str, str | os.PathLike[str] | ModelSpec], *, default: str | None = None,
                 ram_budget_bytes: int = 0, vram_budget_bytes: int = 0, archive_dir: str | os.PathLike[str] | None = None,
                 config: PoolConfig | None = None, unload_policy: str = "cost", prefetch_models: bool = True,
                 preload: Sequence[str] = (), load_wait_s: float = 300.0, **options: Any) -> None:
        specs = specs_of(models)
        for key, value in (("ram_budget_bytes", ram_budget_bytes), ("vram_budget_bytes", vram_budget_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{key} must be an int >= 0, got {value!r}")
        base = (config or PoolConfig()).replace(**options) if options else (config or PoolConfig())
        self._own_dir = archive_dir is None
        self.archive_dir = Path(tempfile.mkdtemp(prefix="agentmem-models-")) if archive_dir is None else Path(archive_dir)
        self.archive_dir.mkdir(parents=True, exist_ok=True)
        self.bindings = Bindings(specs, default or next(iter(specs)))
        self.bindings.check_model(self.bindings.default)
        self.workflow = Workflow()
        self.prefetch_models = prefetch_models
        self._closed = False
        self._prefetching: set[str] = set()
        slots = {name: self._slot(spec, base) for name, spec in specs.items()}
        for name, slot in slots.items():
            self.bindings.resume(name, Path(slot.config.archive_path or ""))
        self.tier = ModelTier(slots, ram_budget_bytes=ram_budget_bytes, vram_budget_bytes=vram_budget_bytes,
                              policy=_policy.unload_policy(unload_policy), next_step=self._next_step,
                              on_load=self._on_load, wait_s=load_wait_s)
        for name in preload:
            self.tier.acquire(self.bindings.check_model(name))
            self.tier.release(name)

    def _slot(self, spec: ModelSpec, base: PoolConfig) -> ModelSlot:
        cfg = spec.config(base, str(self.archive_dir / f"{spec.name}.db"))
        return ModelSlot(spec=spec, config=cfg, model_path=resolve_model_path(spec.model))

    # ------------------------------------------------------------------ models and agents
    @property
    def names(self) -> tuple[str, ...]:
        """The models' names, in the order given."""
        return self.bindings.models

    def model_of(self, agent_id: str) -> str | None:
        """The model `agent_id` is bound to (`None`: not bound yet)."""
        return self.bindings.of(agent_id)

    def bind(self, agent_id: str, model: str) -> None:
        """Bind a new agent to `model` (its first call then needs no `model`)."""
        self.bindings.bind(agent_id, model)

    def models(self) -> list[dict[str, Any]]:
        """Every model with its state: `name`, `model`, `state`, bytes, agents, loads, unloads, last load time."""
        with self.tier.cond:
            return [{"name": n, "model": s.spec.model, "path": str(s.model_path), "state": s.state,
                     "device": "gpu" if s.on_gpu else "cpu", "weights_bytes": s.weights_bytes,
                     "ctx_bytes": s.ctx_bytes, "agents": len(self.bindings.agents(n)), "in_use": s.uses,
                     "loads": s.loads, "unloads": s.unloads, "prefetch_loads": s.prefetch_loads,
                     "last_load_s": round(s.load_s, 3)} for n, s in self.tier.slots.items()]

    def config_of(self, model: str) -> PoolConfig:
        """The `PoolConfig` `model`'s `MemoryPool` is (or will be) opened with; loads nothing."""
        return self.tier.slots[self.bindings.check_model(model)].config

    def pool(self, model: str) -> MemoryPool:
        """`model`'s `MemoryPool`, loaded now (for what the model pool does not wrap; do not close it)."""
        self._check_open()
        name = self.bindings.check_model(model)
        pool = self.tier.acquire(name)
        self.tier.release(name)
        return pool

    def lease(self, agent_id: str | None = None, *, model: str | None = None) -> ModelLease:
        """Hold a model loaded for work done on its `MemoryPool` directly; `release` the lease after.

        With `agent_id`: the agent's model (binding a new agent to `model`, else the
        default), and the release counts as that agent's call (workflow predictor,
        model prefetch). Without: `model`, else the default. Blocks while the model loads.

        Raises:
            ModelMismatchError: `model` is not the agent's model.
            UnknownModelError: no such model.
            ModelBudgetError: the model cannot be loaded while the others stay in use.
        """
        self._check_open()
        if agent_id is not None:
            name = self.bindings.route(agent_id, model)
        else:
            name = self.bindings.check_model(self.bindings.default if model is None else model)
        return ModelLease(name=name, pool=self.tier.acquire(name), agent_id=agent_id, end=self._end_lease)

    def lease_if_loaded(self, model: str) -> ModelLease | None:
        """A lease on `model` if it is loaded now (never loads it; `None`: not loaded)."""
        name = self.bindings.check_model(model)
        pool = None if self._closed else self.tier.try_acquire(name)
        return None if pool is None else ModelLease(name=name, pool=pool, end=self._end_lease)

    def _end_lease(self, lease: ModelLease) -> None:
        self.tier.release(lease.name)
        if lease.agent_id is not None:
            self._after_call(lease.agent_id)

    # ------------------------------------------------------------------ calls
    def chat(self, agent_id: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None,
             **kwargs: Any) -> ChatResult:
        """`MemoryPool.chat` on the model `agent_id` is bound to (binding it to `model` on its first call).

        Raises:
            ModelMismatchError: `model` is not the agent's model.
            UnknownModelError: no such model.
            ModelBudgetError: the model cannot be loaded while the others stay in use.
        """
        return self.chat_stream(agent_id, messages, model=model, **kwargs).drain()

    def chat_stream(self, agent_id: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None,
                    **kwargs: Any) -> ChatStream:
        """`MemoryPool.chat_stream` on the agent's model; the model stays loaded until the stream ends or closes."""
        self._check_open()
        name = self.bindings.route(agent_id, model)
        pool = self.tier.acquire(name)
        try:
            inner = pool.chat_stream(agent_id, messages, **kwargs)
        except BaseException:
            self.tier.release(name)
            raise
        return ChatStream(self._held(name, agent_id, inner), cancel=_Cancel(inner))

    def _held(self, name: str, agent_id: str, inner: ChatStream) -> Any:
        """`inner`'s pieces and result; the model's use ends with it."""
        try:
            yield from inner
            assert inner.result is not None
            yield inner.result
        finally:
            inner.close()
            self.tier.release(name)
            self._after_call(agent_id)

    async def achat(self, agent_id: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None,
                    **kwargs: Any) -> ChatResult:
        """`chat` without blocking the event loop."""
        return await asyncio.to_thread(self.chat, agent_id, list(messages), model=model, **kwargs)

    async def astream(self, agent_id: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None,
                      **kwargs: Any) -> AsyncIterator[str | ChatResult]:
        """`chat_stream` as an async iterator of pieces, then the `ChatResult`."""
        stream = await asyncio.to_thread(self.chat_stream, agent_id, list(messages), model=model, **kwargs)
        async for item in drive_async(stream):
            yield item

    # ------------------------------------------------------------------ hints and prefetch
    def expect(self, agent_ids: Sequence[str | Sequence[str]], *, soon: bool = True, scope: str | None = None) -> None:
        """The agents expected next, in order: each loaded model gets its own agents' order
        (`MemoryPool.expect`, under `scope`), and the model of the first expected agent is
        loaded in the background. The order models are prefetched and kept by is one for
        every scope: the latest hint's."""
        self.workflow.expect(agent_ids)
        for name in self.tier.loaded():
            self._apply_hints(name, soon=soon, scope=scope)
        self._prefetch()

    def hold(self, agent_id: str, *, ttl_s: float | None = None) -> None:
        """`MemoryPool.hold` on the agent's model when it is loaded (a hint: nothing is loaded for it)."""
        name = self.bindings.of(agent_id)
        lease = None if name is None else self.lease_if_loaded(name)
        if lease is not None:
            with lease:
                lease.pool.hold(agent_id, ttl_s=ttl_s)

    def _next_step(self, model: str) -> int | None:
        return self.workflow.next_step(lambda a: self.bindings.of(a) == model)

    def _apply_hints(self, name: str, *, soon: bool = True, scope: str | None = None) -> None:
        slot = self.tier.slots[name]
        order = self.workflow.order(lambda a: self.bindings.of(a) == name)
        pool = slot.pool
        if pool is not None and not pool.closed and order:
            pool.expect(order, soon=soon, scope=scope)

    def _on_load(self, slot: ModelSlot) -> None:
        self._apply_hints(slot.spec.name)

    def _after_call(self, agent_id: str) -> None:
        self.workflow.called(agent_id)
        self._prefetch()

    def _prefetch(self) -> None:
        """Load, in a background thread, the model of the agent expected (or predicted) next."""
        if not self.prefetch_models or self._closed:
            return
        nxt = self.workflow.next_agent()
        name = self.bindings.of(nxt) if nxt is not None else None
        if name is None or self.tier.slots[name].state != "unloaded" or name in self._prefetching:
            return
        self._prefetching.add(name)

        def load() -> None:
            try:
                if not self._closed:
                    self.tier.acquire(name, prefetch=True)
                    self.tier.release(name)
            except PoolClosedError:
                pass
            except Exception:  # a prefetch is only an optimization: the call will load it (or fail) itself
                logger.warning("prefetching model %s failed", name, exc_info=True)
            finally:
                self._prefetching.discard(name)

        threading.Thread(target=load, name=f"agentmem-model-prefetch-{name}", daemon=True).start()

    def wait_prefetch(self, timeout_s: float = 60.0) -> bool:
        """Wait for model loads started in the background (and any unload) to finish; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._prefetching and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.tier.wait_idle(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------ agent operations
    def _pool_of(self, agent_id: str) -> tuple[str, MemoryPool]:
        name = self.bindings.of(agent_id)
        if name is None:
            raise UnknownAgentError(f"no agent {agent_id!r}", agent_id=agent_id)
        return name, self.tier.acquire(name)

    def forget(self, agent_id: str) -> None:
        """Drop `agent_id` everywhere (its model's tiers and archive) and end its binding."""
        self._check_open()
        name, pool = self._pool_of(agent_id)
        try:
            pool.forget(agent_id)
        finally:
            self.tier.release(name)
        self.bindings.drop(agent_id)

    def park(self, agent_id: str, tier: str = WARM) -> None:
        """`MemoryPool.park` on the agent's model."""
        self._check_open()
        name, pool = self._pool_of(agent_id)
        try:
            pool.park(agent_id, tier)
        finally:
            self.tier.release(name)

    def add_tenants(self, prefixes: Iterable[str]) -> None:
        """Add tenant prefixes to every model (`MemoryPool.add_tenants`; the unloaded ones get them at load)."""
        prefixes = tuple(prefixes)
        with self.tier.cond:
            for slot in self.tier.slots.values():
                merged = tuple(dict.fromkeys(slot.config.tenants + prefixes))
                slot.config = slot.config.replace(tenants=merged)
                if slot.pool is not None and not slot.pool.closed:
                    slot.pool.add_tenants(prefixes)

    @property
    def durable(self) -> bool:
        """Whether the agents outlive this pool (`archive_dir` given, not a temporary directory)."""
        return not self._own_dir

    def unload(self, model: str) -> bool:
        """Unload `model` now (its agents written to its archive first); False when it is in use or not loaded."""
        return self.tier.unload(self.bindings.check_model(model))

    def stats(self) -> dict[str, Any]:
        """`{"models": [...models()], "pools": {name: MemoryPool.stats() of each loaded model},
        "budget": {...}, "agents": n, "workflow": {...}}`."""
        pools = {}
        for name in self.tier.loaded():
            pool = self.tier.slots[name].pool
            if pool is not None and not pool.closed:
                pools[name] = pool.stats()
        return {"models": self.models(), "pools": pools, "agents": len(self.bindings),
                "budget": {"ram_budget_bytes": self.tier.ram_budget, "vram_budget_bytes": self.tier.vram_budget,
                           "policy": self.tier.policy.name},
                "workflow": self.workflow.stats()}

    # ------------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("the model pool is closed")

    def close(self) -> None:
        """Close every loaded model (its agents written to its archive); idempotent."""
        if self._closed:
            return
        self._closed = True
        self.tier.close()
        if self._own_dir:
            shutil.rmtree(self.archive_dir, ignore_errors=True)

    closed = property(lambda self: self._closed, doc="True after `close`.")

    def __enter__(self) -> ModelPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
