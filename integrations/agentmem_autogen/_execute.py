"""Runs a planned call on the pool: streams its pieces, holds back what may be a tool call, redoes a malformed call under the grammar, writes a call back in the template's form, and builds the `CreateResult`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, AsyncGenerator, Callable

from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import CreateResult, FinishReasons, RequestUsage

from agentmem import ChatResult, MemoryPool
from agentmem.tools import text_before_json

from ._messages import parse_tool_calls
from ._plan import _Plan, opens_call

logger = logging.getLogger(__name__)

Record = Callable[[_Plan, ChatResult], None]
"""Called with every finished pool generation of a call (the client keeps the latest)."""


async def pool_stream(
    pool: MemoryPool, plan: _Plan, grammar: str | None, prefix: str | None, token: CancellationToken | None
) -> AsyncGenerator[str | ChatResult, None]:
    """One pool generation as an async stream; cancelling `token` stops it at once.

    `prefix` (a forced call's) is given to the model as the start of its reply: with a native
    format as the pool's `opening` (tokenized as the template renders the call sent back),
    else as a started assistant turn (continued, not closed).
    """
    kw = dict(plan.sampling)
    if grammar is not None:
        kw["grammar"] = grammar
    msgs = plan.messages
    if prefix is not None and plan.fmt.native:
        kw["opening"] = prefix
    elif prefix is not None:
        msgs = [*plan.messages, {"role": "assistant", "content": prefix}]
    agen = pool.achat_stream(plan.agent_id, msgs, **kw)
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
            fut = asyncio.ensure_future(agen.__anext__())
            current[:] = [fut]
            try:
                item = await fut
            except StopAsyncIteration:
                return
            finally:
                current.clear()
            yield item
    finally:
        await agen.aclose()


async def generate(
    pool: MemoryPool,
    plan: _Plan,
    grammar: str | None,
    prefix: str | None,
    token: CancellationToken | None,
    record: Record,
) -> ChatResult:
    """Run one pool generation to its end (and `record` it)."""
    result: ChatResult | None = None
    async for item in pool_stream(pool, plan, grammar, prefix, token):
        if isinstance(item, ChatResult):
            result = item
    assert result is not None, "the pool stream ended without a ChatResult"
    record(plan, result)
    return result


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
    results: list[ChatResult] = []
    if stream and plan.stream_text:
        # Stream text as it comes, except a reply that opens like a tool call
        # (held back until it is known whether it is one).
        held: list[str] = []
        holding: bool | None = None  # undecided until the first non-blank piece
        r1: ChatResult | None = None
        async for item in pool_stream(pool, plan, plan.grammar, None, token):
            if isinstance(item, ChatResult):
                r1 = item
                continue
            if holding is None:
                held.append(item)
                lead = "".join(held).lstrip()
                if not lead:
                    continue
                opens = opens_call(plan, lead)
                if opens is None:
                    continue  # could still be a call: keep holding
                holding = bool(plan.tool_names) and opens
                if not holding:
                    for piece in held:
                        yield piece
                    held.clear()
            elif holding:
                held.append(item)
            else:
                yield item
        assert r1 is not None, "the pool stream ended without a ChatResult"
        record(plan, r1)
        results.append(r1)
        text = r1.text
        unsent = "".join(held)
    else:
        r1 = await generate(pool, plan, plan.grammar, plan.prefix, token, record)
        results.append(r1)
        text = (plan.prefix or "") + r1.text
        unsent = text if stream else ""

    content: str | list[FunctionCall] = text
    thought: str | None = None
    finish: FinishReasons = "length" if r1.finish_reason == "length" else "stop"
    if plan.tool_names:
        written = text  # the reply as the model wrote it (the forced prefix included)
        parsed = parse_tool_calls(text, plan.tool_names, plan.fmt)
        if parsed is None and plan.retry is not None and plan.fmt.looks_like_call(text, plan.tool_names):
            logger.debug("agent %r: malformed tool call %r; redoing it under the grammar", plan.agent_id, text[:80])
            prefix, grammar = plan.retry
            r2 = await generate(pool, plan, grammar, prefix, token, record)
            results.append(r2)
            written = prefix + r2.text
            parsed = parse_tool_calls(written, plan.tool_names, plan.fmt)
            if parsed is not None:
                j = text.find(plan.fmt.opener) if plan.fmt.native else -1
                parsed = (parsed[0], text[:j].strip() if j != -1 else text_before_json(text))
        if parsed is not None:
            content, before = parsed
            thought = before or None
            finish = "function_calls"
            unsent = ""
            back = plan.fmt.written_back(before, [(c.name, c.arguments) for c in content]) if plan.fmt.native else None
            if back is not None and back != written.strip():
                # The model wrote the call in another shape than its template writes it back:
                # put the template's form in the KV now (prefill only), so the next call keeps it.
                quiet = dataclasses.replace(plan, sampling={**plan.sampling, "max_tokens": 0})
                results.append(await generate(pool, quiet, None, back, token, record))
        elif plan.forced:
            logger.warning(
                "agent %r: forced tool call did not complete (finish=%s, %d tokens): %r",
                plan.agent_id, r1.finish_reason, r1.usage.completion_tokens, text[:120],
            )
    if stream and unsent:
        yield unsent

    usage = RequestUsage(
        prompt_tokens=sum(r.usage.prompt_tokens for r in results),
        completion_tokens=sum(r.usage.completion_tokens for r in results),
    )
    yield CreateResult(
        finish_reason=finish,
        content=content,
        usage=usage,
        cached=r1.usage.cached_tokens > 0,
        thought=thought,
    )
