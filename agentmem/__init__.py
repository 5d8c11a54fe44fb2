"""agentmem — a memory layer for multi-agent LLM apps on one local llama.cpp model.

Every agent keeps its KV state: live in a llama.cpp sequence, or parked in RAM,
so switching agents costs a restore (milliseconds) instead of a re-prefill.
`MemoryPool` is the one pool: of one model (`MemoryPool("gemma-3-270m")`) or of many
(`MemoryPool(models={...}, ram_budget_bytes=...)`); `ModelPool` is its deprecated old name
for the second form.

>>> from agentmem import MemoryPool
>>> pool = MemoryPool(resident_agents=2)                      # doctest: +SKIP
>>> pool.chat("planner", [{"role": "user", "content": "Hi"}]).text   # doctest: +SKIP
"""

from __future__ import annotations

# First, before anything that imports numpy: llama.cpp's native libraries (a CUDA build
# segfaults at its first model load when numpy initialised first; see native_first).
from agentmem.engine import native_first  # noqa: F401  isort: skip

import logging

from agentmem.config import PoolConfig
from agentmem.errors import (
    AgentMemError,
    ArchiveError,
    CodecError,
    ConfigError,
    ContextOverflowError,
    EngineError,
    FingerprintMismatch,
    ImportOrderError,
    MessageError,
    ModelError,
    ModelNotFoundError,
    PolicyError,
    StateError,
    UnknownAgentError,
)
from agentmem.pool import ChatResult, ChatStream, Timings, Usage
from agentmem.models import MemoryPool, ModelPool, ModelSpec
from agentmem.model import resolve_model_path

__version__ = "0.1.0"

__all__ = [
    "AgentMemError",
    "ArchiveError",
    "ChatResult",
    "ChatStream",
    "CodecError",
    "ConfigError",
    "ContextOverflowError",
    "EngineError",
    "FingerprintMismatch",
    "ImportOrderError",
    "MemoryPool",
    "MessageError",
    "ModelError",
    "ModelNotFoundError",
    "ModelPool",
    "ModelSpec",
    "PolicyError",
    "PoolConfig",
    "StateError",
    "Timings",
    "UnknownAgentError",
    "Usage",
    "__version__",
    "resolve_model_path",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
