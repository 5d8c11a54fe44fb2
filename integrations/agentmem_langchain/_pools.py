"""Process-wide shared pools, so that many chat-model objects share one model.

Every :class:`~agentmem_langchain.ChatAgentMem` or
:class:`~agentmem_langchain.AgentMemLLM` built *without* an explicit ``pool``
asks :func:`shared_pool` for the pool of its ``(model_path, pool_options)``.
The first such call loads the model (about half a second for the default
model); later calls — from any object, any agent — get the same pool. Building
the LangChain objects themselves never loads anything.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

from agentmem import MemoryPool

__all__ = ["close_shared_pools", "shared_pool"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_pools: dict[tuple[str | None, tuple[tuple[str, Any], ...]], MemoryPool] = {}


def _key(model_path: str | None, options: dict[str, Any]) -> tuple[str | None, tuple[tuple[str, Any], ...]]:
    return (str(model_path) if model_path is not None else None, tuple(sorted(options.items())))


def shared_pool(model_path: str | None = None, **options: Any) -> MemoryPool:
    """The shared :class:`~agentmem.MemoryPool` for ``model_path`` and ``options``.

    Created (the model loaded) on the first call for a given combination; a pool
    that was closed meanwhile is replaced by a new one.

    Args:
        model_path: GGUF file; ``None`` = ``AGENTMEM_MODEL`` or the bundled default model.
        **options: :class:`~agentmem.PoolConfig` fields (``n_ctx``, ``resident_agents``...).
    """
    key = _key(model_path, options)
    with _lock:
        pool = _pools.get(key)
        if pool is None or getattr(pool, "_closed", False):
            logger.info("creating shared pool for model_path=%s options=%s", model_path, options)
            pool = _pools[key] = MemoryPool(model_path, **options)
        return pool


def close_shared_pools() -> None:
    """Close every shared pool (their agents' KV state is dropped). Idempotent."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


atexit.register(close_shared_pools)
