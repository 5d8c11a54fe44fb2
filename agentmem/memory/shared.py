"""Shared prefixes and agent-to-agent handoff.

Agents of one app start from the same tokens (a team brief, the user's task, a
shared document). In the unified KV cache one set of cells can belong to many
sequences: ``seq_cp`` only adds a sequence tag, so a prefix decoded once is
*shared*, not copied, and each agent's later tokens diverge copy-on-write.

* :func:`longest_shared_prefix` — which agent (or declared share) holds the
  longest prefix of a prompt. A vectorized scan over ledgers: for the tens to
  hundreds of agents one pool holds this is faster than maintaining a radix tree
  in Python on every ledger change, and it sees evictions and edits for free.
* :class:`HandoffCard` — the descriptor of a handoff (``pool.handoff``): what
  was handed over, at which positions, for which model, with a checksum of the
  token ids and a sequence number.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from agentmem.memory.ledger import Ledger

__all__ = ["SHARE_PREFIX", "HandoffCard", "longest_shared_prefix", "token_checksum"]

#: agent-id prefix of declared shares (``pool.share(name, ...)`` → ``"share:" + name``)
SHARE_PREFIX = "share:"


def token_checksum(tokens: np.ndarray) -> str:
    """A short checksum of token ids (int32 little-endian)."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes()).hexdigest()[:16]


def longest_shared_prefix(tokens: np.ndarray, candidates: Iterable[tuple[str, Ledger]]) -> tuple[str | None, int]:
    """The candidate whose *live* ledger prefix matches ``tokens`` longest.

    Only a prefix whose tokens are all live (no eviction inside it) can be shared,
    because its KV positions must equal its token positions.

    >>> a, b = Ledger(), Ledger()
    >>> a.extend([1, 2, 3, 4], region="system"); b.extend([1, 2, 9], region="system")
    >>> longest_shared_prefix(np.array([1, 2, 3, 7]), [("a", a), ("b", b)])
    ('a', 3)
    """
    best, best_n = None, 0
    for agent_id, led in candidates:
        n = led.common_prefix(tokens)
        if n <= best_n:
            continue
        live = led.live
        if not live[:n].all():
            n = int(np.argmin(live[:n]))  # the prefix before the first evicted token
        if n > best_n:
            best, best_n = agent_id, n
    return best, best_n


@dataclass(frozen=True, slots=True)
class HandoffCard:
    """What ``pool.handoff(src, dst)`` gave the destination.

    Attributes:
        src: the agent handed from.
        dst: the agent handed to.
        seq_no: the pool's running handoff number.
        n_tokens: history tokens handed over (the destination's ledger length).
        n_live: KV cells handed over (positions ``0..n_live-1``).
        mode: ``"shared"`` (cells tagged for both, no copy: the source was live)
            or ``"restored"`` (the source's parked state loaded into the destination).
        fingerprint: model fingerprint both agents' KV belongs to.
        checksum: checksum of the handed token ids (see :func:`token_checksum`).
        created: Unix time.
    """

    src: str
    dst: str
    seq_no: int
    n_tokens: int
    n_live: int
    mode: str
    fingerprint: str
    checksum: str
    created: float = field(default_factory=time.time)

    def verify(self, ledger_tokens: np.ndarray) -> bool:
        """True when ``ledger_tokens[:n_tokens]`` still carries this card's checksum."""
        return len(ledger_tokens) >= self.n_tokens and token_checksum(ledger_tokens[: self.n_tokens]) == self.checksum
