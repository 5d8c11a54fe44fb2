"""Decode strategies: how a plan's reply is generated and read, the one place a new way plugs in.

A strategy owns everything between a plan and its reply: the generations it asks for,
the gate its stream goes through, and the reading. `FreeThenForced` is today's: the reply
is generated as planned (free in `auto` mode) through a `StreamGate`; a reply that looked
like a call but did not parse is generated again with the call forced under the format's
grammar (`CallPlan.forced`). A lazy grammar (one decode whose grammar wakes at the call's
opening: `agentmem.tools.lazy.lazy_call_grammar`, streamed through its `LazyCallGate`) is a
second strategy with the same `decode`: one `Generate` of the plan with the lazy grammar,
no retry. Strategies are registered by name (`get_strategy`).
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
    """What a strategy produced: the plan that made the final reply, the reply, every generation,
    and the streamed text its gate still holds for the caller (`StreamGate.rest`)."""

    plan: CallPlan
    reply: Reply
    results: list[ChatResult]
    retried: bool = False
    rest: str = ""


class DecodeStrategy(Protocol):
    """Generates and reads one plan's reply (a generator of `agentmem.calls.steps` steps)."""

    name: str

    def decode(self, plan: CallPlan) -> Steps:
        """Yield `Generate` steps (one with a gate streams to the caller); return a `Decoded`."""
        ...


class FreeThenForced:
    """The plan as planned, then, for an `auto` reply that looked like a broken call, once more forced."""

    name = "free_then_forced"

    def decode(self, plan: CallPlan) -> Steps:
        gate = StreamGate(plan)
        first: ChatResult = yield Generate(plan, gate)
        results = [first]
        reply = read_reply(plan, first.text)
        if not reply.retry:
            return Decoded(plan, reply, results, rest=gate.rest(reply))
        assert plan.forced is not None, "only a plan that can be forced asks for a retry"
        plan = plan.forced()
        results.append((yield Generate(plan)))
        reply = read_reply(plan, results[-1].text)
        return Decoded(plan, reply, results, retried=True, rest=gate.rest(reply))


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
