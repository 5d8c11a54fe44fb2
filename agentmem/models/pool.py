"""`MemoryPool`: the one public pool, for one model or many; each model is run by a `ModelEngine`.

A single model is a pool of one: `MemoryPool("gemma-3-270m", n_ctx=4096)` opens its
engine at once and keeps it open until `close`. A pool of many, `MemoryPool(models={...},
ram_budget_bytes=...)`, loads and unloads its models' engines within one budget for
weights and KV (`agentmem.models.tier`), binds every agent to one model
(`agentmem.models.bindings`), and prefetches the model of the agent expected next — from
the workflow hints (`expect`), else from the order calls came in before — in the
background, off the critical path. Both forms offer the same calls and agent operations
(`agentmem.models.operations`): each one runs on the agent's model, and `model=` names
the model where an agent is new or none is involved.

Real output on the two bundled models, 2 CPU cores, a budget that holds one model at a
time (`benchmarks/models.py` measures it at scale):

>>> from agentmem import MemoryPool
>>> team = MemoryPool(models={"planner": "gemma-3-270m", "coder": "qwen2.5-coder-0.5b-instruct"},  # doctest: +SKIP
...                   ram_budget_bytes=600 << 20, archive_dir="team-archive", n_ctx=2048, resident_agents=2)
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
import functools
import logging
import os
import re
import shutil
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence

import agentmem.validation as check
from agentmem.config import PoolConfig
from agentmem.errors import ConfigError, PoolClosedError
from agentmem.model import resolve_model_path
from agentmem.models import policy as _policy
from agentmem.models.bindings import Bindings
from agentmem.models.lease import ModelLease
from agentmem.models.listing import ArchivedAgents
from agentmem.models.operations import AgentOperations
from agentmem.models.specs import ModelSpec, specs_of
from agentmem.models.tier import ModelSlot, ModelTier
from agentmem.models.workflow import Workflow
from agentmem.pool import ChatResult, ChatStream, ModelEngine
from agentmem.pool.results import drive_async

__all__ = ["MemoryPool", "ModelPool"]

logger = logging.getLogger(__name__)

Models = Mapping[str, "str | os.PathLike[str] | ModelSpec"] | Sequence[ModelSpec]
"""A pool of many's models: `{name: bundled model name | GGUF path | ModelSpec}`, or a list of `ModelSpec`s."""


class _Cancel:
    """`ChatStream`'s cancel hook, forwarded to the engine's own stream."""

    def __init__(self, inner: ChatStream) -> None:
        self.inner = inner

    def set(self, reason: str) -> None:
        del reason
        self.inner.cancel()


def _name_of_file(path: Path) -> str:
    """A pool of one's model name: its GGUF file's stem, made a valid `ModelSpec` name."""
    return re.sub(r"[^A-Za-z0-9._:-]", "-", path.stem)[:64] or "model"


