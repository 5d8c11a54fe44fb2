"""Workflow hints (`MemoryPool.expect`, `hold`, `unhold`): the logic on fakes, the pool on the tiny model."""

from __future__ import annotations

import math
from typing import Any
from pathlib import Path

import pytest

from agentmem import ConfigError, MemoryPool, UnknownAgentError
from agentmem.policy.placement import POLICIES, AgentInfo, get_policy
from agentmem.pool.hints import HOLD_MAX_S, HOLD_MIN_S, MAX_EXPECTED, MAX_SCOPES, MAX_TTL_S, Hints, reload_ttl

OPTS = {"n_ctx": 1024, "n_batch": 64, "n_threads": 1}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def conv(agent: str, turn: int) -> list[dict]:
    msgs = [{"role": "system", "content": f"you are agent {agent}"}]
    for i in range(turn + 1):
        msgs += [{"role": "user", "content": f"step {i} for {agent}"}, {"role": "assistant", "content": "ok"}]
    return msgs[:-1]


def tiers(pool: MemoryPool) -> dict[str, str]:
    return {a: s["tier"] for a, s in pool.stats()["agents"].items()}


# ---------------------------------------------------------------------- Hints on its own
def test_order_steps_and_hits_move_on_with_each_call() -> None:
    h = Hints(clock=Clock())
    h.expect(["b", "c", "b", "d"])  # a duplicate keeps its first place
    assert h.order == ["b", "c", "d"] and h.active
    assert (h.steps("b"), h.steps("d"), h.steps("zz")) == (1.0, 3.0, math.inf)
    h.arrive("c", resident=False, has_state=True)  # out of order: a miss, the rest move up
    assert h.order == ["b", "d"] and h.steps("d") == 2.0
    h.arrive("b", resident=True, has_state=True)
    h.arrive("x", resident=True, has_state=True)  # not expected: not counted
    h.arrive("d", resident=False, has_state=False)  # a first call: taken off the list, not counted
    s = h.stats()
    assert (s["expected"], s["hits"], s["misses"], s["hit_rate"]) == (2, 1, 1, 0.5), s
    assert not h.active and s["order"] == []


def test_a_branch_shares_one_step_and_its_alternatives_move_back_once_decided() -> None:
    h = Hints(clock=Clock())
    h.expect([["w1", "w2", "w3"], "boss", ["w2", "x"], []])  # w2 keeps its first place; [] dropped
    assert h.stats()["order"] == [["w1", "w2", "w3"], "boss", "x"]
    steps = [h.steps(x) for x in ("w1", "w2", "w3", "boss", "x")]
    assert all(1.0 <= s < 2.0 for s in steps[:3]) and steps[3:] == [2.0, 3.0], "one step, a fraction apart"
    assert h.upcoming(2) == [], "a branch first: nothing certain to prefetch"
    h.arrive("w3", resident=True, has_state=True)
    assert h.stats()["order"] == ["boss", "x", ["w1", "w2"]]
    assert h.upcoming(2) == ["boss", "x"] and h.steps("w1") == 3.0


def test_within_a_branch_the_alternative_called_longest_ago_ranks_soonest() -> None:
    # a supervisor working through its workers: the one just called is the one given up first
    h = Hints(clock=Clock())
    for w in ("w1", "w2", "w3"):
        h.arrive(w, resident=True, has_state=True)
    h.expect([["w1", "w2", "w3"], "boss"])
    assert [h.steps(w) for w in ("w1", "w2", "w3")] == [1.0, 1 + 1 / 3, 1 + 2 / 3]
    h.arrive("w1", resident=True, has_state=True)  # decided: the others move back, still in turn order
    assert h.stats()["order"] == ["boss", ["w2", "w3"]]
    assert h.steps("w2") < h.steps("w3")
    h.expect([["w1", "w2", "w3"]])
    assert min(("w1", "w2", "w3"), key=h.steps) == "w2" and max(("w1", "w2", "w3"), key=h.steps) == "w1"
    h.expect([["new", "w1"]])
    assert h.steps("new") == 1.0, "an agent never called ranks first"
    h.forget("w1")
    assert "w1" not in h.last_call


