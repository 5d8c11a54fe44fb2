"""Policies: small strategy objects that decide order, never move bytes.

* `placement` — which agent to park or demote first (`lru`, `cost`) and with which codec.
* `eviction` — the registered eviction policies by name (`get_policy`), `sliding_window` and `streaming_llm`.
* `eviction_base` — the `EvictionPolicy` interface and the block selection every policy shares.
* `region_decay` — MemDecay's region-aware scoring (`RegionDecay`), the default eviction policy.
* `view` — the read-only view of a ledger an eviction policy sees (`LedgerView`).
"""
