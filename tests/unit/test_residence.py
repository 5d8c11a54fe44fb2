"""An agent's residence (one record, one writer) and the tier chain (issue #32, "one owner of residence").

Before: `tier`/`seq` were assigned in six modules, `busy` counted both calls and
pins, and `Budgets.rebalance` hard-coded `("warm", "cold")`, so a third tier
touched a dozen files. These tests pin the new shape on fakes and tiny inputs.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
import pytest

import agentmem
from agentmem import MemoryPool
from agentmem.archive import Archive
from agentmem.errors import AgentBusyError
from agentmem.memory.parking import ParkedState
from agentmem.memory.shared import BlockStore
from agentmem.memory.tiers import (
    COLD, EMPTY, HOT, TIER_NAMES, WARM, Tier, TierChain, WarmTier, build_tiers,
)
from agentmem.policy.placement import AgentInfo, get_policy
from agentmem.pool import residence
from agentmem.pool.budgets import Budgets
from agentmem.pool.residence import Residence
from agentmem.pool.state import AgentState
from agentmem.server.http_errors import from_exception

FP = {"model": "test"}


# ---------------------------------------------------------------------------- the record
def test_pins_are_a_refcount_apart_from_calls() -> None:
    a = AgentState("a")
    assert not a.held and a.residence.hold == ""
    residence.pin(a)
    with residence.pinned(a):
        assert a.residence.pins == 2 and a.residence.hold == "pinned"
    assert a.held, "one pin is left: the agent is still held"
    residence.unpin(a)
    assert not a.held
    residence.call_begins(a)
    assert a.held and a.residence.hold == "generating" and a.residence.pins == 0
    residence.call_ends(a)
    with pytest.raises(AssertionError):
        residence.unpin(a)  # more unpins than pins: a bug, caught where it happens


def test_pinned_unpins_when_the_block_raises() -> None:
    a, b = AgentState("a"), AgentState("b")
    with pytest.raises(KeyError), residence.pinned(a, b):
        raise KeyError("x")
    assert not a.held and not b.held


def test_the_agent_record_reads_its_place_and_cannot_be_written_around_the_residence() -> None:
    a = AgentState("a")
    assert (a.tier, a.kv, a.seq, a.residence.place) == (EMPTY, None, None, EMPTY)
    residence.parked_in(a, WARM, "f16")
    assert (a.tier, a.residence.codec, a.residence.place) == (WARM, "f16", WARM)
    a.check()
    with pytest.raises(AttributeError):
        a.tier = COLD  # type: ignore[misc]
    kv = SimpleNamespace(id=3)
    residence.emptied(a)
    residence.seat(a, kv)  # type: ignore[arg-type]
    assert (a.seq, a.residence.place) == (3, HOT)
    assert residence.unseat(a) == 3 and a.seq is None


def test_a_pinned_agent_is_busy_not_an_internal_error(tiny_model_path: Path) -> None:
    """A pinned (not generating) agent refuses park/forget/handoff as busy: 409, not 500.

    The server used to recognise a busy agent by the words "is generating"; an
    agent held by a pin only says "is pinned", so it is a typed error now.
    """
    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=2, n_batch=64, n_threads=1, prefetch=False) as p:
        p.chat("a", [{"role": "user", "content": "hi"}], max_tokens=2)
        a = p.engine()._core.agents["a"]
        with residence.pinned(a):
            for op in (lambda: p.park("a"), lambda: p.forget("a"), lambda: p.handoff("a", "b")):
                with pytest.raises(AgentBusyError, match="'a' is pinned") as got:
                    op()
                assert (from_exception(got.value).status, from_exception(got.value).code) == (409, "agent_busy")
        p.park("a")  # unpinned: it goes
        assert p.stats()["agents"]["a"]["tier"] == WARM


_FIELDS = {f for f in Residence.__dataclass_fields__}


def _writes_of_residence(tree: ast.AST) -> list[int]:
    """Lines assigning a field of a `Residence` (`x.residence.tier = ...`, or through `r = x.residence`)."""
    aliases = {
        t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Attribute) and node.value.attr == "residence"
        for t in node.targets if isinstance(t, ast.Name)
    }
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for x in ast.walk(t):
                if isinstance(x, ast.Attribute) and x.attr in _FIELDS and (
                        (isinstance(x.value, ast.Attribute) and x.value.attr == "residence")
                        or (isinstance(x.value, ast.Name) and x.value.id in aliases)):
                    lines.append(node.lineno)
    return lines


def test_only_the_residence_module_writes_a_residence() -> None:
    root = Path(agentmem.__file__).parent
    writers = {
        str(p.relative_to(root)): lines for p in sorted(root.rglob("*.py"))
        if (lines := _writes_of_residence(ast.parse(p.read_text(), str(p))))
    }
    assert set(writers) == {"pool/residence.py"}, writers


def test_the_scan_finds_a_write_outside() -> None:
    """The check above can fail: a write through an alias or the attribute is found."""
    src = "def f(a):\n    r = a.residence\n    r.tier = 'x'\n    a.residence.pins += 1\n"
    assert _writes_of_residence(ast.parse(src)) == [3, 4]


# ---------------------------------------------------------------------------- the chain
def test_the_chain_is_built_in_order_and_names_every_tier_once() -> None:
    chain = build_tiers(archive=None, fingerprint=FP, warm_budget_bytes=7)
    assert list(chain) == [WARM] and chain.first.budget_bytes == 7
    assert chain.below(chain.first) is None and chain.durable is None and chain.volatile == [chain.first]
    with Archive(":memory:") as arc:
        chain = build_tiers(archive=arc, fingerprint=FP, cold_budget_bytes=9)
        assert tuple(chain) == TIER_NAMES == (WARM, COLD)
        assert chain.below(chain[WARM]) is chain[COLD] and chain.below(chain[COLD]) is None
        assert chain.durable is chain[COLD] and chain[COLD].budget_bytes == 9
        assert all(type(t).name == n for n, t in chain.items())
    with pytest.raises(AssertionError):
        TierChain([WarmTier(), WarmTier()])


def _state(n: int, codec: str = "f16") -> ParkedState:
    return ParkedState(np.arange(n, dtype=np.uint8), codec, n_tokens=n // 4)


@pytest.fixture(params=["warm", "cold"])
def tier(request: pytest.FixtureRequest) -> Iterator[Tier]:
    """Every tier `build_tiers` makes (contract tests run over each)."""
    with Archive(":memory:") as arc:
        yield build_tiers(archive=arc, fingerprint=FP)[request.param]


def test_tier_contract(tier: Tier) -> None:
    assert tier.get("a") is None and tier.nbytes("a") == 0 and "a" not in tier
    tier.put("a", _state(64))
    tier.put("b", _state(32, "q8_0"))
    tier.put("a", _state(48))  # replaces
    got = tier.get("a")
    assert got is not None and got.nbytes == 48 and got.codec == "f16"
    assert sorted(tier.agents()) == ["a", "b"] and tier.total_bytes() == 80 and "a" in tier
    tier.delete("a")
    tier.delete("a")  # absent: a no-op
    assert tier.get("a") is None and list(tier.agents()) == ["b"] and tier.total_bytes() == 32
    assert tier.shared_bytes(BlockStore()) == 0
    infos = [AgentInfo(x, tier.name, 0, 0, 1, idle, 1, math.inf) for x, idle in (("x", 1.0), ("y", 9.0))]
    assert [i.id for i in tier.release_order(infos, get_policy("lru").release_order)] == ["y", "x"]
    assert tier.codec_for(infos[0], get_policy("lru").codec_for) == ("f16" if tier.name == WARM else "q8_0/q4_0")


# ---------------------------------------------------------------------------- rebalance walks the chain
class SizedTier(Tier):
    """A tier of the given name that records sizes only (no bytes kept)."""

    def __init__(self, name: str, budget_bytes: int, *, durable: bool = False) -> None:
        super().__init__(budget_bytes=budget_bytes)
        self.name, self.durable, self.sizes = name, durable, {}  # type: ignore[misc]

    def put(self, agent_id: str, state: Any) -> None:
        self.sizes[agent_id] = state

    def get(self, agent_id: str) -> Any:
        raise AssertionError("rebalancing reads no state")

    def delete(self, agent_id: str) -> None:
        self.sizes.pop(agent_id, None)

    def nbytes(self, agent_id: str) -> int:
        return self.sizes.get(agent_id, 0)

    def agents(self) -> Iterator[str]:
        return iter(list(self.sizes))

    def shared_bytes(self, blocks: Any) -> int:
        return 0


class ChainMover:
    """Moves sizes down the chain through the residence functions, as `Mover` does."""

    def __init__(self, core: Any) -> None:
        self.core, self.moves = core, []

    def demote(self, a: AgentState, dst: str) -> None:
        src = self.core.tiers[a.tier]
        self.core.tiers[dst].put(a.id, src.nbytes(a.id))
        src.delete(a.id)
        residence.parked_in(a, dst, "q8_0")
        self.moves.append((a.id, dst))

    def drop(self, a: AgentState) -> None:
        self.core.tiers[a.tier].delete(a.id)
        residence.emptied(a)
        self.moves.append((a.id, EMPTY))


def test_rebalance_walks_a_three_tier_chain() -> None:
    """A third tier is one class: over its budget a tier demotes into the next, the last drops."""
    ram, disk, far = SizedTier("ram", 100), SizedTier("disk", 100), SizedTier("far", 100, durable=True)
    agents: dict[str, AgentState] = {}
    for t, members in ((ram, {"r1": 60, "r2": 50}), (disk, {"d1": 70}), (far, {"f1": 80, "f2": 40})):
        for x, n in members.items():
            t.put(x, n)
            agents[x] = AgentState(x, residence=Residence(tier=t.name, codec="f16"), last_used=-float(n))
    core = SimpleNamespace(
        config=SimpleNamespace(watermark_high=0.9, watermark_low=0.7), tiers=TierChain([ram, disk, far]),
        agents=agents, blocks=BlockStore(), placement=get_policy("lru"),
        info=lambda a: AgentInfo(a.id, a.tier, 0, 0, 1, -a.last_used, 1, math.inf),  # idle = its size here
    )
    mover = ChainMover(core)
    Budgets(core, mover).rebalance(urgent_only=True)  # type: ignore[arg-type]
    # ram 110 > 100: the longest idle (r1) goes down to disk (ram 50 <= 70: done); disk 130: d1
    # goes down to far (60); far 190: the last tier drops f1 and d1 (40)
    assert mover.moves == [("r1", "disk"), ("d1", "far"), ("f1", EMPTY), ("d1", EMPTY)]
    for t in core.tiers.values():
        assert t.total_bytes() <= t.budget_bytes, (t.name, t.sizes)
        assert all(agents[x].tier == t.name for x in t.agents())
