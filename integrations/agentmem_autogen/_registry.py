"""In-process registry of shared :class:`~agentmem.MemoryPool` objects.

Loading a component config must not load the model a second time: every client
built from a config (``load_component``, or no ``pool=`` argument) asks
:func:`acquire` for the pool of that configuration and gets the one already open
in this process, if any — whether a client created it or the application did
(pools handed to a client are :func:`register`\\ ed). Pools the registry created
are reference-counted and closed when their last client closes; pools the
application created stay the application's to close.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from typing import Any

from agentmem import MemoryPool, PoolConfig, resolve_model_path

__all__ = ["acquire", "pool_key", "register", "release"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_by_key: "weakref.WeakValueDictionary[str, MemoryPool]" = weakref.WeakValueDictionary()
_owned: dict[int, tuple[MemoryPool, int]] = {}  # id(pool) -> (pool, clients holding it)


def pool_key(config: PoolConfig, model_path: Any = None) -> str:
    """Identity of a pool: its configuration with the model path resolved."""
    d = config.to_dict()
    d["model_path"] = str(model_path if model_path is not None else resolve_model_path(config.model_path))
    return json.dumps(d, sort_keys=True)


def _is_open(pool: MemoryPool) -> bool:
    return not pool.closed


def register(pool: MemoryPool) -> None:
    """Make an application-owned pool findable by its configuration (weakly held)."""
    key = pool_key(pool.config, pool.model_path)
    with _lock:
        cur = _by_key.get(key)
        if cur is None or cur is pool or not _is_open(cur):
            _by_key[key] = pool


def acquire(config: PoolConfig) -> tuple[MemoryPool, bool]:
    """The open pool for ``config`` (created if there is none).

    Returns:
        ``(pool, owned)``: ``owned`` is true when the registry manages the pool's
        lifetime, and the caller must :func:`release` it once.
    """
    key = pool_key(config)
    with _lock:
        pool = _by_key.get(key)
        if pool is not None and _is_open(pool):
            entry = _owned.get(id(pool))
            if entry is not None and entry[0] is pool:
                _owned[id(pool)] = (pool, entry[1] + 1)
                return pool, True
            return pool, False
        logger.info("loading a shared pool for %s", key)
        pool = MemoryPool(config=config)
        _by_key[key] = pool
        _owned[id(pool)] = (pool, 1)
        return pool, True


def release(pool: MemoryPool) -> None:
    """Drop one reference to a registry-owned pool; the last one closes it."""
    with _lock:
        entry = _owned.get(id(pool))
        if entry is None or entry[0] is not pool:
            return
        n = entry[1] - 1
        if n > 0:
            _owned[id(pool)] = (pool, n)
            return
        del _owned[id(pool)]
    logger.info("closing shared pool (its last client closed)")
    pool.close()

