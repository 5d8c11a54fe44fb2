"""Where parked KV states live: one interface, an ordered chain built in one place.

* `Tier` — the interface: `put`/`get`/`delete`/`nbytes` of `ParkedState` by
  agent id, plus what the pool asks of a tier (its byte budget, whether it keeps
  a copy when a state is restored, the bytes of shared blocks it holds, the
  order its states leave in).
* `WarmTier` — RAM (a dict of numpy buffers; zero copies on get).
* `ColdTier` — the SQLite archive (`Archive`);
  states carry the pool's fingerprint and a checksum, verified on every get.
* `TierChain` — the tiers in order, fastest first: parks go into `first`, a tier
  over its budget demotes into the one `below` it, the last one drops.
* `build_tiers` — the factory: `[warm]` or `[warm, cold]` in order.

The names of the places an agent's KV can be (`HOT`, `WARM`, `COLD`, `EMPTY`)
are defined here and nowhere else; they are also what archives, `stats()`,
`/agents` and the metrics print. The HOT place (a live llama.cpp sequence) is the
pool's own (`agentmem.pool.residence`). A new tier is one subclass of `Tier`
added to `build_tiers` (docs/tiers.md shows what it implements).
"""

from __future__ import annotations

import abc
import logging
from typing import TYPE_CHECKING, Any, Callable, Final, Iterator, Literal, Mapping, Sequence, TypeVar, get_args

import numpy as np

from agentmem.archive import Archive
from agentmem.errors import AgentMemError
from agentmem.memory.parking import ParkedState

if TYPE_CHECKING:
    from agentmem.memory.shared import BlockStore

__all__ = ["COLD", "EMPTY", "HOT", "TIER_NAMES", "WARM", "TierName", "ColdTier", "Tier", "TierChain", "WarmTier", "build_tiers"]

logger = logging.getLogger(__name__)

#: The name of a tier below HOT, as typed in a request (`park(tier=...)`, `POST /agents/{id}?action=park`).
TierName = Literal["warm", "cold"]
#: Every tier a pool may have, fastest first: what `stats()` and the metrics report
#: (a tier the pool lacks, such as COLD without an archive, reports zeros).
TIER_NAMES: Final[tuple[TierName, ...]] = get_args(TierName)
#: Parked in RAM (`WarmTier`).
WARM: Final[TierName] = TIER_NAMES[0]
#: Parked in the archive (`ColdTier`).
COLD: Final[TierName] = TIER_NAMES[1]
#: An agent's KV is in a live llama.cpp sequence (the pool's own place, not a `Tier`).
HOT: Final = "hot"
#: Nothing of the agent's KV is kept: its next call prefills.
EMPTY: Final = "empty"

_T = TypeVar("_T")


class Tier(abc.ABC):
    """A store of parked states keyed by agent id, one link of the `TierChain`.

    A tier implements five storage methods (`put`, `get`, `delete`, `nbytes`,
    `agents`) and `shared_bytes`, and says what it is (the attributes below); the
    chain and the pool do the rest (moving states in and out, budgets,
    statistics). Its release order and codec follow the placement policy unless
    it overrides `release_order` / `codec_for`:

    Attributes:
        name: the tier's name, as `stats()`, the archive and `/agents` print it.
        durable: whether a stored copy survives its restore. A durable tier (the
            archive) keeps the state when it is loaded into a sequence, so a later
            park into it can be skipped or a crash loses nothing; a volatile one
            (RAM) gives the state up on restore.
        budget_bytes: bytes this tier may hold (`0` = unlimited); above the high
            watermark the pool demotes states into the next tier of the chain,
            or drops them when this tier is the last.
    """

    name: str = "tier"
    durable: bool = False

    def __init__(self, *, budget_bytes: int = 0) -> None:
        self.budget_bytes = budget_bytes

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
        """Bytes of every state stored here (shared blocks not included)."""
        return sum(self.nbytes(a) for a in self.agents())

    @abc.abstractmethod
    def shared_bytes(self, blocks: BlockStore) -> int:
        """Bytes of the shared KV blocks this tier keeps (counted once, not per member).

        Args:
            blocks: the pool's shared blocks (those kept in RAM say so).
        """

    def release_order(self, infos: Sequence[_T], order: Callable[[list[_T]], list[_T]]) -> list[_T]:
        """The order this tier's states leave it when it is over its budget (first = first out).

        Args:
            infos: what the placement policy sees of each state's agent.
            order: the placement policy's release order (`PlacementPolicy.release_order`):
                by default a tier follows it; a tier with an order of its own
                (say, by bytes) overrides this method.
        """
        return order(list(infos))

    def codec_for(self, info: _T, choose: Callable[[_T, str], str]) -> str:
        """The codec a state of `info`'s agent is stored with here.

        Args:
            info: what the placement policy sees of the agent.
            choose: the placement policy's choice (`PlacementPolicy.codec_for(info, tier_name)`:
                `park_codec` in RAM, `cold_codec` in the archive, by priority under `cost`);
                by default a tier follows it; a tier that can hold one format only
                overrides this method.
        """
        return choose(info, self.name)


