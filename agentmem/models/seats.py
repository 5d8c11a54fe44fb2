"""One call's model for a front-end: a `MemoryPool` as it is, or the agent's model in a `ModelPool`.

The LangChain, AutoGen and MAF integrations take `pool=` either kind. Each call takes a
*seat* for its agent — `seat` in a thread, `aseat` from a coroutine — runs the one call
protocol (`agentmem.calls.CallRunner`) on `seat.pool`, and releases it when the reply
is done, when a stream is closed early, or when the caller is cancelled. With a
`ModelPool` the seat is a `ModelLease` on the agent's model (a new agent is bound to
`model`, else the pool's default; another model for a bound agent raises
`ModelMismatchError`): the model stays loaded until the seat is released, and the
release counts as the agent's call (model prefetch). With a `MemoryPool` the seat holds
nothing and costs nothing: `name` is `""` and `release` is a no-op. The memory components
(recall of an agent's evicted text) take a `memory_seat`: the agent's model, held the same
way, but nothing is bound and no call is counted.

>>> from agentmem.models.seats import seat
>>> with seat(pool, "planner") as lease:  # doctest: +SKIP
...     CallRunner(lease.pool).collect(plan)
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Union

from agentmem.errors import CallCancelledError, ConfigError, ModelMismatchError
from agentmem.models.lease import ModelLease
from agentmem.models.pool import ModelPool
from agentmem.pool import MemoryPool
from agentmem.tools.recall import recall_spans, words
from agentmem.tools.registry import PoolFactory, hold_pool

__all__ = [
    "Pools", "alease", "aseat", "check_model", "hold_pools", "memory_seat", "model_for", "model_name", "recall_on", "seat",
]

Pools = Union[MemoryPool, ModelPool]
"""What an integration's `pool=` takes: one model's pool, or a pool of models."""

Call = Callable[..., Awaitable[Any]]
"""Runs a blocking function in a worker thread (`asyncio.to_thread`, a server's `AgentQueue.call`)."""


def check_model(pools: Any, model: str | None) -> str | None:
    """`model` checked against `pools` (`None` stays `None`: the agent's model, else the default).

    Raises:
        ConfigError: `model` given but `pools` is not a `ModelPool` (a `MemoryPool` holds one model).
        UnknownModelError: the `ModelPool` holds no model of that name.
    """
    if model is None:
        return None
    if not isinstance(pools, ModelPool):
        raise ConfigError(f"model: {model!r} names a model of a ModelPool; pass pool=ModelPool(...) "
                          f"(got pool={type(pools).__name__})")
    return pools.bindings.check_model(model)


def hold_pools(pool: Any, pool_config: Any, factory: PoolFactory, *, model: str | None = None) -> tuple[Pools, bool]:
    """`agentmem.tools.hold_pool` for an integration client: a `MemoryPool` or a `ModelPool` (and its `model`).

    `model` is checked first, so a bad one never opens a shared pool. Returns `(pool, owned)`.

    Raises:
        ConfigError / UnknownModelError: see `check_model`.
        ValueError: both `pool` and `pool_config`.
        TypeError: `pool` is neither kind.
    """
    check_model(pool, model)
    return hold_pool(pool, pool_config, factory, pool_type=MemoryPool, models_type=ModelPool)  # type: ignore[no-any-return]


def model_for(pools: Pools, agent_id: str | None, model: str | None) -> str | None:
    """The model `agent_id`'s calls run on: its binding, else `model`, else the default (`None`: a `MemoryPool`).

    Reads only: binds nothing, loads nothing.
    """
    if not isinstance(pools, ModelPool):
        return None
    bound = pools.model_of(agent_id) if agent_id is not None else None
    return bound or model or pools.bindings.default


def model_name(pools: Pools, agent_id: str | None, model: str | None) -> str:
    """The name replies report: the model's name in a `ModelPool`, else the GGUF file's stem."""
    name = model_for(pools, agent_id, model)
    return name if name is not None else Path(pools.model_path).stem  # type: ignore[union-attr]


def seat(pools: Pools, agent_id: str | None, *, model: str | None = None) -> ModelLease:
    """A seat for one call of `agent_id` (blocks while its model loads); `with` it, or `release` it.

    `agent_id=None`: a use without a call (counting tokens), on `model` or the default.

    Raises:
        ModelMismatchError: `agent_id` is bound to another model than `model`.
        UnknownModelError / ModelBudgetError: from `ModelPool.lease`.
    """
    if isinstance(pools, ModelPool):
        return pools.lease(agent_id, model=model)
    return ModelLease(name="", pool=pools, agent_id=agent_id)


def memory_seat(pools: Pools, agent_id: str, *, model: str | None = None) -> ModelLease | None:
    """A seat on `agent_id`'s model for work on its memory that is not a call (recall); `with` it.

    Binds nothing and counts no call, so a memory read before the agent's first call
    never binds it to another model than its client's. With a `ModelPool`: a lease on
    the model the agent is bound to; `None` for an agent bound to no model yet (it has
    no memory on any model: nothing is loaded for it). With a `MemoryPool`: the empty seat.

    Raises:
        ModelMismatchError: `agent_id` is bound to another model than `model`.
        UnknownModelError / ModelBudgetError: from `ModelPool.lease`.
    """
    if not isinstance(pools, ModelPool):
        return ModelLease(name="", pool=pools, agent_id=agent_id)
    bound = pools.model_of(agent_id)
    if bound is None:
        return None
    if model is not None and model != bound:
        raise ModelMismatchError(
            f"model: agent {agent_id!r} is bound to model {bound!r}; its memory cannot be read on {model!r}",
            agent_id=agent_id, bound=bound, asked=model)
    return pools.lease(None, model=bound)


async def aseat(pools: Pools, agent_id: str | None, *, model: str | None = None, call: Call | None = None) -> ModelLease:
    """`seat` from a coroutine: a model's load runs in a worker thread (`call`), the event loop goes on.

    Use it as `with await aseat(pool, agent) as lease:`. A `MemoryPool` seat is made at once.
    """
    if not isinstance(pools, ModelPool):
        return ModelLease(name="", pool=pools, agent_id=agent_id)
    return await alease(lambda: pools.lease(agent_id, model=model), call=call)


async def alease(take: Callable[[], ModelLease], *, call: Call | None = None) -> ModelLease:
    """`take()` in a worker thread (it may load a model); a lease taken for a caller gone is released.

    Args:
        take: takes the lease (blocking).
        call: runs it in a worker thread (default: `asyncio.to_thread`).

    Raises:
        asyncio.CancelledError: the caller was cancelled (the lease, once taken, is released).
    """
    lock = threading.Lock()
    box: dict[str, Any] = {}

    def work() -> ModelLease:
        lease = take()
        with lock:
            if box.get("gone"):
                lease.release()
                raise CallCancelledError("the caller went away while its model loaded")
            box["lease"] = lease
        return lease

    try:
        return await (call or asyncio.to_thread)(work)  # type: ignore[no-any-return]
    except asyncio.CancelledError:
        with lock:
            box["gone"] = True
            lease = box.pop("lease", None)
        if lease is not None:
            lease.release()
        raise


def recall_on(pools: Any, agent_id: str, query: str, k: int, *, model: str | None = None) -> list[tuple[str, Any]]:
    """`agentmem.tools.recall.recall_spans` on `agent_id`'s model (a `ModelPool`'s, or the `MemoryPool`).

    The model is held by a seat (`memory_seat`: binds nothing, counts no call) for the search and released after, also when it fails. An agent of a
    `ModelPool` bound to no model yet has nothing evicted: `[]`, nothing loaded. Blocking
    (the search and a model's load): run it in a worker thread.

    Raises:
        ModelMismatchError: `agent_id` is bound to another model than `model`.
    """
    if not words(query) or k == 0:
        return []
    lease = memory_seat(pools, agent_id, model=model)
    if lease is None:
        return []
    with lease:
        return recall_spans(lease.pool, agent_id, query, k)
