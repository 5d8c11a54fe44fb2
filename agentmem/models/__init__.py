"""Several models in one pool: agents bound to models, weights as a memory tier.

`pool.py` is `ModelPool`, the public face: one `MemoryPool` per model, one budget.
`specs.py` holds `ModelSpec` (a model's GGUF and its pool options) and its footprint.
`bindings.py` binds each agent to one model, durable through the per-model archives.
`tier.py` loads and unloads models within the RAM/VRAM budget (`ModelTier`), never losing KV.
`policy.py` holds the unload strategies (`cost`: reload time × likelihood of next use; `lru`).
`lease.py` holds `ModelLease`: one use of a loaded model, never unloaded until released.
`workflow.py` says which agent comes next (hints, else a successor predictor), for prefetch.
`seats.py` gives one call of a front-end its model (`seat`, `aseat`): a `MemoryPool` as it is, or a lease.
"""

from __future__ import annotations

from agentmem.models.lease import ModelLease
from agentmem.models.policy import CostUnload, LruUnload, UnloadPolicy
from agentmem.models.pool import ModelPool
from agentmem.models.seats import Pools, aseat, seat
from agentmem.models.specs import ModelSpec

__all__ = ["CostUnload", "LruUnload", "ModelLease", "ModelPool", "ModelSpec", "Pools", "UnloadPolicy", "aseat", "seat"]
