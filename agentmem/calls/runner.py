"""`CallRunner`: drives the protocol (`call_steps`) on a pool, in a thread or on an event loop.

The two drivers answer the same steps: `Generate` opens the pool stream
(`MemoryPool.chat_stream` / `complete_stream`) and passes its pieces through the step's
gate, `HoldsKV` compares the agent's KV with the next prompt. The synchronous driver runs
them in the calling thread; the asynchronous one in worker threads through the one bridge
(`agentmem.pool.bridge`). Both hold the agent's turn (`AgentTurns`) for the whole call.
Events are `("text", piece)` as a caller may show them, then `("done", CallOutcome)`; the
text held back to the end (`CallOutcome.rest`) is the front-end's to show with its last event.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Callable, Iterator, Literal, Union

from agentmem import validation as check
from agentmem.calls.plan import CallPlan
from agentmem.calls.protocol import CallOutcome, call_steps
from agentmem.calls.reply import Reply
from agentmem.calls.steps import Generate, HoldsKV, Step, Steps
from agentmem.calls.strategy import DecodeStrategy
from agentmem.calls.turns import AgentTurns, turns_for
from agentmem.pool import ChatResult, ChatStream, ModelEngine
from agentmem.pool.bridge import Workers, call_in_thread, drive_async

__all__ = ["CallEvent", "CallRunner", "until_done"]

CallEvent = Union[tuple[Literal["text"], str], tuple[Literal["done"], CallOutcome]]


class CallRunner:
    """Runs `CallPlan`s on one pool.

    Args:
        pool: the pool.
        turns: the per-agent serializer (default: the pool's process-wide `turns_for(pool)`).
        workers: where the async driver registers its threads (a server's shutdown waits for them).
        on_result: called with every finished pool generation (metrics, a client's last result).
        strategy: how a reply is generated and read (default: `LazyCall`).
    """

    def __init__(self, pool: ModelEngine, *, turns: AgentTurns | None = None, workers: Workers | None = None,
                 on_result: Callable[[CallPlan, ChatResult], None] | None = None,
                 strategy: DecodeStrategy | None = None) -> None:
        self.pool = pool
        self.turns = turns if turns is not None else turns_for(pool)
        self.workers = workers
        self.on_result = on_result
        self.strategy = strategy

    # ------------------------------------------------------------------ the pool side of a step
    def open(self, plan: CallPlan) -> ChatStream:
        """The pool stream of `plan` (blocking: renders the prompt)."""
        if plan.messages is not None:
            return self.pool.chat_stream(plan.agent_id, plan.pool_messages(), **plan.sampling)
        return self.pool.complete_stream(plan.agent_id, plan.prompt or "", **plan.sampling)

    def kv_holds(self, plan: CallPlan, reply: Reply) -> bool:
        """Whether the agent's KV holds the reply's calls token for token as the next prompt renders them."""
        assert reply.written_back is not None and plan.messages is not None
        want = self.pool.renderer.render(
            check.message_list([*plan.messages, {"role": "assistant", "content": reply.written_back}]), tools=plan.tools
        ).ids
        held = self.pool.history_tokens(plan.agent_id)
        return len(held) >= len(want) and list(held[: len(want)]) == want.tolist()

    def _finished(self, plan: CallPlan, result: ChatResult | None) -> ChatResult:
        assert result is not None, "a finished stream has a result"
        if self.on_result is not None:
            self.on_result(plan, result)
        return result

    # ------------------------------------------------------------------ synchronous
    def run(self, plan: CallPlan, *, hold: bool = True) -> Iterator[CallEvent]:
        """Run `plan` in this thread: text events, then `("done", CallOutcome)`.

        `hold=False`: the caller already holds the agent's turn. Closing the iterator early
        closes the pool stream (the agent is freed).
        """
        with self.turns.hold(plan.agent_id) if hold else contextlib.nullcontext():
            steps = call_steps(plan, self.strategy)
            answer: Any = None
            while not isinstance(step := _advance(steps, answer), CallOutcome):
                if isinstance(step, HoldsKV):
                    answer = self.kv_holds(step.plan, step.reply)
                    continue
                stream = self.open(step.plan)
                with contextlib.closing(stream):
                    for piece in stream:
                        shown = step.gate.push(piece) if step.gate is not None else ""
                        if shown:
                            yield ("text", shown)
                answer = self._finished(step.plan, stream.result)
        yield ("done", step)

    def collect(self, plan: CallPlan) -> CallOutcome:
        """Run `plan` to its end in this thread."""
        return _last(self.run(plan))

    # ------------------------------------------------------------------ on an event loop
    async def arun(self, plan: CallPlan, *, hold: bool = True) -> AsyncIterator[CallEvent]:
        """Run `plan` from a coroutine (pool work in worker threads): text events, then `("done", CallOutcome)`.

        `hold=False`: the caller already holds the agent's turn (`turns.ahold`). Closing the
        iterator early stops generation at the next token and frees the agent.
        """
        async with self.turns.ahold(plan.agent_id) if hold else contextlib.nullcontext():
            steps: Steps = call_steps(plan, self.strategy)
            answer: Any = None
            while not isinstance(step := _advance(steps, answer), CallOutcome):
                if isinstance(step, HoldsKV):
                    answer = await call_in_thread(self.kv_holds, step.plan, step.reply, workers=self.workers)
                    continue
                result = None
                async with contextlib.aclosing(self._astream(step)) as items:
                    async for item in items:
                        if isinstance(item, ChatResult):
                            result = item
                        elif item:
                            yield ("text", item)
                answer = self._finished(step.plan, result)
        yield ("done", step)

    async def _astream(self, step: Generate) -> AsyncIterator[str | ChatResult]:
        """The pool stream of a `Generate` step, its pieces already through the gate."""
        async with contextlib.aclosing(drive_async(lambda: self.open(step.plan), workers=self.workers)) as items:
            async for item in items:
                if isinstance(item, ChatResult) or step.gate is None:
                    yield item if isinstance(item, ChatResult) else ""
                else:
                    yield step.gate.push(item)

    async def acollect(self, plan: CallPlan) -> CallOutcome:
        """Run `plan` to its end from a coroutine."""
        return await until_done(self.arun(plan))


def _advance(steps: Steps, answer: Any) -> Step | CallOutcome:
    """The protocol's next step after `answer`, or its outcome when it is done."""
    try:
        return steps.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _last(events: Iterator[CallEvent]) -> CallOutcome:
    for kind, value in events:
        if kind == "done":
            assert isinstance(value, CallOutcome)
            return value
    raise AssertionError("a call ends with its outcome")


async def until_done(events: AsyncIterator[tuple[str, Any]]) -> Any:
    """The value of the `("done", value)` event that ends `events` (the iterator is closed)."""
    async with contextlib.aclosing(events) as items:  # type: ignore[type-var]
        async for kind, value in items:
            if kind == "done":
                return value
    raise AssertionError("a call ends with its outcome")
