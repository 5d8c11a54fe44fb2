"""The process-wide registry of shared pools: one open pool per configuration.

Building a framework object (a LangChain chat model, an AutoGen client loaded from a
component config) must not load the model a second time. Every integration asks this
registry for the pool of a `PoolConfig` and gets the one already open in this process,
whichever integration or application opened it:

* `register` makes an application's own pool findable (weakly held; the application
  closes it).
* `acquire` / `release` hand out a registry-created pool reference-counted: the last
  `release` closes it (AutoGen clients, which have a `close()`).
* `shared_pool` hands out a registry-created pool that stays open until
  `close_shared_pools` (LangChain models, which have no `close()`).

Every pool the registry created is closed at interpreter exit. The registry does not
import the pool class: callers pass a `factory` that opens a pool for a config, so this
module sits below the pool in the import graph.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from agentmem.config import PoolConfig
from agentmem.model import resolve_model_path

__all__ = [
    "PoolFactory",
    "SharedPool",
    "acquire",
    "close_shared_pools",
    "hold_pool",
    "pool_key",
    "register",
    "release",
    "shared_pool",
]

logger = logging.getLogger(__name__)


class SharedPool(Protocol):
    """What the registry needs of a pool (`agentmem.MemoryPool` has it)."""

    config: PoolConfig
    model_path: Any

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


PoolFactory = Callable[[PoolConfig], Any]
"""Opens a pool for a configuration, e.g. `lambda cfg: MemoryPool(config=cfg)`."""


@dataclass(slots=True)
class _Owned:
    """A pool the registry created: who holds it."""

    pool: Any
    holders: int = 0  # acquire() calls not yet released
    pinned: bool = False  # handed out by shared_pool(): open until close_shared_pools()


_lock = threading.Lock()
_by_key: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_owned: dict[int, _Owned] = {}  # id(pool) -> entry; holds the pool strongly


def pool_key(config: PoolConfig, model_path: Any = None) -> str:
    """Identity of a pool: its configuration with the model path resolved.

    Raises:
        ModelNotFoundError: the configuration's model cannot be found.
    """
    d = config.to_dict()
    d["model_path"] = str(model_path if model_path is not None else resolve_model_path(config.model_path))
    return json.dumps(d, sort_keys=True)


def register(pool: SharedPool) -> None:
    """Make an application-owned pool findable by its configuration (weakly held)."""
    key = pool_key(pool.config, pool.model_path)
    with _lock:
        cur = _by_key.get(key)
        if cur is None or cur is pool or cur.closed:
            _by_key[key] = pool


def _open(config: PoolConfig, factory: PoolFactory) -> tuple[Any, _Owned | None]:
    """The open pool for `config` and its entry (`None`: the application's); caller holds `_lock`."""
    key = pool_key(config)
    pool = _by_key.get(key)
    if pool is not None and not pool.closed:
        entry = _owned.get(id(pool))
        return pool, (entry if entry is not None and entry.pool is pool else None)
    logger.info("opening a shared pool for %s", key)
    pool = factory(config)
    _by_key[key] = pool
    entry = _owned[id(pool)] = _Owned(pool)
    return pool, entry


def acquire(config: PoolConfig, factory: PoolFactory) -> tuple[Any, bool]:
    """The open pool for `config`, opened with `factory` if there is none.

    Returns:
        `(pool, owned)`: `owned` is true when the registry manages the pool's lifetime;
        the caller must then `release` it once.
    """
    with _lock:
        pool, entry = _open(config, factory)
        if entry is None:
            return pool, False
        entry.holders += 1
        return pool, True


def hold_pool(pool: Any, pool_config: PoolConfig | Mapping[str, Any] | None, factory: PoolFactory, *,
              pool_type: type) -> tuple[Any, bool]:
    """The pool an integration object works on: the application's `pool` (registered), else `acquire`'s for `pool_config`.

    Args:
        pool: the application's pool, or `None`.
        pool_config: the configuration of a shared pool (when `pool` is `None`).
        factory: opens a pool for a configuration.
        pool_type: the pool class (`agentmem.MemoryPool`, of one model or many): registered
            by its (default model's) configuration, so that other integrations with it find it.

    Returns `(pool, owned)` as `acquire` does (`owned`: `release` it once when done).

    Raises:
        ValueError: both `pool` and `pool_config` given.
        TypeError: `pool` is not a `pool_type`.
    """
    if pool is not None and pool_config is not None:
        raise ValueError("pass either pool= (an open MemoryPool) or pool_config=, not both")
    if pool is not None:
        if not isinstance(pool, pool_type):
            raise TypeError(f"pool must be an agentmem.MemoryPool, got {type(pool).__name__}")
        register(pool)
        return pool, False
    cfg = PoolConfig.from_dict(pool_config) if isinstance(pool_config, Mapping) else (pool_config or PoolConfig())
    return acquire(cfg, factory)


def release(pool: Any) -> None:
    """Drop one `acquire` of a registry-created pool; the last one closes it (unless pinned)."""
    with _lock:
        entry = _owned.get(id(pool))
        if entry is None or entry.pool is not pool:
            return
        entry.holders = max(0, entry.holders - 1)
        if entry.holders or entry.pinned:
            return
        del _owned[id(pool)]
    logger.info("closing a shared pool (its last client closed)")
    pool.close()


def shared_pool(config: PoolConfig, factory: PoolFactory) -> Any:
    """The open pool for `config`, opened with `factory` if there is none, kept open.

    A pool the registry opens here stays open until `close_shared_pools` (or exit);
    a pool that was closed meanwhile is replaced by a new one.
    """
    with _lock:
        pool, entry = _open(config, factory)
        if entry is not None:
            entry.pinned = True
        return pool


def close_shared_pools() -> None:
    """Close every pool the registry opened (their agents' KV state is dropped). Idempotent.

    Application-owned pools (`register`) are left to the application.
    """
    with _lock:
        pools = [e.pool for e in _owned.values()]
        _owned.clear()
    for pool in pools:
        pool.close()


atexit.register(close_shared_pools)
