"""Where KV state lives between calls, below the pool.

* `ledger` — per-agent token ledger: tokens, regions, pins, message indices, live flags.
* `parking` — a parked state (`ParkedState`) and the park codecs that encode it.
* `tiers` — WARM (RAM) and COLD (archive) stores behind one `Tier` interface, in an ordered `TierChain`; the place names.
* `shared` — shared-prefix blocks (`BlockStore`, `KVBlock`), the prefix radix tree, handoff cards.
* `prefetch` — the transition predictor that guesses the next agent.
"""
