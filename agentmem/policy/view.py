"""What an eviction policy sees of one agent: flat arrays over its *live* tokens.

The pool builds a `LedgerView` from an agent's ledger (`LedgerView.from_ledger`)
when the agent exceeds its token budget; a policy (see `agentmem.policy.eviction`)
returns ranges of live positions to evict. Positions are indices into the live KV
(`0..n_live-1`), which stay contiguous after eviction (later cells are shifted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentmem.engine.chat_format import REGIONS

__all__ = ["REGION_CODE", "LedgerView", "message_turns"]

#: region name -> small integer code used in `LedgerView.regions`
REGION_CODE: dict[str, int] = {name: i for i, name in enumerate(REGIONS)}


@dataclass(frozen=True, slots=True)
class LedgerView:
    """Live tokens of one agent, as parallel arrays of length `n`.

    Attributes:
        tokens: token ids (int32), in KV order.
        regions: region code per token (uint8, see `REGION_CODE`).
        pinned: True where the token must never be evicted (bool).
        turn: index of the message each token came from (int32; generated
            tokens carry the index of the turn they answered, template glue -1
            gets the index of the following message, see `message_turns`).
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

    @classmethod
    def from_ledger(
        cls,
        tokens: np.ndarray,
        regions: np.ndarray,
        pinned: np.ndarray,
        messages: np.ndarray,
        live: np.ndarray,
        *,
        n_messages: int,
    ) -> LedgerView:
        """The view of an agent's ledger arrays during a call with `n_messages` messages.

        Args:
            tokens: every token of the history (live and evicted), in order.
            regions: region code per history token.
            pinned: pin flag per history token.
            messages: source message per history token; -1 for template glue (BOS,
                the generation prompt), `n_messages` for the reply being generated.
            live: True where the token has a KV cell.
            n_messages: messages of the current call; the newest is `n_messages - 1`.

        Returns:
            The view over the live tokens: `turn` from `message_turns`,
            `current_turn = n_messages - 1`, `recent` = the newest message's live tokens.
        """
        msg = messages[live]
        last = n_messages - 1
        recent = tokens[(messages == last) & live] if last >= 0 else np.zeros(0, np.int32)
        return cls(
            tokens=tokens[live], regions=regions[live], pinned=pinned[live],
            turn=message_turns(msg, n_messages), current_turn=max(last, 0), recent=recent,
        )


def message_turns(messages: np.ndarray, n_messages: int) -> np.ndarray:
    """Turn of every token: its message, or for glue (-1) the message that follows it.

    Glue belongs to the turn it opens: BOS and a template's preamble to the first
    message, a generation prompt to the reply after it (`n_messages` when nothing
    follows yet). Counting glue as the newest turn, as the pool once did, made a
    BOS-less model's first generation prompt the start of the "newest" turn, so
    `region_decay` protected everything after it and evicted the system prompt first.

    >>> message_turns(np.array([-1, 0, 0, 1, -1, 2, -1]), 3).tolist()
    [0, 0, 0, 1, 2, 2, 3]
    """
    msg = np.asarray(messages)
    n = msg.shape[0]
    at = np.where(msg >= 0, np.arange(n), n)
    nxt = np.minimum.accumulate(at[::-1])[::-1] if n else at  # next position holding a message
    own = np.append(msg, n_messages)
    return own[nxt].astype(np.int32)
