"""One call's model for a front-end: a lease on the agent's engine in the `MemoryPool`.

The LangChain, AutoGen and MAF integrations take `pool=` a `MemoryPool` (of one model or
many). Each call takes a *seat* for its agent — `seat` in a thread, `aseat` from a
coroutine — runs the one call protocol (`agentmem.calls.CallRunner`) on `seat.pool` (the
model's `ModelEngine`), and releases it when the reply is done, when a stream is closed
early, or when the caller is cancelled. The seat is a `ModelLease` on the agent's model
(a new agent is bound to `model`, else the pool's default; another model for a bound
agent raises `ModelMismatchError`): the model stays loaded until the seat is released,
and the release counts as the agent's call (model prefetch). In a pool of one the model
is always loaded and the seat is taken at once. The memory components
(recall of an agent's evicted text) take a `memory_seat`: the agent's model, held the same
way, but nothing is bound and no call is counted.

>>> from agentmem.models.seats import seat
>>> with seat(pool, "planner") as lease:  # doctest: +SKIP
...     CallRunner(lease.pool).collect(plan)
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable

from agentmem.errors import CallCancelledError, ConfigError, ModelMismatchError
from agentmem.models.lease import ModelLease
from agentmem.models.pool import MemoryPool
from agentmem.tools.recall import recall_spans, words
from agentmem.tools.registry import PoolFactory, hold_pool, release

__all__ = [
    "Pools", "alease", "aseat", "check_model", "hold_pools", "memory_seat", "model_for", "model_name", "recall_on", "seat",
]

Pools = MemoryPool
"""What an integration's `pool=` takes: the one pool (of one model or many); kept as an alias."""

Call = Callable[..., Awaitable[Any]]
"""Runs a blocking function in a worker thread (`asyncio.to_thread`, a server's `AgentQueue.call`)."""


def check_model(pools: MemoryPool | None, model: str | None) -> str | None:
    """`model` checked against `pools` (`None` stays `None`: the agent's model, else the default).

    Raises:
        ConfigError: `model` given without a pool (a shared pool, opened later, holds one model).
        UnknownModelError: the pool holds no model of that name.
    """
    if model is None:
        return None
    if pools is None:
        raise ConfigError(f"model: {model!r} names a model of the pool given as pool=; pass "
                          "pool=MemoryPool(models=...) (a shared pool of pool_config holds one model)")
    return pools.check_model(model)


def hold_pools(pool: Any, pool_config: Any, factory: PoolFactory, *, model: str | None = None) -> tuple[MemoryPool, bool]:
    """`agentmem.tools.hold_pool` for an integration client: the application's `MemoryPool`, or a shared one.

    `model` is checked first (without `pool`, a `model` is refused before a shared pool opens), then
    against the pool held. Returns `(pool, owned)`.

    Raises:
        ConfigError / UnknownModelError: see `check_model`.
        ValueError: both `pool` and `pool_config`.
        TypeError: `pool` is not a `MemoryPool`.
    """
    if pool is None:
        check_model(None, model)  # before a shared pool is opened
    held, owned = hold_pool(pool, pool_config, factory, pool_type=MemoryPool)
    try:
        check_model(held, model)
    except BaseException:
        if owned:
            release(held)
        raise
    return held, owned


def model_for(pools: MemoryPool, agent_id: str | None, model: str | None) -> str:
    """The model `agent_id`'s calls run on: its binding, else `model`, else the default.

    Reads only: binds nothing, loads nothing.
    """
    bound = pools.model_of(agent_id) if agent_id is not None else None
    return bound or model or pools.default


def model_name(pools: MemoryPool, agent_id: str | None, model: str | None) -> str:
    """The name replies report: the model's name in the pool (a pool of one: its GGUF file's stem)."""
    return model_for(pools, agent_id, model)


def seat(pools: MemoryPool, agent_id: str | None, *, model: str | None = None) -> ModelLease:
    """A seat for one call of `agent_id` (blocks while its model loads); `with` it, or `release` it.

    `agent_id=None`: a use without a call (counting tokens), on `model` or the default.

    Raises:
        ModelMismatchError: `agent_id` is bound to another model than `model`.
        UnknownModelError / ModelBudgetError: from `MemoryPool.lease`.
    """
    return pools.lease(agent_id, model=model)


def memory_seat(pools: MemoryPool, agent_id: str, *, model: str | None = None) -> ModelLease | None:
    """A seat on `agent_id`'s model for work on its memory that is not a call (recall); `with` it.

    Binds nothing and counts no call, so a memory read before the agent's first call
    never binds it to another model than its client's: `None` for an agent bound to no
    model yet (it has no memory on any model: nothing is loaded for it).

    Raises:
        ModelMismatchError: `agent_id` is bound to another model than `model`.
        UnknownModelError / ModelBudgetError: from `MemoryPool.lease`.
    """
    bound = pools.model_of(agent_id)
    if bound is None:
        return None
    if model is not None and model != bound:
        raise ModelMismatchError(
            f"model: agent {agent_id!r} is bound to model {bound!r}; its memory cannot be read on {model!r}",
            agent_id=agent_id, bound=bound, asked=model)
    return pools.lease(None, model=bound)


async def aseat(pools: MemoryPool, agent_id: str | None, *, model: str | None = None,
                call: Call | None = None) -> ModelLease:
    """`seat` from a coroutine: a model's load runs in a worker thread (`call`), the event loop goes on.

    Use it as `with await aseat(pool, agent) as lease:`. A model loaded now is seated at once.
    """
    lease = pools.lease_if_loaded(model, agent_id=agent_id)
    if lease is not None:
        return lease
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
    """`agentmem.tools.recall.recall_spans` on `agent_id`'s model.

    The model is held by a seat (`memory_seat`: binds nothing, counts no call) for the search and released
    after, also when it fails. An agent bound to no model yet has nothing evicted: `[]`, nothing loaded. Blocking
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
