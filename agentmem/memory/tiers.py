"""Where parked KV states live: one interface, an ordered chain built in one place.

* `Tier` — the interface: `put`/`get`/`delete`/`nbytes` of
  `ParkedState` by agent id.
* `WarmTier` — RAM (a dict of numpy buffers; zero copies on get).
* `ColdTier` — the SQLite archive (`Archive`);
  states carry the pool's fingerprint and a checksum, verified on every get.
* `build_tiers` — the factory: `[warm]` or `[warm, cold]` in order.

The HOT tier (a live llama.cpp sequence) is the pool's own; moving a state
between any two tiers is one pool operation (`MemoryPool._move`).
"""

from __future__ import annotations

import abc
import logging
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from agentmem.archive import Archive
from agentmem.errors import AgentMemError
from agentmem.memory.parking import ParkedState

__all__ = ["ColdTier", "Tier", "WarmTier", "build_tiers"]

logger = logging.getLogger(__name__)


class Tier(abc.ABC):
    """A store of parked states keyed by agent id."""

    name: str = "tier"

    @abc.abstractmethod
    def put(self, agent_id: str, state: ParkedState) -> None:
        """Store (replace) `agent_id`'s state."""

    @abc.abstractmethod
    def get(self, agent_id: str) -> ParkedState | None:
        """The state, or `None`. Raises `StateError` when it is unusable."""

    @abc.abstractmethod
    def delete(self, agent_id: str) -> None:
        """Drop the state if present."""

    @abc.abstractmethod
    def nbytes(self, agent_id: str) -> int:
        """Bytes of the stored state (0 when absent)."""

    @abc.abstractmethod
    def agents(self) -> Iterator[str]:
        """Ids with a state here."""

    def __contains__(self, agent_id: object) -> bool:
        return isinstance(agent_id, str) and self.nbytes(agent_id) > 0

    def total_bytes(self) -> int:
        return sum(self.nbytes(a) for a in self.agents())


class WarmTier(Tier):
    """Parked states in RAM."""

    name = "warm"

    def __init__(self) -> None:
        self._states: dict[str, ParkedState] = {}
        self._total = 0

    def put(self, agent_id: str, state: ParkedState) -> None:
        self.delete(agent_id)
        self._states[agent_id] = state
        self._total += state.nbytes

    def get(self, agent_id: str) -> ParkedState | None:
        return self._states.get(agent_id)

    def delete(self, agent_id: str) -> None:
        old = self._states.pop(agent_id, None)
        if old is not None:
            self._total -= old.nbytes

    def nbytes(self, agent_id: str) -> int:
        s = self._states.get(agent_id)
        return s.nbytes if s else 0

    def agents(self) -> Iterator[str]:
        return iter(list(self._states))

    def total_bytes(self) -> int:
        return self._total


class ColdTier(Tier):
    """Parked states in the SQLite archive, fingerprinted and checksummed.

    A state that references a shared block is stored as its private cells plus
    the block's id; the archive counts the references and drops a block with none.
    """

    name = "cold"

    def __init__(self, archive: Archive, fingerprint: Mapping[str, Any]) -> None:
        self.archive = archive
        self.fingerprint = dict(fingerprint)
        self._sizes: dict[str, int] = {}
        # cluster mode: `fence(agent_id)` gives the lease a write of that agent carries
        self.fence: Callable[[str], Any] | None = None
        for rec in archive.list_agents():
            if rec.state_bytes:
                self._sizes[rec.agent_id] = rec.state_bytes

    def put(self, agent_id: str, state: ParkedState) -> None:
        self.archive.put_state(
            agent_id, state.data, codec=state.codec, n_tokens=state.n_tokens, fingerprint=self.fingerprint, tier="cold",
            block_id=state.block, layout=None if state.order is None else np.ascontiguousarray(state.order, "<i4"),
            **self._fenced(agent_id),
        )
        self._sizes[agent_id] = state.nbytes

    def get(self, agent_id: str) -> ParkedState | None:
        # raises CodecError (checksum) / FingerprintMismatch (other model/config): both StateErrors
        st = self.archive.get_state(agent_id, fingerprint=self.fingerprint)
        if st is None:
            return None
        order = None if st.layout is None else np.frombuffer(st.layout, dtype="<i4").astype(np.int32)
        ckpt = ck_order = None
        try:
            got = self.archive.get_checkpoint(agent_id)
        except AgentMemError as exc:  # the state is still usable without it
            logger.warning("sliding-window checkpoint of %r unusable: %s", agent_id, exc)
            got = None
        if got is not None:
            ckpt = np.frombuffer(got[0], dtype=np.uint8)
            ck_order = None if got[1] is None else np.frombuffer(got[1], dtype="<i4").astype(np.int32)
        return ParkedState(
            np.frombuffer(st.blob, dtype=np.uint8), st.codec, st.n_tokens, window_ckpt=ckpt, block=st.block_id,
            order=order, window_order=ck_order,
        )

    def delete(self, agent_id: str) -> None:
        if agent_id in self._sizes:
            self.archive.delete_state(agent_id, **self._fenced(agent_id))
            del self._sizes[agent_id]

    def _fenced(self, agent_id: str) -> dict[str, Any]:
        return {} if self.fence is None else {"fence": self.fence(agent_id)}

    def nbytes(self, agent_id: str) -> int:
        return self._sizes.get(agent_id, 0)

    def track(self, agent_id: str, nbytes: int) -> None:
        """Record what the archive holds for `agent_id` now (`0`: no state); another process may have written it."""
        if nbytes:
            self._sizes[agent_id] = nbytes
        else:
            self._sizes.pop(agent_id, None)

    def agents(self) -> Iterator[str]:
        return iter(list(self._sizes))

    def total_bytes(self) -> int:
        return sum(self._sizes.values())


def build_tiers(*, archive: Archive | None, fingerprint: Mapping[str, Any]) -> dict[str, Tier]:
    """The ordered tier chain below HOT: `warm` then, with an archive, `cold`."""
    chain: dict[str, Tier] = {"warm": WarmTier()}
    if archive is not None:
        chain["cold"] = ColdTier(archive, fingerprint)
    return chain
