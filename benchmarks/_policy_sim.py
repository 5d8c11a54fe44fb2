"""A discrete-event model of the pool's tiers that drives the real placement objects.

`simulate(trace, variant, costs, ...)` replays a list of `Call`s against a model of
the pool: `resident` live sequences (HOT), parked states in RAM under a byte budget
with the pool's high/low watermarks (WARM), and no archive (a state pushed out of RAM
is dropped: its agent re-prefills its whole history at its next call). One call is
served at a time, in arrival order. What is *real*: the placement policy object
(`agentmem.policy.placement`: `release_order`, `demotion_order`, `codec_for`), the
transition predictor (`agentmem.memory.prefetch.TransitionPredictor`, for `next_in`)
and the workflow hints (`agentmem.pool.hints.Hints`: `expect`, `hold`, `arrive`,
steps-to-next-use). What is *simulated*: time, from `Costs` (rates measured on the
bundled model at the start of a run), and the bytes of a state (bytes per token
measured the same way, times the codec's measured ratio).

The pool's own mechanisms are mirrored, not imported (they are being refactored and
need a llama.cpp context): the victim for a sequence is `release_order(idle
resident)[0]`; after a park, WARM over its budget is brought down to the low
watermark at once (the call-path rule); after every call, WARM over the high
watermark is brought down to the low one (the off-path rule); a HOT agent counts
`n_live * 20000` bytes, as `PoolCore.info` estimates it. Prefetch is off for every
variant (it is not part of the placement policy and would blur the comparison).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from agentmem.memory.prefetch import TransitionPredictor
from agentmem.policy.placement import PRIORITIES, AgentInfo, PlacementPolicy
from agentmem.pool.hints import Hints, reload_ttl

__all__ = ["Call", "Costs", "OldestFirst", "Outcome", "Variant", "simulate", "working_set_bytes"]

HOT_BYTES_PER_TOKEN = 20_000  # PoolCore.info's estimate of a resident state's bytes


@dataclass(frozen=True)
class Costs:
    """Rates of the cost model (measured by the benchmark on the bundled model).

    Attributes:
        prefill_tok_s: prompt tokens decoded per second.
        decode_tok_s: generated tokens per second.
        bytes_per_token: bytes of an f16 state blob per live token.
        park_s_per_mb: seconds per MiB of f16 state to park (state_get + encode), per codec.
        restore_s_per_mb: seconds per MiB of f16 state to restore (decode + state_set), per codec.
        ratio: encoded bytes / f16 bytes, per codec.
    """

    prefill_tok_s: float
    decode_tok_s: float
    bytes_per_token: float
    park_s_per_mb: dict[str, float]
    restore_s_per_mb: dict[str, float]
    ratio: dict[str, float]


@dataclass(frozen=True)
class Call:
    """One call of a trace.

    Attributes:
        agent: agent id.
        new_tokens: prompt tokens this call adds to the agent's history.
        reply_tokens: tokens generated (they join the history).
        at: arrival time (s); `None` = when the previous call finishes plus `think_s`.
        think_s: gap after the previous call (closed loop only).
        priority: `foreground`, `normal` or `background`.
        expect: after the call, the workflow's expected order (`Hints.expect`), or None.
        scope: the scope of `expect`.
        hold: hold the agent after its reply (a tool call: it runs again when the tool returns).
    """

    agent: str
    new_tokens: int
    reply_tokens: int
    at: float | None = None
    think_s: float = 0.0
    priority: str = "normal"
    expect: Sequence[Any] | None = None
    scope: str = ""
    hold: bool = False


@dataclass
class Variant:
    """A policy under test: the placement object and whether it is told the workflow's hints."""

    name: str
    policy: PlacementPolicy
    hints: bool


@dataclass
class _Agent:
    id: str
    priority: int
    tokens: int = 0
    tier: str = "new"  # new | hot | warm | dropped
    nbytes: int = 0  # bytes in WARM
    codec: str = "f16"
    last_used: float = 0.0
    parked_at: float = 0.0
    uses: int = 0


