"""Where KV state lives and moves: ledgers, the pool, parking, tiers, codec."""
