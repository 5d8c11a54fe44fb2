"""The tier model of `benchmarks/policy_replay.py` (`benchmarks/_policy_sim.py`) on hand-made traces."""

from __future__ import annotations

import dataclasses

import pytest

from agentmem.policy.placement import get_policy
from benchmarks._policy_sim import Call, Costs, OldestFirst, Variant, simulate, working_set_bytes

COSTS = Costs(prefill_tok_s=100.0, decode_tok_s=10.0, bytes_per_token=1000.0,
              park_s_per_mb={"f16": 0.001, "q8_0": 0.001}, restore_s_per_mb={"f16": 0.002, "q8_0": 0.002},
              ratio={"f16": 1.0, "q8_0": 0.5})


def round_robin(n_agents: int, rounds: int) -> list[Call]:
    return [Call(f"a{i}", 100 if r == 0 else 10, 5) for r in range(rounds) for i in range(n_agents)]


@pytest.mark.parametrize("name", ["cost", "lru", "lfu"])
def test_unlimited_ram_keeps_every_state(name: str) -> None:
    """Without a budget nothing is dropped: every call after an agent's first finds its whole history."""
    trace = round_robin(6, 3)
    out = simulate(trace, Variant(name, get_policy(name), hints=False), COSTS, resident=2, warm_budget=0)
    assert out.drops == 0 and out.calls == len(trace)
    assert out.prefilled_tokens == 6 * 100 + 12 * 10  # first turns whole, later turns only their new tokens
    assert out.restores == 12


def test_round_robin_under_a_tight_budget_defeats_lru() -> None:
    """A cycle longer than RAM: LRU always gives up the state needed next (the textbook case)."""
    trace = round_robin(8, 4)
    budget = working_set_bytes(trace, COSTS) // 2
    lru = simulate(trace, Variant("lru", get_policy("lru"), hints=False), COSTS, resident=2, warm_budget=budget)
    oldest = simulate(trace, Variant("oldest", OldestFirst(), hints=False), COSTS, resident=2, warm_budget=budget)
    assert lru.cached_tokens == 0 and lru.drops > 0
    assert oldest.prefilled_tokens == lru.prefilled_tokens  # llama-server's order is LRU here


def test_a_held_agent_keeps_its_sequence() -> None:
    """`hold` after a tool call: the worker is not parked while others come and go."""
    fast = dataclasses.replace(COSTS, prefill_tok_s=1000.0, decode_tok_s=100.0)  # all inside the 1 s minimum hold
    trace = [Call("w", 200, 5, at=0.0, hold=True), Call("x", 50, 5, at=0.3), Call("y", 50, 5, at=0.5),
             Call("w", 10, 5, at=0.7)]
    held = simulate(trace, Variant("lru+hints", get_policy("lru"), hints=True), fast, resident=2, warm_budget=0)
    plain = simulate(trace, Variant("lru", get_policy("lru"), hints=False), fast, resident=2, warm_budget=0)
    assert held.restores == 0 and plain.restores == 1


def test_ttft_counts_the_queue() -> None:
    """Two calls arriving together: the second waits for the first's prefill and reply."""
    trace = [Call("a", 100, 10, at=0.0), Call("b", 100, 10, at=0.0)]
    out = simulate(trace, Variant("lru", get_policy("lru"), hints=False), COSTS, resident=2, warm_budget=0)
    assert out.ttft == pytest.approx([1.0, 1.0 + 1.0 + 1.0])
