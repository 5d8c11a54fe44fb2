"""Runs a planned call through the one protocol (`agentmem.calls.CallRunner`) and builds AutoGen's `CreateResult`.

The protocol streams the pieces, holds back what may be a tool call, redoes a malformed
call under the grammar and writes a call back in the template's form; this module adds
AutoGen's side: the `CancellationToken`, `FunctionCall`s and the thought before them,
the finish reason and the usage of every generation.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncGenerator, AsyncIterator, Callable

from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import CreateResult, FinishReasons, RequestUsage

from agentmem import ChatResult, MemoryPool
from agentmem.calls import CallOutcome, CallRunner
from agentmem.tools import text_before_json

from ._messages import function_calls
from ._plan import _Plan

logger = logging.getLogger(__name__)

Record = Callable[[_Plan, ChatResult], None]
"""Called with every finished pool generation of a call (the client keeps the latest)."""


async def cancellable(items: AsyncIterator[Any], token: CancellationToken | None) -> AsyncGenerator[Any, None]:
    """`items`, stopped at once when `token` is cancelled (the awaited step is cancelled, the iterator closed)."""
    loop = asyncio.get_running_loop()
    current: list[asyncio.Future[Any]] = []
    cancelled = False

    def on_cancel() -> None:
        nonlocal cancelled
        cancelled = True
        for f in current:
            loop.call_soon_threadsafe(f.cancel)

    if token is not None:
        token.add_callback(on_cancel)
    try:
        while True:
            if cancelled:
                raise asyncio.CancelledError("cancelled by the CancellationToken")
            fut = asyncio.ensure_future(items.__anext__())
            current[:] = [fut]
            try:
                item = await fut
            except StopAsyncIteration:
                return
            finally:
                current.clear()
            yield item
    finally:
        await items.aclose()  # type: ignore[attr-defined]


def _thought(outcome: CallOutcome) -> str | None:
    """The text before the calls; after a redo, the first attempt's text before its broken call."""
    reply = outcome.reply
    if not outcome.retried:
        return reply.content or None
    text = outcome.results[0].text
    j = text.find(outcome.plan.fmt.opener) if outcome.plan.fmt.native else -1
    return (text[:j].strip() if j != -1 else text_before_json(text)) or None


def create_result(outcome: CallOutcome) -> CreateResult:
    """AutoGen's `CreateResult` of a finished call (usage summed over every generation, the write-back included)."""
    reply, first, plan = outcome.reply, outcome.results[0], outcome.plan
    content: str | list[FunctionCall] = reply.text
    thought = None
    finish: FinishReasons = "length" if first.finish_reason == "length" else "stop"
    if reply.is_call:
        content = function_calls(reply.calls)
        thought, finish = _thought(outcome), "function_calls"
    elif plan.mode == "tools":
        logger.warning("agent %r: forced tool call did not complete (finish=%s, %d tokens): %r",
                       plan.agent_id, first.finish_reason, first.usage.completion_tokens, reply.text[:120])
    results = outcome.all_results
    usage = RequestUsage(prompt_tokens=sum(r.usage.prompt_tokens for r in results),
                         completion_tokens=sum(r.usage.completion_tokens for r in results))
    return CreateResult(finish_reason=finish, content=content, usage=usage, cached=first.usage.cached_tokens > 0,
                        thought=thought)


async def execute(
    pool: MemoryPool, plan: _Plan, token: CancellationToken | None, record: Record, *, stream: bool
) -> AsyncGenerator[str | CreateResult, None]:
    """Run `plan` on `pool`: text pieces (when `stream`), then the `CreateResult`.

    Args:
        pool: the shared pool.
        plan: the call, from `plan_call`.
        token: cancelling it stops the generation.
        record: called with every finished pool generation.
        stream: yield text pieces as they come (a reply that is a tool call yields none).

    Yields:
        Text pieces, then one `CreateResult` whose usage sums every generation the
        call ran (a redo under the grammar, a write-back of the call).
    """
    runner = CallRunner(pool, on_result=record)
    async for kind, value in cancellable(runner.arun(plan), token):
        if kind == "text":
            if stream:
                yield value
            continue
        if stream and value.rest:
            yield value.rest
        yield create_result(value)
