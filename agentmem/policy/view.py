"""What an eviction policy sees of one agent: flat arrays over its *live* tokens.

The pool builds a `LedgerView` from an agent's ledger when the agent
exceeds its token budget; a policy (see `agentmem.policy.eviction`) returns
ranges of live positions to evict. Positions are indices into the live KV
(``0..n_live-1``), which stay contiguous after eviction (later cells are shifted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentmem.engine.chat_format import REGIONS

__all__ = ["REGION_CODE", "LedgerView"]

#: region name -> small integer code used in `LedgerView.regions`
REGION_CODE: dict[str, int] = {name: i for i, name in enumerate(REGIONS)}


@dataclass(frozen=True, slots=True)
class LedgerView:
    """Live tokens of one agent, as parallel arrays of length ``n``.

    Attributes:
        tokens: token ids (int32), in KV order.
        regions: region code per token (uint8, see `REGION_CODE`).
        pinned: True where the token must never be evicted (bool).
        turn: index of the message each token came from (int32; generated
            tokens carry the index of the turn they answered, template glue -1
            gets the index of the following message).
        current_turn: index of the newest message (age = current_turn - turn).
        recent: token ids of the newest user/tool turn (for refresh by reference).
    """

    tokens: np.ndarray
    regions: np.ndarray
    pinned: np.ndarray
    turn: np.ndarray
    current_turn: int
    recent: np.ndarray

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])
