"""Where KV state lives and moves: ledgers, parking, tiers, archive, codec, shared blocks."""