def test_after_a_call_the_prefetch_guesses_only_within_a_branch() -> None:
    from types import SimpleNamespace

    from agentmem.memory.prefetch import TransitionPredictor
    from agentmem.pool.prefetch import Prefetcher

    pred = TransitionPredictor()
    for _ in range(3):
        for a in ("boss", "w2", "boss", "w9"):
            pred.observe(a)
    for _ in range(3):  # boss -> w2 becomes the majority
        pred.observe("boss"), pred.observe("w2")
    assert pred.predict("boss") == "w2"
    h = Hints(clock=Clock())
    p = Prefetcher(SimpleNamespace(predictor=pred), rebalance=lambda: None, restore=lambda a: False, enabled=False, hints=h)
    assert p.next_agent("boss") == "w2", "no hints: the predictor's guess"
    h.expect([["w1", "w2"], "boss"])
    assert p.next_agent("boss") == "w2", "a branch: the guess is one of its alternatives"
    h.expect([["w1", "w3"], "boss"])
    assert p.next_agent("boss") is None, "a branch that rules the guess out: nothing"
    h.expect(["w3", "boss"])
    assert p.next_agent("boss") == "w3", "certain: the expected agent, whatever the guess"


def test_hold_lasts_until_its_deadline_or_the_next_call() -> None:
    clock = Clock()
    h = Hints(clock=clock)
    h.hold("a", 5.0)
    h.hold("b", 5.0)
    clock.t += 4.9
    assert h.held("a") and h.held("b")
    h.arrive("a", resident=True, has_state=True)  # its next call ends the hold
    assert not h.held("a")
    clock.t += 0.2
    assert not h.held("b")  # expired
    assert not h.unhold("b") and not h.unhold("never")
    h.hold("c", 1.0)
    assert h.unhold("c")
    c = h.counters
    assert (c["holds"], c["hold_hits"], c["hold_expired"], c["hold_released"]) == (3, 1, 1, 1), c


def test_reload_ttl_rule_is_clamped_and_scales_with_the_reload_cost() -> None:
    assert reload_ttl(0, 1.0) == HOLD_MIN_S
    assert reload_ttl(10**9, 1.0) == HOLD_MAX_S
    assert reload_ttl(1000, 1e-4) == pytest.approx(10.0)  # 100 ms to restore -> 10 s
    assert reload_ttl(1000, 1e-4, in_ram=False, prefill_s_per_token=1e-4) == reload_ttl(1000, 1e-4)
    assert reload_ttl(1000, 1e-5, in_ram=False, prefill_s_per_token=2e-4) > reload_ttl(1000, 1e-5)


def test_learned_rates_follow_measured_restores() -> None:
    from agentmem.pool.results import ChatResult, Timings, Usage

    h = Hints()
    before = h.restore_s_per_token
    slow = ChatResult("a", "", "stop", Usage(prompt_tokens=1010, cached_tokens=1000), Timings(restore_s=1.0), "restored")
    for _ in range(20):
        h.learn(slow)
    assert h.restore_s_per_token == pytest.approx(1e-3, rel=0.01) and h.restore_s_per_token > before


# ---------------------------------------------------------------------- the placement rule
def _info(x: str, *, idle: float = 1.0, steps: float = math.inf, held: bool = False, next_in: float = math.inf) -> AgentInfo:
    return AgentInfo(x, "hot", 1000, 10, 1, idle, 3, next_in, steps, held)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_release_order_contract_over_every_policy(name: str) -> None:
    p = get_policy(name)
    plain = [_info("a", idle=9.0), _info("b", idle=1.0, next_in=1.0), _info("c", idle=5.0)]
    # no hints: exactly the learned demotion order
    assert [x.id for x in p.release_order(plain)] == [x.id for x in p.demotion_order(plain)]
    hinted = [_info("a", idle=9.0, steps=1.0), _info("b", idle=1.0, steps=3.0), _info("c", idle=0.0, steps=2.0)]
    assert [x.id for x in p.release_order(hinted)] == ["b", "c", "a"], "furthest next use first"
    mixed = [_info("a", steps=1.0), _info("u"), _info("h", held=True)]
    assert [x.id for x in p.release_order(mixed)] == ["u", "a", "h"], "not expected first, held last"
    all_held = [_info("a", held=True, steps=1.0), _info("b", held=True, steps=2.0)]
    assert p.release_order(all_held)[0].id == "b", "every candidate held: the furthest of them"