class MemoryPool(AgentOperations):
    """Keeps every agent's KV state, on one model or many (see the module docstring).

    At most `resident_agents` agents of a model are *hot* (a live sequence). When another
    agent needs a sequence, the placement policy picks an idle one to *park*: its KV
    state is copied out to the WARM tier (RAM, optionally quantized) and restored —
    milliseconds — when it is called again. With `archive_path` a COLD tier (SQLite)
    takes states that overflow the RAM budget and makes agents durable across restarts.
    Each call decodes only what the agent's KV does not already hold.

    Args:
        model: a pool of one: a bundled model's name (`gemma-3-270m`, `qwen2.5-coder-0.5b-instruct`)
            or a GGUF path; `None` uses `AGENTMEM_MODEL` or the default bundled model.
            Stored as `PoolConfig.model_path`.
        models: a pool of many instead: `{name: bundled model name | GGUF path | ModelSpec}`
            or a list of `ModelSpec`s; each model keeps its agents in `archive_dir/<name>.db`.
        default: the model of an agent whose first call names none (default: the first).
        config: the base `PoolConfig` of every model; `options` override its fields
            (`n_ctx`, `resident_agents`, `park_codec`, `archive_path`, ...) and a
            `ModelSpec`'s options override both, for its model.
        ram_budget_bytes: host RAM for the loaded models' weights and contexts and all
            parked KV together (`0` = unlimited: every model stays loaded once used).
        vram_budget_bytes: VRAM for the weights and live KV of models with
            `n_gpu_layers != 0` (CUDA/Metal builds; `0` = unlimited).
        archive_dir: a pool of many's directory with one archive file per model. Default: a
            temporary directory removed at `close` (unloads lose nothing; restarts start empty).
        unload_policy: `cost` (reload time × likelihood of next use) or `lru`.
        prefetch_models: load the model of the agent expected next in the background.
        preload: models to load at open (a pool of one loads its model at open).
        load_wait_s: how long a call waits for models in use to free the budget it needs.
        open_engine: opens one model's engine, `open_engine(config=...)` (default `ModelEngine`;
            a cluster replica passes `ClusterPool`).

    Raises:
        ConfigError: both `model` and `models`, a bad option, a bad budget.
        ModelNotFoundError: a model file that does not exist.

    Example:
        >>> from agentmem import MemoryPool
        >>> with MemoryPool(n_ctx=4096, resident_agents=2) as pool:   # doctest: +SKIP
        ...     msgs = [{"role": "user", "content": "Name a colour."}]
        ...     r = pool.chat("planner", msgs, max_tokens=8)
        ...     print(r.kv, r.usage.prompt_tokens, r.usage.cached_tokens)
        prefilled 11 0
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, *, models: Models | None = None,
                 default: str | None = None, config: PoolConfig | None = None, ram_budget_bytes: int = 0,
                 vram_budget_bytes: int = 0, archive_dir: str | os.PathLike[str] | None = None,
                 unload_policy: str = "cost", prefetch_models: bool = True, preload: Sequence[str] = (),
                 load_wait_s: float = 300.0, open_engine: Callable[..., ModelEngine] = ModelEngine,
                 **options: Any) -> None:
        for key, value in (("ram_budget_bytes", ram_budget_bytes), ("vram_budget_bytes", vram_budget_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{key} must be an int >= 0, got {value!r}")
        self._closed = True  # until fully built, close() is a no-op
        base = config or PoolConfig()
        if models is None:
            if model is not None:
                if options.get("model_path") is not None:
                    raise ConfigError("pass the model once: either model=... or model_path=..., not both")
                options["model_path"] = str(model)
            cfg = base.replace(**options) if options else base
            path = resolve_model_path(cfg.model_path)
            spec = ModelSpec(name=_name_of_file(path), model=str(path))
            slots = {spec.name: ModelSlot(spec=spec, config=cfg, model_path=path)}
            self._own_dir, self.archive_dir = False, None
            preload, prefetch_models = (spec.name,), False
        else:
            if model is not None:
                raise ConfigError("pass model=... (a pool of one) or models=... (a pool of many), not both")
            base = base.replace(**options) if options else base
            specs = specs_of({s.name: s for s in models} if isinstance(models, Sequence) else models)
            self._own_dir = archive_dir is None
            self.archive_dir = Path(tempfile.mkdtemp(prefix="agentmem-models-") if archive_dir is None else archive_dir)
            self.archive_dir.mkdir(parents=True, exist_ok=True)
            slots = {name: ModelSlot(spec=spec, config=spec.config(base, str(self.archive_dir / f"{name}.db")),
                                     model_path=resolve_model_path(spec.model)) for name, spec in specs.items()}
        self.bindings = Bindings(slots, default or next(iter(slots)))
        self.bindings.check_model(self.bindings.default)
        self.workflow = Workflow()
        self._archived = ArchivedAgents()  # what unloaded models hold, for listings that load nothing
        self.prefetch_models = prefetch_models
        self._prefetching: set[str] = set()
        for name, slot in slots.items():
            if len(slots) > 1 and slot.config.archive_path:
                self.bindings.resume(name, Path(slot.config.archive_path))
        self.tier = ModelTier(slots, ram_budget_bytes=ram_budget_bytes, vram_budget_bytes=vram_budget_bytes,
                              policy=_policy.unload_policy(unload_policy), next_step=self._next_step,
                              on_load=self._on_load, wait_s=load_wait_s,
                              open_pool=lambda cfg: open_engine(config=cfg))
        self._closed = False
        try:
            for name in preload:
                self.tier.acquire(self.bindings.check_model(name))
                self.tier.release(name)
        except BaseException:
            self.close()
            raise
        # async calls wait on the engines most of the time: enough threads that every
        # resident agent can be in a decode batch (asyncio's default pool has cpu+4)
        resident = sum(s.config.resident_agents for s in slots.values())
        self._executor = ThreadPoolExecutor(max_workers=max(32, 4 * resident), thread_name_prefix="agentmem")

    # ------------------------------------------------------------------ models and engines
    @property
    def names(self) -> tuple[str, ...]:
        """The models' names, in the order given (a pool of one: its GGUF file's stem)."""
        return self.bindings.models

    @property
    def default(self) -> str:
        """The model of an agent whose first call names none."""
        return self.bindings.default

    def model_of(self, agent_id: str) -> str | None:
        """The model `agent_id` runs on (`None`: not bound yet; in a pool of one, always its model)."""
        bound = self.bindings.of(agent_id)
        return bound if bound is not None or len(self.names) > 1 else self.default

    def bind(self, agent_id: str, model: str) -> None:
        """Bind a new agent to `model` (its first call then needs no `model`)."""
        self.bindings.bind(agent_id, model)

    def check_model(self, model: str | None) -> str | None:
        """`model` if this pool holds it (`None` stays `None`: the agent's model, else the default).

        Raises:
            UnknownModelError: no model of that name.
        """
        return None if model is None else self.bindings.check_model(model)

    def models(self) -> list[dict[str, Any]]:
        """Every model with its state: `name`, `model`, `state`, bytes, agents, loads, unloads, last load time."""
        with self.tier.cond:
            return [{"name": n, "model": s.spec.model, "path": str(s.model_path), "state": s.state,
                     "device": "gpu" if s.on_gpu else "cpu", "weights_bytes": s.weights_bytes,
                     "ctx_bytes": s.ctx_bytes, "agents": len(self.bindings.agents(n)), "in_use": s.uses,
                     "loads": s.loads, "unloads": s.unloads, "prefetch_loads": s.prefetch_loads,
                     "last_load_s": round(s.load_s, 3)} for n, s in self.tier.slots.items()]

    def config_of(self, model: str | None = None) -> PoolConfig:
        """The `PoolConfig` `model`'s engine is (or will be) opened with (`None`: the default's); loads nothing."""
        return self.tier.slots[self.bindings.check_model(self.default if model is None else model)].config

    @property
    def config(self) -> PoolConfig:
        """The default model's `PoolConfig` (a pool of one: its only one)."""
        return self.config_of()

    def engine(self, model: str | None = None) -> ModelEngine:
        """`model`'s engine (`None`: the default), loaded now; for what the pool does not wrap. Do not close it."""
        with self.lease(model=model) as lease:
            return lease.pool  # type: ignore[no-any-return]

    def lease(self, agent_id: str | None = None, *, model: str | None = None) -> ModelLease:
        """Hold a model loaded for work done on its engine directly (`lease.pool`); `release` the lease after.

        With `agent_id`: the agent's model (binding a new agent to `model`, else the
        default), and the release counts as that agent's call (workflow predictor,
        model prefetch). Without: `model`, else the default. Blocks while the model loads.

        Raises:
            ModelMismatchError: `model` is not the agent's model.
            UnknownModelError: no such model.
            ModelBudgetError: the model cannot be loaded while the others stay in use.
        """
        self._check_open()
        name = (self.bindings.route(agent_id, model) if agent_id is not None
                else self.bindings.check_model(self.default if model is None else model))
        return ModelLease(name=name, pool=self.tier.acquire(name), agent_id=agent_id,
                          end=functools.partial(self._end_lease, name))

    def lease_if_loaded(self, model: str | None = None, *, agent_id: str | None = None) -> ModelLease | None:
        """`lease(agent_id, model=model)` if that model is loaded now (never loads it; `None`: not loaded).

        With `agent_id` a new agent is bound as by `lease`, loaded or not. A closed pool has none loaded.
        """
        if self._closed:
            return None
        name = (self.bindings.route(agent_id, model) if agent_id is not None
                else self.bindings.check_model(self.default if model is None else model))
        engine = self.tier.try_acquire(name)
        return None if engine is None else ModelLease(name=name, pool=engine, agent_id=agent_id,
                                                      end=functools.partial(self._end_lease, name))

    def each_loaded(self) -> Iterator[ModelLease]:
        """A lease on each model loaded now, held while the loop body runs (nothing is loaded for this)."""
        for name in self.names:
            lease = self.lease_if_loaded(name)
            if lease is not None:
                with lease:
                    yield lease

    def _end_lease(self, name: str, lease: ModelLease) -> None:
        """A lease on `name` ended (its `name` may since show another, as a server names its one model)."""
        self.tier.release(name)
        if lease.agent_id is not None:
            self._after_call(lease.agent_id)

    def unload(self, model: str) -> bool:
        """Unload `model` now (its agents written to its archive first); False when it is in use or not loaded."""
        return self.tier.unload(self.bindings.check_model(model))

    @property
    def durable(self) -> bool:
        """Whether the agents outlive this pool (an archive that is not a temporary directory)."""
        if self.archive_dir is not None:
            return not self._own_dir
        return bool(self.config.archive_path or self.config.archive_url)

    # ------------------------------------------------------------------ calls
    def chat(self, agent_id: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None,
             **kwargs: Any) -> ChatResult:
        """Continue `agent_id`'s conversation on its model and return the reply (`ModelEngine.chat`).

        `messages` is the agent's *whole* history; only the part after what its KV already
        holds is decoded. `model` binds a new agent to a model (else the default). The
        options (`max_tokens`, `temperature`, `stop`, `tools`, `opening`, sampling) are
        `ModelEngine.chat`'s.

        Raises:
            MessageError: a malformed message (the error names the field).
            ContextOverflowError: the prompt does not fit the model's context.
            ModelMismatchError: `model` is not the agent's model.
            UnknownModelError: no such model.
            ModelBudgetError: the model cannot be loaded while the others stay in use.
        """
        return self.chat_stream(agent_id, messages, model=model, **kwargs).drain()

    def chat_stream(self, agent_id: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None,
                    **kwargs: Any) -> ChatStream:
        """Like `chat` but yields text pieces; `.result` holds the `ChatResult` at the end.

        Validation happens here (before the first `next`); the model stays loaded until the stream ends or closes.
        """
        return self._stream("chat_stream", agent_id, messages, model, kwargs)

    def complete(self, agent_id: str, prompt: str, *, model: str | None = None, **kwargs: Any) -> ChatResult:
        """Raw completion of `prompt` (no chat template) in `agent_id`'s context, on its model."""
        return self.complete_stream(agent_id, prompt, model=model, **kwargs).drain()

    def complete_stream(self, agent_id: str, prompt: str, *, model: str | None = None, **kwargs: Any) -> ChatStream:
        """Streaming `complete`."""
        return self._stream("complete_stream", agent_id, prompt, model, kwargs)

    def _stream(self, method: str, agent_id: str, what: Any, model: str | None, kwargs: dict[str, Any]) -> ChatStream:
        lease = self.lease(agent_id, model=model)
        try:
            inner = getattr(lease.pool, method)(agent_id, what, **kwargs)
        except BaseException:
            lease.release()
            raise
        return ChatStream(self._held(lease, inner), cancel=_Cancel(inner))

    @staticmethod
    def _held(lease: ModelLease, inner: ChatStream) -> Iterator[str | ChatResult]:
        """`inner`'s pieces and result; the lease on the model ends with it."""
        try:
            yield from inner
            assert inner.result is not None
            yield inner.result
        finally:
            inner.close()
            lease.release()

    async def achat(self, agent_id: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None,
                    **kwargs: Any) -> ChatResult:
        """Async `chat` (runs in a worker thread; never blocks the event loop)."""
        self._check_open()
        msgs = check.message_list(messages)
        return await self._in_thread(lambda: self.chat(agent_id, msgs, model=model, **kwargs))

    async def acomplete(self, agent_id: str, prompt: str, *, model: str | None = None, **kwargs: Any) -> ChatResult:
        """Async `complete`."""
        self._check_open()
        return await self._in_thread(lambda: self.complete(agent_id, prompt, model=model, **kwargs))

    async def achat_stream(self, agent_id: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None,
                           **kwargs: Any) -> AsyncIterator[str | ChatResult]:
        """Async streaming: yields text pieces, then the final `ChatResult`."""
        msgs = check.message_list(messages)
        stream = await self._in_thread(lambda: self.chat_stream(agent_id, msgs, model=model, **kwargs))
        async for item in drive_async(stream):
            yield item

    async def acomplete_stream(self, agent_id: str, prompt: str, *, model: str | None = None,
                               **kwargs: Any) -> AsyncIterator[str | ChatResult]:
        """Async streaming completion: text pieces, then the `ChatResult`."""
        stream = await self._in_thread(lambda: self.complete_stream(agent_id, prompt, model=model, **kwargs))
        async for item in drive_async(stream):
            yield item

    async def _in_thread(self, work: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    # ------------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("the pool is closed")

    def close(self, timeout_s: float = 30.0) -> None:
        """Close every loaded model (its agents written to its archive, if any); idempotent, any thread.

        Calls in flight stop with `PoolClosedError` at their next prefill chunk or decode step.
        """
        if self._closed:
            return
        self._closed = True
        self.tier.close(timeout_s)
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False)
        if self._own_dir and self.archive_dir is not None:
            shutil.rmtree(self.archive_dir, ignore_errors=True)

    closed = property(lambda self: self._closed, doc="True after `close`.")

    def __enter__(self) -> MemoryPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ModelPool(MemoryPool):
    """Deprecated: a pool of many models is `MemoryPool(models=...)`; this name still builds one.

    `ModelPool(models, ...)` is `MemoryPool(models=models, ...)` with a `DeprecationWarning`;
    `astream` and `pool` are the old names of `achat_stream` and `engine`.
    """

    def __init__(self, models: Models, **kwargs: Any) -> None:
        warnings.warn("ModelPool is deprecated: use MemoryPool(models=...), the one pool for one model or many",
                      DeprecationWarning, stacklevel=2)
        super().__init__(models=models, **kwargs)

    def astream(self, agent_id: str, messages: Iterable[Mapping[str, Any]], *, model: str | None = None,
                **kwargs: Any) -> AsyncIterator[str | ChatResult]:
        """Deprecated name of `achat_stream`."""
        warnings.warn("ModelPool.astream is deprecated: use MemoryPool.achat_stream", DeprecationWarning, stacklevel=2)
        return self.achat_stream(agent_id, messages, model=model, **kwargs)

    def pool(self, model: str) -> ModelEngine:
        """Deprecated name of `engine`."""
        warnings.warn("ModelPool.pool is deprecated: use MemoryPool.engine", DeprecationWarning, stacklevel=2)
        return self.engine(model)
