"""`Budgets` under workflow hints, on fakes: which parked state the WARM budget gives up, and when.

Measured on the LangGraph team under a RAM budget (docs/benchmarks.md, "Framework apps
and workflow hints"): each rule below removed a re-prefill that the hints should have
prevented.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from agentmem.memory.tiers import EMPTY, HOT, WARM, Tier, TierChain
from agentmem.policy.placement import AgentInfo, get_policy
from agentmem.pool import residence
from agentmem.pool.budgets import Budgets
from agentmem.pool.hints import Hints
from agentmem.pool.residence import Residence
from agentmem.pool.state import AgentState


class FakeTier(Tier):
    """WARM holding states of the given sizes (no bytes stored)."""

    name = WARM

    def __init__(self, sizes: dict[str, int], *, budget_bytes: int) -> None:
        super().__init__(budget_bytes=budget_bytes)
        self.sizes = dict(sizes)

    def put(self, agent_id: str, state: Any) -> None:
        raise AssertionError("the budget never parks")

    def get(self, agent_id: str) -> Any:
        raise AssertionError("the budget reads no state")

    def shared_bytes(self, blocks: Any) -> int:
        return int(blocks.ram_bytes())

    def agents(self) -> Any:
        return iter(list(self.sizes))

    def nbytes(self, agent_id: str) -> int:
        return self.sizes.get(agent_id, 0)

    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def delete(self, agent_id: str) -> None:
        self.sizes.pop(agent_id, None)


class FakeMover:
    def __init__(self, core: Any) -> None:
        self.core, self.dropped = core, []

    def drop(self, a: Any) -> None:
        self.core.tiers[WARM].delete(a.id)
        residence.emptied(a)
        assert a.tier == EMPTY
        self.dropped.append(a.id)


def pool(*, budget: int, warm: dict[str, int], live: dict[str, int], busy: set[str] = frozenset(),
         idle: dict[str, float] | None = None) -> tuple[Budgets, FakeMover, Hints]:
    """A pool core with `warm` parked states (bytes) and `live` resident agents (state bytes)."""
    idle = idle or {}
    agents = {}
    for i, (x, n) in enumerate(live.items()):
        agents[x] = SimpleNamespace(id=x, tier=HOT, seq=i, held=x in busy, ledger=SimpleNamespace(n_live=10))
    for x in warm:
        a = agents[x] = AgentState(x, residence=Residence(tier=WARM, codec="f16", calls=int(x in busy)))
        a.ledger.extend(list(range(10)))
    sizes_by_seq = {i: n for i, n in enumerate(live.values())}
    core = SimpleNamespace(
        config=SimpleNamespace(warm_budget_bytes=budget, cold_budget_bytes=0, watermark_high=0.9, watermark_low=0.7),
        tiers=TierChain([FakeTier(warm, budget_bytes=budget)]), agents=agents,
        blocks=SimpleNamespace(ram_bytes=lambda: 0),
        ctx=SimpleNamespace(state_size=lambda seq: sizes_by_seq[seq]), placement=get_policy("lru"),
        info=lambda a: AgentInfo(a.id, a.tier, 0, 10, 1, idle.get(a.id, 1.0), 1, math.inf),
    )
    hints = Hints(clock=lambda: 0.0)
    mover = FakeMover(core)
    return Budgets(core, mover, hints), mover, hints  # type: ignore[arg-type]


def test_a_state_being_restored_does_not_count_against_the_budget() -> None:
    # a call restoring r parks the live agent first: WARM briefly holds r, c and w. r is
    # on its way out; counting it dropped c and w both (team app, WARM 16 MiB)
    b, mover, _ = pool(budget=100, warm={"r": 45, "c": 30, "w": 30}, live={"s": 30}, busy={"r"})
    b.rebalance(urgent_only=True)
    assert mover.dropped == []
    b, mover, _ = pool(budget=100, warm={"r": 45, "c": 30, "w": 30}, live={"s": 30})
    b.rebalance(urgent_only=True)
    assert mover.dropped, "an idle r counts: over the budget, something goes"


def test_no_room_is_kept_when_the_next_call_needs_no_sequence() -> None:
    # the researcher called its tool: it or the supervisor runs next, both live. Keeping
    # room for a park that will not come dropped the writer's state (team app, WARM 20 MiB)
    b, mover, hints = pool(budget=70, warm={"c": 30, "w": 30}, live={"s": 30, "r": 30})
    hints.expect([["s", "r"], ["c", "w"]])
    b.rebalance()
    assert mover.dropped == []
    b, mover, _ = pool(budget=70, warm={"c": 30, "w": 30}, live={"s": 30, "r": 30})
    b.rebalance()  # no hints: room for the largest live state, as before
    assert len(mover.dropped) == 1


def test_room_for_the_next_park_comes_only_from_states_needed_later() -> None:
    # c runs next and needs a sequence; r (not expected) is the one it parks. Room for r
    # may cost x (not expected either, idle longer) but not w, which is expected
    b, mover, hints = pool(budget=70, warm={"c": 30, "w": 30, "x": 10}, live={"s": 30, "r": 30},
                           idle={"x": 50.0, "r": 5.0})
    hints.expect([["c", "w"], "s"])
    assert b.next_out().id == "r"
    b.rebalance()
    assert mover.dropped == ["x"], "x before r in release order; w is needed sooner than r: kept"


def test_a_prefetch_that_parks_another_agent_keeps_its_own_state(tiny_model_path) -> None:
    # prefetching b parks a; if that pushes WARM over its budget, the state given up must
    # not be b's own (the tools app under 10 MiB dropped it, and b re-prefilled): while
    # its sequence is found, b counts as busy, and a busy agent's state is never given up
    from agentmem import MemoryPool

    def conv(agent: str) -> list[dict]:
        return [{"role": "system", "content": f"you are agent {agent}"}, {"role": "user", "content": f"step for {agent}"}]

    with MemoryPool(tiny_model_path, resident_agents=1, prefetch=False, n_ctx=1024, n_batch=64, n_threads=1) as pool:
        pool.chat("b", conv("b"), max_tokens=2)
        pool.chat("a", conv("a"), max_tokens=2)  # b parked
        core, mover = pool.engine()._core, pool.engine()._mover
        seen: list[int] = []
        real = mover.residency.acquire

        def acquire(x, **kw):
            seen.append(x.residence.pins)
            return real(x, **kw)

        mover.residency.acquire = acquire
        with core.lock:
            placed = mover.make_resident(core.agents["b"], prefetch=True)
        assert placed.how == "restored" and seen == [1], (placed, seen)
        assert not core.agents["b"].held and core.agents["b"].seq is not None
