"""Decode strategies: how a plan's reply is generated and read, the one place a new way plugs in.

`FreeThenForced` is today's: the reply is generated as planned (free in `auto` mode);
a reply that looked like a call but did not parse is generated again with the call
forced under the format's grammar (`CallPlan.forced`). A future lazy grammar (one decode
whose grammar wakes at the call's opening, `agentmem.engine.sampling`) is a second
strategy with the same `decode`: one `Generate` of a lazily constrained plan, no retry.
Strategies are registered by name (`get_strategy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agentmem.calls.gate import StreamGate
from agentmem.calls.plan import CallPlan
from agentmem.calls.reply import Reply, read_reply
from agentmem.calls.steps import Generate, Steps
from agentmem.errors import ConfigError
from agentmem.pool import ChatResult

__all__ = ["STRATEGIES", "Decoded", "DecodeStrategy", "FreeThenForced", "get_strategy"]


@dataclass(slots=True)
class Decoded:
    """What a strategy produced: the plan that made the final reply, the reply and every generation."""

    plan: CallPlan
    reply: Reply
    results: list[ChatResult]
    retried: bool = False


class DecodeStrategy(Protocol):
    """Generates and reads one plan's reply (a generator of `agentmem.calls.steps` steps)."""

    name: str

    def decode(self, plan: CallPlan, gate: StreamGate) -> Steps:
        """Yield `Generate` steps (the first one streams through `gate`); return a `Decoded`."""
        ...


class FreeThenForced:
    """The plan as planned, then, for an `auto` reply that looked like a broken call, once more forced."""

    name = "free_then_forced"

    def decode(self, plan: CallPlan, gate: StreamGate) -> Steps:
        first: ChatResult = yield Generate(plan, gate)
        results = [first]
        reply = read_reply(plan, first.text)
        if not reply.retry:
            return Decoded(plan, reply, results)
        assert plan.forced is not None, "only a plan that can be forced asks for a retry"
        plan = plan.forced()
        results.append((yield Generate(plan)))
        return Decoded(plan, read_reply(plan, results[-1].text), results, retried=True)


STRATEGIES: dict[str, DecodeStrategy] = {FreeThenForced.name: FreeThenForced()}


def get_strategy(name: str) -> DecodeStrategy:
    """The strategy registered as `name`.

    Raises:
        ConfigError: no such strategy (the message lists the registered ones).
    """
    strategy = STRATEGIES.get(name)
    if strategy is None:
        raise ConfigError(f"unknown decode strategy {name!r}; valid: {sorted(STRATEGIES)}")
    return strategy
