"""Where an agent lives: one record (`Residence`) and the only functions that change it.

An agent's place is its live sequence while it is HOT, else the tier its parked
state is in (WARM, COLD) with that state's codec, or EMPTY; two counters say who
holds it there: the call running on it (`calls`) and the pins of whoever needs it
to stay put meanwhile (`pins`: a handoff's source, a donor whose cells are being
copied, a member whose cells a restore links, an agent on its way up). Every
module reads the record (`AgentState.tier`, `.kv`, `.seq`, `.held`…); only the
functions below write it, each named for the event it records:

* `seat` / `unseat` — a sequence assigned / returned (`Residency`).
* `parked_in` / `emptied` — a state stored in a tier / nothing stored any more
  (`Mover`, `Sharing.reset`, `Persister` registering an archived agent).
* `call_begins` / `call_ends` — a call holds the agent (`TurnRunner`).
* `pin` / `unpin`, or `pinned(...)` as a context manager — a refcount.

The record holds no policy: where a state *should* go is the mover's and the
budgets' business (`agentmem.pool.mover`, `agentmem.pool.budgets`), over the
chain of tiers (`agentmem.memory.tiers.TierChain`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Protocol

from agentmem.memory.tiers import EMPTY, HOT

if TYPE_CHECKING:
    from agentmem.pool.sequence import AgentSeq

__all__ = [
    "Residence", "Resident", "call_begins", "call_ends", "emptied", "parked_in", "pin", "pinned", "seat", "unpin", "unseat",
]


@dataclass(slots=True)
class Residence:
    """An agent's place: its sequence, or the tier and codec of its parked state; who holds it.

    Invariants (`check`): `kv` is set exactly while the agent is HOT, and then
    `tier` is EMPTY (its state is in the sequence, not in a tier); there is no
    `codec` without a tier; `calls` and `pins` never go negative.

    Attributes:
        kv: the door to its sequence (`agentmem.pool.sequence.AgentSeq`) while it is resident.
        tier: the name of the tier its parked state is in, else EMPTY.
        codec: the codec of that parked state (`"f16"`, `"q8_0/q4_0"`…), else None.
        calls: calls running on the agent (one at a time: they share one sequence).
        pins: holders that need the agent kept where it is (not parked, evicted,
            forgotten or handed a new context) while they work; a refcount.
    """

    kv: AgentSeq | None = None
    tier: str = EMPTY
    codec: str | None = None
    calls: int = 0
    pins: int = 0

    @property
    def place(self) -> str:
        """HOT while it has a sequence, else its tier's name (EMPTY: nothing kept)."""
        return HOT if self.kv is not None else self.tier

    @property
    def held(self) -> bool:
        """Whether a call or a pin holds it: no other thread may park, evict or forget it."""
        return bool(self.calls or self.pins)

    @property
    def hold(self) -> str:
        """What holds it, for messages: `"generating"` (a call), `"pinned"` (pins only) or `""` (free)."""
        return "generating" if self.calls else "pinned" if self.pins else ""

    def check(self, agent_id: str) -> None:
        """Assert the invariants (see the class docstring)."""
        assert self.kv is None or self.tier == EMPTY, f"{agent_id=}, {self.kv=}, {self.tier=}"
        assert self.tier != EMPTY or self.codec is None, f"{agent_id=}, {self.tier=}, {self.codec=}"
        assert self.calls >= 0 and self.pins >= 0, f"{agent_id=}, {self.calls=}, {self.pins=}"


class Resident(Protocol):
    """What the functions below need of an agent (`agentmem.pool.state.AgentState` is one)."""

    id: str
    residence: Residence


def seat(a: Resident, kv: AgentSeq) -> None:
    """`a` holds sequence `kv` now (its parked state, if any, is about to be loaded into it)."""
    r = a.residence
    assert r.kv is None, f"{a.id=}, {r.kv=}"
    r.kv = kv


def unseat(a: Resident) -> int:
    """`a` gives its (emptied) sequence back; returns the sequence id."""
    r = a.residence
    assert r.kv is not None, f"{a.id=}"
    seq, r.kv = r.kv.id, None
    return seq


def parked_in(a: Resident, tier: str, codec: str | None) -> None:
    """`a`'s state is stored in tier `tier`, encoded with `codec` (None: the store did not say)."""
    r = a.residence
    r.tier, r.codec = tier, codec


def emptied(a: Resident) -> None:
    """No tier holds `a`'s state any more: it was loaded into its sequence, dropped or reset."""
    r = a.residence
    r.tier, r.codec = EMPTY, None


def call_begins(a: Resident) -> None:
    """A call holds `a` (until `call_ends`)."""
    a.residence.calls += 1


def call_ends(a: Resident) -> None:
    """The call that held `a` is over."""
    r = a.residence
    assert r.calls > 0, f"{a.id=}"
    r.calls -= 1


def pin(a: Resident) -> None:
    """One more holder needs `a` kept where it is (until its `unpin`)."""
    a.residence.pins += 1


def unpin(a: Resident) -> None:
    """One holder of `a` is done."""
    r = a.residence
    assert r.pins > 0, f"{a.id=}"
    r.pins -= 1


@contextmanager
def pinned(*agents: Resident) -> Iterator[None]:
    """Pin every agent of `agents` for the `with` block (unpinned however it ends)."""
    for x in agents:
        pin(x)
    try:
        yield
    finally:
        for x in agents:
            unpin(x)
