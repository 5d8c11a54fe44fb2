"""Decode strategies: how a plan's reply is generated and read, the one place a new way plugs in.

A strategy owns everything between a plan and its reply: the generations it asks for,
the gate its stream goes through, and the reading. Two are registered (`get_strategy`):

* `LazyCall` (`"lazy"`, the default): a free tool turn (`auto`) decodes **once**, under the
  lazy call grammar of the offered tools (`CallPlan.lazy`,
  `agentmem.tools.lazy.lazy_call_grammar`): free text until the model opens a call (the
  format's opening anywhere, or a bare `{"name": "` at the start), constrained from
  there, so an opened call is a valid call of an offered tool. Its stream goes through a
  `LazyCallGate`: text is shown as soon as no trigger can fire on it. Nothing is retried;
  a call cut off by `max_tokens` comes back as text with its `invalid` calls. Other plans
  (text, JSON, forced calls) and `lenient` plans (AutoGen's reading: calls anywhere, code
  fences) go as `FreeThenForced` does.
* `FreeThenForced` (`"free_then_forced"`): the reply is generated as planned (free in
  `auto` mode) through a `StreamGate`; a reply that looked like a call but did not parse is
  generated again with the call forced under the format's grammar (`CallPlan.forced`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import logging
from dataclasses import replace

from agentmem.calls.gate import StreamGate
from agentmem.calls.plan import CallPlan
from agentmem.calls.reply import Reply, read_reply
from agentmem.calls.steps import Generate, Steps
from agentmem.errors import ConfigError
from agentmem.pool import ChatResult
from agentmem.tools.lazy import LazyCallGate, LazyGrammar

__all__ = ["STRATEGIES", "Decoded", "DecodeStrategy", "FreeThenForced", "LazyCall", "get_strategy"]

logger = logging.getLogger(__name__)


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


class LazyCall:
    """A free tool turn in one decode under its lazy call grammar; every other plan as `FreeThenForced`."""

    name = "lazy"

    def __init__(self) -> None:
        self._other = FreeThenForced()

    def decode(self, plan: CallPlan) -> Steps:
        lazy = self._grammar(plan)
        if lazy is None:
            return (yield from self._other.decode(plan))
        gate = LazyCallGate(lazy)
        result: ChatResult = yield Generate(plan.with_sampling(grammar=lazy), gate)
        reply = read_once(plan, result.text)
        return Decoded(plan, reply, [result], rest=gate.finish(reply.is_call))

    @staticmethod
    def _grammar(plan: CallPlan) -> LazyGrammar | None:
        """The plan's lazy grammar, or `None` when it decodes another way (or the schemas cannot be one)."""
        if plan.mode != "auto" or plan.lazy is None or plan.lenient or plan.messages is None:
            return None
        try:
            return plan.lazy()
        except ConfigError as exc:  # a schema the converter cannot express: free, then forced, as before
            logger.info("no lazy call grammar for agent %r (%s): decoding free, then forced", plan.agent_id, exc)
            return None


def read_once(plan: CallPlan, text: str) -> Reply:
    """`read_reply` for a reply that is not retried: a call that did not parse, or names a tool
    that was not offered (a trigger that misfired), is the reply's text."""
    reply = read_reply(replace(plan, forced=None), text)
    if any(c.name not in plan.tool_names for c in reply.calls):
        return Reply(text=reply.text, content=reply.text)
    return reply


STRATEGIES: dict[str, DecodeStrategy] = {LazyCall.name: LazyCall(), FreeThenForced.name: FreeThenForced()}


def get_strategy(name: str) -> DecodeStrategy:
    """The strategy registered as `name`.

    Raises:
        ConfigError: no such strategy (the message lists the registered ones).
    """
    strategy = STRATEGIES.get(name)
    if strategy is None:
        raise ConfigError(f"unknown decode strategy {name!r}; valid: {sorted(STRATEGIES)}")
    return strategy
