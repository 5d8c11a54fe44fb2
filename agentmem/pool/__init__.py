"""One model's engine: many agents on one llama.cpp context, and the collaborators that run one call.

The public pool is `agentmem.MemoryPool` (`agentmem.models.pool`): a pool of one model or of many,
each model run by a `ModelEngine` of this package.

* `facade` — `ModelEngine`: one model's calls, validation, wiring and close.
* `operations` — the engine's agent operations: forget, park, priorities, budgets, pins, share, handoff, recall, checkpoints.
* `opening` — building what a pool shares (model, context, renderer, archive, tiers) as a `PoolCore`, and wiring the collaborators.
* `turn` — one call as named phases: admit → place → reconcile → share → prefill → generate → finish.
* `layout` — the KV layout (one unified cache or a stream per sequence) and the rule `kv_layout="auto"` follows.
* `decoder` — chunked prefill, and batched decode steps of concurrent agents.
* `canon` — a free tool call's first tokens rewritten in the KV with its format's opening, and its closing completed.
* `residence` — where an agent lives (`Residence`: sequence, tier, codec, calls, pins) and the only functions that change it.
* `residency` — which agents hold sequences, who gets the next one, and the one make-room loop.
* `mover` — park / restore / demote / drop / forget across tiers; `make_resident`, how a call gets its sequence.
* `sequence` — the one door to each resident agent's KV (`AgentSeq`: cut, evict, capture, load, link, copy, privatize, clear).
* `window` — every sliding-window rule in one object (`SlidingWindow`, with a no-op twin `NoWindow`): the door's private strategy.
* `blocks` — agents' references to shared KV blocks and where a block's bytes are kept.
* `sharing` — prefix donors, copying cells between sequences, handoffs, privatizing shared cells.
* `trimming` — runs the eviction policy on an agent, shifts cells, writes recall rows.
* `kvcapture` — recall as KV (`PoolConfig.recall_kv`): evicted spans' cells kept, spliced back where they recur.
* `persist` — archive sync (ledger + state in one transaction) and resume on open.
* `budgets` — each tier's byte budget with watermarks, applied down the tier chain.
* `prefetch` — the after-call worker: rebalance, restore the agent expected next.
* `tenants` — tenant scopes: whose KV an agent may start from; `tenant_of`/`add_tenants`/`tenant_usage`.
* `hints` — workflow hints: expected order, holds, their counters; `expect`/`hold`/`unhold`.
* `state` — the agent record (`AgentState`) with its invariants, counters, and the shared `PoolCore`.
* `stats` — `ModelEngine.stats()`.
* `results` — `Usage`, `Timings`, `ChatResult`, `ChatStream`.
* `lifetime` — calls in flight, their cancel flags, and a `close` that frees native handles only when none is inside.
"""

from __future__ import annotations

import warnings
from typing import Any

from agentmem.memory.shared import HandoffCard
from agentmem.pool.facade import ModelEngine
from agentmem.pool.results import ChatResult, ChatStream, Timings, Usage

__all__ = ["ChatResult", "ChatStream", "HandoffCard", "ModelEngine", "Timings", "Usage"]


def __getattr__(name: str) -> Any:
    """`agentmem.pool.MemoryPool`, the old name of one model's pool: the engine, with a `DeprecationWarning`."""
    if name == "MemoryPool":
        warnings.warn("agentmem.pool.MemoryPool is one model's engine, now named agentmem.pool.ModelEngine; "
                      "the public pool (one model or many) is agentmem.MemoryPool", DeprecationWarning, stacklevel=2)
        return ModelEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