# ---------------------------------------------------------------------- the pool (tiny model)
def test_expect_gives_up_the_sequence_of_the_agent_not_expected(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, resident_agents=2, prefetch=False, **OPTS) as pool:
        for a in "abc":
            pool.chat(a, conv(a, 0), max_tokens=2)
        assert tiers(pool) == {"a": "warm", "b": "hot", "c": "hot"}
        # without hints the least recent (b) would go; c is not expected, so c goes
        pool.expect(["a", "b"], soon=False)
        r = pool.chat("a", conv("a", 1), max_tokens=2)
        assert r.kv == "restored" and tiers(pool) == {"a": "hot", "b": "hot", "c": "warm"}
        r = pool.chat("b", conv("b", 1), max_tokens=2)
        assert r.kv == "reused"
        h = pool.stats()["hints"]
        assert (h["expected"], h["hits"], h["misses"], h["order"]) == (2, 1, 1, []), h


def test_after_a_branch_the_hub_keeps_its_sequence(tiny_model_path: Path) -> None:
    # a supervisor routes to one of three workers, then runs again: with the branch
    # hinted, the worker that ran last gives up its sequence, not the supervisor
    with MemoryPool(tiny_model_path, resident_agents=2, prefetch=False, **OPTS) as pool:
        for i, a in enumerate(["boss", "w1", "boss"]):
            pool.chat(a, conv(a, i), max_tokens=2)
        pool.expect([["w1", "w2", "w3"], "boss"], soon=False)
        pool.chat("w2", conv("w2", 0), max_tokens=2)
        assert tiers(pool) == {"boss": "hot", "w1": "warm", "w2": "hot"}
        assert pool.stats()["hints"]["order"] == ["boss", ["w1", "w3"]]
        assert pool.chat("boss", conv("boss", 3), max_tokens=2).kv == "reused"


@pytest.mark.parametrize("hinted", [False, True])
def test_warm_budget_gives_up_the_state_expected_last(tiny_model_path: Path, hinted: bool) -> None:
    # one live sequence, RAM for about two parked states, no archive: a state over the
    # budget is dropped. Without hints the least recent (a) goes; told that a runs next,
    # the pool drops the others' states instead (KVFlow's rule, one tier down)
    with MemoryPool(tiny_model_path, resident_agents=1, prefetch=False, warm_budget_bytes=20_000, **OPTS) as pool:
        pool.chat("a", conv("a", 0), max_tokens=2)
        if hinted:
            pool.expect(["a"], soon=False)
        for x in "bcd":
            pool.chat(x, conv(x, 0), max_tokens=2)
        t = tiers(pool)
        assert pool.stats()["totals"]["drops"] >= 1, t
        if hinted:
            assert t["a"] == "warm" and "empty" in (t["b"], t["c"]), t
        else:
            assert t["a"] == "empty", t
        r = pool.chat("a", conv("a", 1), max_tokens=2)
        assert r.kv == ("restored" if hinted else "prefilled")


def test_a_held_agent_keeps_its_sequence_unless_every_candidate_is_held(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, resident_agents=2, prefetch=False, **OPTS) as pool:
        pool.chat("a", conv("a", 0), max_tokens=2)
        pool.chat("b", conv("b", 0), max_tokens=2)
        pool.hold("a", ttl_s=60)  # a is the least recent: without the hold it would go
        pool.chat("c", conv("c", 0), max_tokens=2)
        assert tiers(pool) == {"a": "hot", "b": "warm", "c": "hot"}
        pool.hold("c", ttl_s=60)
        pool.chat("d", conv("d", 0), max_tokens=2)  # a and c held: one of them must go
        t = tiers(pool)
        assert t["d"] == "hot" and sorted((t["a"], t["c"])) == ["hot", "warm"], t
        held = pool.stats()["hints"]["held"]
        pool.unhold(held[0])
        assert pool.stats()["hints"]["held"] == held[1:]