@dataclass
class Outcome:
    """What a replay measured."""

    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefilled_tokens: int = 0
    restores: int = 0
    drops: int = 0
    ttft: list[float] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        """Cached / prompt tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def pct(self, q: float) -> float:
        """Percentile `q` of the TTFTs (s)."""
        xs = sorted(self.ttft)
        if not xs:
            return math.nan
        k = min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))
        return xs[k]


class OldestFirst(PlacementPolicy):
    """llama-server's order: slots by least recent use; its RAM prompt cache drops the oldest *saved* entry.

    `saved_at` (agent -> time its state was parked) is kept by the simulator; a
    state loaded back into a slot leaves the cache, and is saved anew when the slot
    is taken again (llama-server's `server_prompt_cache`). Never told hints.
    """

    name = "oldest"

    def __init__(self) -> None:
        super().__init__(warm_codec="f16")
        self.saved_at: dict[str, float] = {}
        self.now = 0.0

    def keep_score(self, agent: AgentInfo) -> float:
        if agent.tier == "warm":
            return self.saved_at.get(agent.id, 0.0) - self.now
        return -agent.idle_s


def working_set_bytes(trace: Sequence[Call], costs: Costs, max_tokens: int = 0) -> int:
    """f16 bytes of every agent's final state: the budgets are fractions of this."""
    tokens: dict[str, int] = {}
    for c in trace:
        tokens[c.agent] = tokens.get(c.agent, 0) + c.new_tokens + c.reply_tokens
        if max_tokens:
            tokens[c.agent] = min(tokens[c.agent], max_tokens)
    return int(sum(tokens.values()) * costs.bytes_per_token)


class _Sim:
    def __init__(self, variant: Variant, costs: Costs, *, resident: int, warm_budget: int,
                 high: float, low: float, max_tokens: int) -> None:
        self.v, self.costs, self.max_tokens = variant, costs, max_tokens
        self.resident, self.budget, self.high, self.low = resident, warm_budget, high, low
        self.now = 0.0
        self.hints = Hints(clock=lambda: self.now)
        self.predictor = TransitionPredictor()
        self.agents: dict[str, _Agent] = {}
        self.out = Outcome()

    # --------------------------------------------------------------- what the policy sees
    def info(self, a: _Agent) -> AgentInfo:
        hot = a.tier == "hot"
        return AgentInfo(
            id=a.id, tier="hot" if hot else "warm", nbytes=a.tokens * HOT_BYTES_PER_TOKEN if hot else a.nbytes,
            n_tokens=a.tokens, priority=a.priority, idle_s=max(0.0, self.now - a.last_used), uses=a.uses,
            next_in=self.predictor.distance(a.id),
            steps=self.hints.steps(a.id) if self.v.hints else math.inf,
            held=self.hints.held(a.id) if self.v.hints else False,
        )

    def order(self, agents: list[_Agent]) -> list[_Agent]:
        if isinstance(self.v.policy, OldestFirst):
            self.v.policy.now = self.now
        ranked = self.v.policy.release_order([self.info(a) for a in agents])
        return [self.agents[x.id] for x in ranked]

    # --------------------------------------------------------------- tiers
    def warm_bytes(self) -> int:
        return sum(a.nbytes for a in self.agents.values() if a.tier == "warm")

    def mb(self, a: _Agent) -> float:
        return a.tokens * self.costs.bytes_per_token / 2**20

    def park(self, a: _Agent) -> float:
        """Park `a` into WARM; returns the seconds it took."""
        codec = self.v.policy.codec_for(self.info(a), "warm")
        a.codec = codec if codec in self.costs.ratio else "f16"
        a.nbytes = int(a.tokens * self.costs.bytes_per_token * self.costs.ratio[a.codec])
        a.tier, a.parked_at = "warm", self.now
        if isinstance(self.v.policy, OldestFirst):
            self.v.policy.saved_at[a.id] = self.now
        return self.mb(a) * self.costs.park_s_per_mb[a.codec]

    def shrink_warm(self, limit: float, target: float) -> None:
        """Drop parked states in release order until WARM <= `target`, if it is above `limit`."""
        if not self.budget or self.warm_bytes() <= limit:
            return
        for a in self.order([a for a in self.agents.values() if a.tier == "warm"]):
            if self.warm_bytes() <= target:
                break
            a.tier, a.nbytes = "dropped", 0
            self.out.drops += 1

    def seat(self, keep: _Agent) -> float:
        """Give `keep` a sequence (parking a victim when none is free); returns the seconds spent."""
        hot = [a for a in self.agents.values() if a.tier == "hot"]
        keep.tier = "hot"
        if len(hot) < self.resident:
            return 0.0
        victim = self.order(hot)[0]
        s = self.park(victim)
        self.shrink_warm(self.budget, self.low * self.budget)  # the call-path rule
        return s

    # --------------------------------------------------------------- one call
    def call(self, c: Call, arrival: float) -> float:
        """Serve `c` (arrived at `arrival`, started at `self.now`); returns when it finishes."""
        a = self.agents.get(c.agent)
        if a is None:
            a = self.agents[c.agent] = _Agent(c.agent, PRIORITIES[c.priority])
        if self.v.hints:
            self.hints.arrive(a.id, resident=a.tier == "hot", has_state=a.tier in ("hot", "warm"))
        self.predictor.observe(a.id)
        spent, cached = 0.0, 0
        if a.tier == "hot":
            cached = a.tokens
        elif a.tier == "warm":
            cached = a.tokens
            spent += self.mb(a) * self.costs.restore_s_per_mb[a.codec]
            a.tier, a.nbytes = "restoring", 0
            self.out.restores += 1
        if a.tier != "hot":
            spent += self.seat(a)
        prompt = a.tokens + c.new_tokens
        prefill = prompt - cached
        spent += prefill / self.costs.prefill_tok_s
        o = self.out
        o.calls += 1
        o.prompt_tokens += prompt
        o.cached_tokens += cached
        o.prefilled_tokens += prefill
        o.ttft.append(self.now + spent - arrival)
        end = self.now + spent + c.reply_tokens / self.costs.decode_tok_s
        self.now = end
        a.tokens = prompt + c.reply_tokens
        if self.max_tokens:
            a.tokens = min(a.tokens, self.max_tokens)  # the eviction policy trims it (agent_budget_tokens)
        a.last_used, a.uses = end, a.uses + 1
        if self.v.hints:
            if c.hold:
                self.hints.hold(a.id, reload_ttl(a.tokens, self.mb(a) / max(1, a.tokens)
                                                 * self.costs.restore_s_per_mb["f16"]))
            if c.expect is not None:
                self.hints.expect(c.expect, scope=c.scope)
        self.shrink_warm(self.high * self.budget, self.low * self.budget)  # the off-path rule
        return end


def simulate(trace: Sequence[Call], variant: Variant, costs: Costs, *, resident: int, warm_budget: int,
             high: float = 0.9, low: float = 0.7, max_tokens: int = 0) -> Outcome:
    """Replay `trace` under `variant` (see the module docstring for what is real and what is modelled).

    Args:
        trace: the calls, in arrival order.
        variant: the placement policy and whether it hears the hints.
        costs: the calibrated cost model.
        resident: live sequences.
        warm_budget: bytes of RAM for parked states (`0` = unlimited).
        high: WARM's high watermark (fraction of the budget).
        low: WARM's low watermark.
        max_tokens: live tokens an agent keeps at most (`agent_budget_tokens`; `0` = no limit).
    """
    sim = _Sim(variant, costs, resident=resident, warm_budget=warm_budget, high=high, low=low, max_tokens=max_tokens)
    done = 0.0
    for c in trace:
        arrival = c.at if c.at is not None else done + c.think_s
        sim.now = max(done, arrival)
        done = sim.call(c, arrival)
    return sim.out
