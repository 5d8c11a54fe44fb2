"""The one public pool, `MemoryPool`: one model or many; agents bound to models, weights as a memory tier.

`pool.py` is `MemoryPool`, the public face: one `ModelEngine` (`agentmem.pool`) per model, one
budget; a single model is a pool of one. `ModelPool` is its deprecated name for a pool of many.
`operations.py` holds the agent operations, each run on the agent's model; `hinting.py` the
workflow hints across models and the model prefetch.
`specs.py` holds `ModelSpec` (a model's GGUF and its pool options) and its footprint.
`bindings.py` binds each agent to one model, durable through the per-model archives.
`tier.py` loads and unloads models within the RAM/VRAM budget (`ModelTier`), never losing KV.
`policy.py` holds the unload strategies (`cost`: reload time × likelihood of next use; `lru`).
`lease.py` holds `ModelLease`: one use of a loaded model, never unloaded until released.
`workflow.py` says which agent comes next (hints, else a successor predictor), for prefetch.
`seats.py` gives one call of a front-end its model (`seat`, `aseat`): a lease on the agent's engine.
"""

from __future__ import annotations

from agentmem.models.lease import ModelLease
from agentmem.models.policy import CostUnload, LruUnload, UnloadPolicy
from agentmem.models.pool import MemoryPool, ModelPool
from agentmem.models.seats import Pools, aseat, seat
from agentmem.models.specs import ModelSpec

__all__ = ["CostUnload", "LruUnload", "MemoryPool", "ModelLease", "ModelPool", "ModelSpec", "Pools", "UnloadPolicy", "aseat", "seat"]