def test_a_hold_ends_at_the_agents_next_call(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, resident_agents=2, prefetch=False, **OPTS) as pool:
        pool.chat("a", conv("a", 0), max_tokens=2)
        pool.hold("a")
        assert pool.stats()["hints"]["held"] == ["a"]
        pool.chat("a", conv("a", 1), max_tokens=2)
        h = pool.stats()["hints"]
        assert h["held"] == [] and h["hold_hits"] == 1, h


def test_a_reply_that_calls_a_tool_holds_its_agent(tiny_model_path: Path) -> None:
    tools = [{"name": "lookup", "description": "look a word up",
              "parameters": {"type": "object", "properties": {"q": {"type": "string", "enum": ["x"]}}, "required": ["q"]}}]
    with MemoryPool(tiny_model_path, resident_agents=2, prefetch=False, **OPTS) as pool:
        fmt = pool.tool_format
        r = pool.chat("a", conv("a", 0), tools=tools, max_tokens=96, grammar=fmt.grammar(tools))
        assert fmt.find(r.text, ["lookup"]) is not None, r.text
        assert pool.stats()["hints"]["held"] == ["a"]
        pool.chat("b", conv("b", 0), tools=tools, max_tokens=2, grammar='root ::= "no"')  # text: no hold
        assert pool.stats()["hints"]["held"] == ["a"]
        pool.chat("c", conv("c", 0), max_tokens=2)
        assert tiers(pool)["a"] == "hot" and tiers(pool)["b"] == "warm"


def three_agents_on_two_sequences(pool: MemoryPool) -> Any:
    """Agents a, b, c called once each (one of them parked), the prefetcher idle; its queue."""
    for a in "abc":
        pool.chat(a, conv(a, 0), max_tokens=2)
    queue = pool.engine()._prefetcher.queue
    assert queue is not None
    queue.join()
    return queue


def test_expect_soon_restores_the_next_agent_in_the_background(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, resident_agents=2, **OPTS) as pool:
        queue = three_agents_on_two_sequences(pool)
        parked = [a for a, t in tiers(pool).items() if t == "warm"]
        assert len(parked) == 1
        pool.expect([parked[0]])
        queue.join()
        assert tiers(pool)[parked[0]] == "hot"
        r = pool.chat(parked[0], conv(parked[0], 1), max_tokens=2)
        assert r.kv == "reused" and pool.stats()["hints"]["hits"] == 1


def test_a_prefetch_never_displaces_an_agent_expected_sooner(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, resident_agents=2, **OPTS) as pool:
        queue = three_agents_on_two_sequences(pool)
        t = tiers(pool)
        parked = next(a for a in t if t[a] == "warm")
        live = [a for a in t if t[a] == "hot"]
        pool.expect([*live, parked])  # the parked one is expected last: nobody may go for it
        queue.join()
        assert tiers(pool) == t


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda p: p.expect("abc"), "agent_ids"),
        (lambda p: p.expect([1]), "agent_ids"),
        (lambda p: p.expect(["ok", "share:x"]), "agent_ids"),
        (lambda p: p.expect(["bad\x00id"]), "agent_ids"),
        (lambda p: p.expect(["x"] * (MAX_EXPECTED + 1)), "agent_ids"),
        (lambda p: p.expect([["x"] * (MAX_EXPECTED + 1)]), "agent_ids"),
        (lambda p: p.expect([["ok", 7]]), r"agent_ids\[0\]\[\]"),
        (lambda p: p.expect(["ok", ["bad\x00id"]]), r"agent_ids\[1\]"),
        (lambda p: p.expect(["a"], soon="yes"), "soon"),
        (lambda p: p.hold("a", ttl_s=float("nan")), "ttl_s"),
        (lambda p: p.hold("a", ttl_s=float("inf")), "ttl_s"),
        (lambda p: p.hold("a", ttl_s=0), "ttl_s"),
        (lambda p: p.hold("a", ttl_s=-1), "ttl_s"),
        (lambda p: p.hold("a", ttl_s=MAX_TTL_S + 1), "ttl_s"),
        (lambda p: p.hold("a", ttl_s=True), "ttl_s"),
        (lambda p: p.hold("a", ttl_s="5"), "ttl_s"),
        (lambda p: p.hold(""), "agent_id"),
        (lambda p: p.unhold(None), "agent_id"),
    ],
)
def test_hostile_arguments_are_typed_errors_naming_the_field(tiny_model_path: Path, call, field: str) -> None:
    with MemoryPool(tiny_model_path, resident_agents=2, prefetch=False, **OPTS) as pool:
        pool.chat("a", conv("a", 0), max_tokens=1)
        with pytest.raises(ConfigError, match=field):
            call(pool)
        assert pool.stats()["hints"]["order"] == [] and pool.stats()["hints"]["held"] == []


