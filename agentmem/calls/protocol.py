"""The tool-call protocol, once: plan → run → read → retry → write back.

`call_steps` is a generator of `agentmem.calls.steps` steps; `agentmem.calls.runner`
drives it synchronously or on an event loop. Its result is a `CallOutcome`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentmem.calls.plan import CallPlan
from agentmem.calls.reply import Reply
from agentmem.calls.steps import Generate, HoldsKV, Steps
from agentmem.calls.strategy import DecodeStrategy, LazyCall
from agentmem.pool import ChatResult

__all__ = ["CallOutcome", "call_steps"]

_DEFAULT = LazyCall()


@dataclass
class CallOutcome:
    """A finished protocol call.

    Attributes:
        plan: the plan that made the final reply (the forced one after a retry).
        results: the pool generations of the reply (two when an `auto` call was retried forced).
        reply: what the reply means.
        retried: whether the reply was generated again forced.
        rewrite: the prefill that put a native call into the KV as the template writes it
            back (`Reply.written_back`), or `None`: agentmem's own upkeep of the KV.
        rest: held text still to show at the end of a stream (`StreamGate.rest`).
    """

    plan: CallPlan
    results: list[ChatResult]
    reply: Reply
    retried: bool = False
    rewrite: ChatResult | None = None
    rest: str = ""

    @property
    def all_results(self) -> list[ChatResult]:
        """Every pool generation the call ran (the rewrite included)."""
        return [*self.results, *([self.rewrite] if self.rewrite is not None else [])]

    @property
    def finish_reason(self) -> str:
        """`tool_calls` for a call, else the last generation's `stop` or `length`."""
        return "tool_calls" if self.reply.is_call else self.results[-1].finish_reason

    def usage(self, *, with_rewrite: bool = False) -> dict[str, int]:
        """Summed `prompt_tokens`, `completion_tokens`, `cached_tokens` (the rewrite only if asked)."""
        rs = self.all_results if with_rewrite else self.results
        return {"prompt_tokens": sum(r.usage.prompt_tokens for r in rs),
                "completion_tokens": sum(r.usage.completion_tokens for r in rs),
                "cached_tokens": sum(r.usage.cached_tokens for r in rs)}


def call_steps(plan: CallPlan, strategy: DecodeStrategy | None = None) -> Steps:
    """The protocol of one call as steps; returns its `CallOutcome`.

    run + read + retry: the strategy (default `LazyCall`: a free tool turn decodes once); write back: a native call
    the KV does not hold as the template renders it is prefilled in that form.
    """
    decoded: Any = yield from (strategy or _DEFAULT).decode(plan)
    rewrite = None
    reply: Reply = decoded.reply
    if reply.written_back is not None and not (yield HoldsKV(decoded.plan, reply)):
        rewrite = yield Generate(decoded.plan.rewrite_call(reply.written_back))
    return CallOutcome(decoded.plan, decoded.results, reply, decoded.retried, rewrite, decoded.rest)