class WarmTier(Tier):
    """Parked states in RAM."""

    name = WARM

    def __init__(self, *, budget_bytes: int = 0) -> None:
        super().__init__(budget_bytes=budget_bytes)
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

    def shared_bytes(self, blocks: BlockStore) -> int:
        return blocks.ram_bytes()


class ColdTier(Tier):
    """Parked states in the SQLite archive, fingerprinted and checksummed.

    A state that references a shared block is stored as its private cells plus
    the block's id; the archive counts the references and drops a block with none.
    """

    name = COLD
    durable = True

    def __init__(self, archive: Archive, fingerprint: Mapping[str, Any], *, budget_bytes: int = 0) -> None:
        super().__init__(budget_bytes=budget_bytes)
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
            agent_id, state.data, codec=state.codec, n_tokens=state.n_tokens, fingerprint=self.fingerprint,
            tier=self.name,
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

    def shared_bytes(self, blocks: BlockStore) -> int:
        return sum(b.n_bytes for b in self.archive.list_shared_blocks())

    def agents(self) -> Iterator[str]:
        return iter(list(self._sizes))

    def total_bytes(self) -> int:
        return sum(self._sizes.values())


class TierChain(Mapping[str, Tier]):
    """The tiers below HOT in order, fastest first; a read-only mapping of name to tier.

    Parks go into `first`; a tier over its budget demotes into the tier `below`
    it (the last one drops). Built once, by `build_tiers`.

    Args:
        tiers: the tiers, fastest first; names must differ.
    """

    def __init__(self, tiers: Sequence[Tier]) -> None:
        names = [t.name for t in tiers]
        assert tiers and len(set(names)) == len(names), f"{names=}"
        self._tiers = {t.name: t for t in tiers}
        self._order = list(tiers)

    def __getitem__(self, name: str) -> Tier:
        return self._tiers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tiers)

    def __len__(self) -> int:
        return len(self._tiers)

    @property
    def first(self) -> Tier:
        """The fastest tier: where a park goes unless told otherwise."""
        return self._order[0]

    def below(self, tier: Tier) -> Tier | None:
        """The tier `tier`'s states are demoted into, or None when it is the last (they are dropped)."""
        i = self._order.index(tier)
        return self._order[i + 1] if i + 1 < len(self._order) else None

    @property
    def durable(self) -> Tier | None:
        """The tier that keeps a state across restores and restarts (the archive), or None."""
        return next((t for t in self._order if t.durable), None)

    @property
    def volatile(self) -> list[Tier]:
        """The tiers whose copy is given up when a state is restored (RAM)."""
        return [t for t in self._order if not t.durable]


def build_tiers(*, archive: Archive | None, fingerprint: Mapping[str, Any], warm_budget_bytes: int = 0,
                cold_budget_bytes: int = 0) -> TierChain:
    """The ordered tier chain below HOT: WARM then, with an archive, COLD.

    Args:
        archive: the archive COLD stores into; None for a pool without one (WARM only).
        fingerprint: model and KV settings every archived state carries (checked on load).
        warm_budget_bytes: RAM for parked states (`0` = unlimited).
        cold_budget_bytes: archive bytes for states (`0` = unlimited).
    """
    chain: list[Tier] = [WarmTier(budget_bytes=warm_budget_bytes)]
    if archive is not None:
        chain.append(ColdTier(archive, fingerprint, budget_bytes=cold_budget_bytes))
    return TierChain(chain)