def test_unknown_agents_hold_raises_expect_and_unhold_accept(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, resident_agents=2, prefetch=False, **OPTS) as pool:
        with pytest.raises(UnknownAgentError, match="ghost"):
            pool.hold("ghost")
        pool.unhold("ghost")
        pool.expect(["ghost"])  # an agent is created by its first call: it may be expected before
        pool.chat("ghost", conv("ghost", 0), max_tokens=1)
        h = pool.stats()["hints"]
        assert h["order"] == [] and h["expected"] == 0, "a first call is not counted as a hit or a miss"


def test_hints_off_validates_and_ignores_them(tiny_model_path: Path) -> None:
    """`PoolConfig(hints=False)` is the no-hints side of a comparison: nothing is expected or held."""
    with MemoryPool(tiny_model_path, resident_agents=2, prefetch=False, hints=False, **OPTS) as pool:
        pool.chat("a", conv("a", 0), max_tokens=1)
        pool.expect(["a"])
        pool.hold("a", ttl_s=5)
        with pytest.raises(ConfigError, match="ttl_s"):
            pool.hold("a", ttl_s=-1)
        h = pool.stats()["hints"]
        assert h["order"] == [] and h["held"] == [] and h["holds"] == 0, h


def test_each_scope_keeps_its_own_order_and_an_agent_counts_its_soonest_use() -> None:
    # two graph threads (or teams) on one pool: one's expect no longer wipes the other's
    h = Hints(clock=Clock())
    h.expect(["a1", "a2"], scope="thread-a")
    h.expect(["b1", "a2"], scope="thread-b")
    assert (h.steps("a1"), h.steps("a2"), h.steps("b1")) == (1.0, 2.0, 1.0), "a2: soonest of 2 and 2"
    assert h.next_step() == {"a1", "b1"} and h.upcoming(2) == ["b1", "a2"], "upcoming: the scope told last"
    h.arrive("a2", resident=True, has_state=True)  # leaves both lists, counted once
    assert h.counters["expected"] == 1
    assert (h.steps("a1"), h.steps("b1"), h.steps("a2")) == (1.0, 1.0, math.inf)
    h.expect([], scope="thread-a")  # an empty order ends the scope
    assert h.steps("a1") == math.inf and h.stats()["scopes"] == 1
    for i in range(MAX_SCOPES + 5):
        h.expect([f"x{i}"], scope=f"s{i}")
    assert h.stats()["scopes"] == MAX_SCOPES and h.steps("x0") == math.inf, "the oldest scopes are forgotten"


def test_expect_validates_its_scope(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, resident_agents=2, prefetch=False, **OPTS) as pool:
        with pytest.raises(ConfigError, match="scope"):
            pool.expect(["a"], scope="bad\x00scope")
        with pytest.raises(ConfigError, match="scope"):
            pool.expect(["a"], scope="")
        for a in "abc":
            pool.chat(a, conv(a, 0), max_tokens=2)
        pool.expect(["a", "c"], scope="t1", soon=False)
        pool.expect(["z", "y", "b"], scope="t2", soon=False)  # t1's order stands: c at 2, b at 3
        pool.chat("a", conv("a", 1), max_tokens=2)
        assert tiers(pool)["b"] == "warm" and tiers(pool)["c"] == "hot", tiers(pool)
