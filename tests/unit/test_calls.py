"""`agentmem.calls`, the one tool-call protocol: its steps, strategies, runner, turns and the bridge under it.

Fakes only (a scripted pool): the real model runs these through the server, LangChain and
AutoGen tests.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import pytest

import agentmem.calls as calls
from agentmem.calls import (AgentTurns, CallPlan, CallRunner, FreeThenForced, Generate, HoldsKV, LazyCall, call_steps,
                            get_strategy, plan_chat)
from agentmem.errors import ConfigError
from agentmem.pool import ChatResult, ChatStream
from agentmem.pool.bridge import Workers, drive_async
from agentmem.pool.results import Timings, Usage
from agentmem.tools import get_tool_format

HERMES = get_tool_format("hermes")
ENVELOPE = get_tool_format("envelope")
ADD = {"name": "add", "description": "", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                        "required": ["a"]}}
GOOD = '{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}'
BROKEN = '{"tool_calls": [{"name": "add", "argu'


def result(text: str, agent: str = "a") -> ChatResult:
    return ChatResult(agent, text, "stop", Usage(prompt_tokens=5, cached_tokens=2, completion_tokens=3), Timings(), "reused")


def test_the_public_api_is_pinned() -> None:
    assert set(calls.__all__) == {
        "STRATEGIES", "AgentTurns", "CallEvent", "CallOutcome", "CallPlan", "CallRunner", "DecodeStrategy", "Decoded",
        "FreeThenForced", "Generate", "HoldsKV", "LazyCall", "Mode", "Reply", "StreamGate", "call_steps", "forced_plan",
        "get_strategy", "json_plan", "plan_chat", "read_reply", "show_tools", "turns_for",
    }


def test_the_core_imports_no_front_end() -> None:
    """`agentmem.calls` sits under the server and the integrations: importing it loads none of them."""
    code = (
        "import sys, agentmem.calls; "
        "bad = sorted(m for m in sys.modules if m.startswith('agentmem.server') or m.split('.')[0] in "
        "('fastapi', 'langchain_core', 'autogen_core', 'agent_framework', 'agentmem_langchain', 'agentmem_autogen')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


# --------------------------------------------------------------------------- the protocol as steps
def drive(plan: CallPlan, answers: list[Any], strategy: Any = None) -> tuple[list[Any], Any]:
    """Run `call_steps(plan, strategy)` with scripted answers: the steps it asked, and its outcome."""
    steps = call_steps(plan, strategy)
    asked: list[Any] = []
    answer: Any = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as stop:
            return asked, stop.value
        asked.append(step)
        answer = answers.pop(0)


def test_a_broken_auto_call_is_retried_forced_once() -> None:
    plan = plan_chat("a", [{"role": "user", "content": "1+?"}], {}, ENVELOPE, tools=[ADD])
    assert plan.forced is not None
    asked, out = drive(plan, [result(BROKEN), result(GOOD[len(plan.forced().prefix):])], FreeThenForced())
    assert [type(s) for s in asked] == [Generate, Generate]
    assert asked[0].gate is not None and asked[1].gate is None  # only the first attempt streams
    assert asked[1].plan.mode == "tools" and asked[1].plan.grammar
    assert out.retried and out.reply.is_call and [(c.name, c.arguments) for c in out.reply.calls] == [("add", {"a": 1})]
    assert out.usage() == {"prompt_tokens": 10, "completion_tokens": 6, "cached_tokens": 4}
    assert out.finish_reason == "tool_calls" and out.rest == ""


def test_a_native_call_the_kv_does_not_hold_is_written_back_and_one_it_holds_is_not() -> None:
    plan = plan_chat("a", [{"role": "user", "content": "1+?"}], {}, HERMES, tools=[ADD])
    native = HERMES.render_call([("add", {"a": 1})])
    asked, out = drive(plan, [result(native), False, result("")])
    assert isinstance(asked[1], HoldsKV) and isinstance(asked[2], Generate)
    rewrite = asked[2].plan
    assert rewrite.sampling["max_tokens"] == 0 and rewrite.messages[-1] == {"role": "assistant", "content": native}
    assert out.rewrite is not None and len(out.all_results) == 2 and out.usage()["prompt_tokens"] == 5
    asked, out = drive(plan, [result(native), True])
    assert len(asked) == 2 and out.rewrite is None


def test_text_streams_and_a_held_maybe_call_is_the_rest() -> None:
    plan = plan_chat("a", [{"role": "user", "content": "hi"}], {}, ENVELOPE, tools=[ADD])
    gate = calls.StreamGate(plan)
    assert gate.push("{") == "" and gate.push('"x": 1}') == '{"x": 1}'  # not the envelope: text
    lenient = CallPlan("a", [], mode="auto", tool_names=("add",), lenient=True)  # AutoGen: any object may be a call
    gate = calls.StreamGate(lenient)
    assert gate.push("{") == "" and gate.push('"x": 1}') == ""
    reply = calls.read_reply(lenient, '{"x": 1}')
    assert reply.content == '{"x": 1}' and not reply.is_call and gate.rest(reply) == '{"x": 1}'
    json_plan = plan_chat("a", [{"role": "user", "content": "hi"}], {}, ENVELOPE, json_reply=True)
    assert json_plan.mode == "json" and calls.StreamGate(json_plan).push('"k": 1}') == json_plan.prefix + '"k": 1}'


def test_a_free_tool_turn_decodes_once_under_its_lazy_grammar() -> None:
    plan = plan_chat("a", [{"role": "user", "content": "1+?"}], {}, ENVELOPE, tools=[ADD])
    asked, out = drive(plan, [result(GOOD)])
    assert len(asked) == 1 and asked[0].plan.grammar == plan.lazy() and asked[0].plan.mode == "auto"
    assert asked[0].plan.grammar.patterns and isinstance(asked[0].gate, calls.StreamGate) is False
    assert out.reply.is_call and not out.retried and out.usage()["prompt_tokens"] == 5
    asked, out = drive(plan, [result(BROKEN)])  # cut off by max_tokens: no second decode, the text with its invalid call
    assert len(asked) == 1 and not out.reply.is_call and out.reply.invalid and out.reply.content == BROKEN
    asked, out = drive(plan, [result("It is 2.")])
    assert out.reply.content == "It is 2." and out.finish_reason == "stop"


def test_a_lazy_turn_reads_a_call_of_a_tool_not_offered_as_text() -> None:
    plan = plan_chat("a", [{"role": "user", "content": "1+?"}], {}, ENVELOPE, tools=[ADD])
    other = '{"tool_calls": [{"name": "mul", "arguments": {"a": 1}}]}'  # a misfired trigger leaves the reply free
    _, out = drive(plan, [result(other)])
    assert not out.reply.is_call and out.reply.content == other


def test_the_lazy_gate_streams_text_at_once_and_holds_a_call() -> None:
    plan = plan_chat("a", [{"role": "user", "content": "1+?"}], {}, HERMES, tools=[ADD])
    steps = call_steps(plan)
    gen = steps.send(None)
    assert gen.gate.push("Su") == "Su" and gen.gate.push("re <tool") == "re "
    assert gen.gate.push('_call>\n{"name": "add"') == ""
    text = "Sure " + HERMES.render_call([("add", {"a": 1})])
    with pytest.raises(StopIteration) as stop:
        steps.send(result(text))
        steps.send(True)  # the KV holds the call as written back
    out = stop.value.value
    assert out.reply.is_call and out.reply.content.strip() == "Sure" and out.rest == ""


def test_plans_a_lazy_grammar_cannot_serve_decode_as_before() -> None:
    lenient = plan_chat("a", [{"role": "user", "content": "1+?"}], {}, ENVELOPE, tools=[ADD])
    lenient.lenient = True  # AutoGen's reading: calls anywhere, code fences
    asked, out = drive(lenient, [result(BROKEN), result(GOOD[len(lenient.forced().prefix):])])
    assert len(asked) == 2 and out.retried
    forced = plan_chat("a", [{"role": "user", "content": "1+?"}], {}, ENVELOPE, tools=[ADD], choice="required")
    asked, _ = drive(forced, [result(GOOD[len(forced.prefix):])])
    assert len(asked) == 1 and asked[0].plan.mode == "tools" and isinstance(asked[0].plan.grammar, str)


def test_an_unknown_strategy_names_the_valid_ones() -> None:
    assert get_strategy("free_then_forced").name == "free_then_forced" and isinstance(get_strategy("lazy"), LazyCall)
    with pytest.raises(ConfigError, match="free_then_forced.*lazy|lazy.*free_then_forced"):
        get_strategy("eager")


# --------------------------------------------------------------------------- the runner on a scripted pool
class ScriptPool:
    """`chat_stream` replies from a script, piece by piece; records what it was asked."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.asked: list[dict[str, Any]] = []
        self.closed_streams = 0

    def chat_stream(self, agent_id: str, messages: Any, **kw: Any) -> ChatStream:
        self.asked.append({"agent": agent_id, "messages": messages, **kw})
        text = self.replies.pop(0)

        def gen() -> Iterator[Any]:
            try:
                for i in range(0, len(text), 4):
                    yield text[i:i + 4]
                yield result(text, agent_id)
            finally:
                self.closed_streams += 1

        return ChatStream(gen())


def test_the_sync_and_async_drivers_give_the_same_events() -> None:
    def plan() -> CallPlan:
        return plan_chat("a", [{"role": "user", "content": "hi"}], {"max_tokens": 8}, ENVELOPE, tools=[ADD])

    sync_pool = ScriptPool(["Hello there.", ])
    sync = list(CallRunner(sync_pool, turns=AgentTurns()).run(plan()))  # type: ignore[arg-type]

    async def go() -> list[Any]:
        pool = ScriptPool(["Hello there."])
        return [e async for e in CallRunner(pool, turns=AgentTurns()).arun(plan())]  # type: ignore[arg-type]

    events = asyncio.run(go())
    texts = lambda evs: "".join(v for k, v in evs if k == "text")  # noqa: E731
    assert texts(sync) == texts(events) == "Hello there."
    assert sync[-1][0] == events[-1][0] == "done" and sync[-1][1].reply.content == events[-1][1].reply.content
    assert sync_pool.closed_streams == 1


def test_a_retry_runs_under_the_forced_grammar_and_is_recorded() -> None:
    plan = plan_chat("a", [{"role": "user", "content": "1+?"}], {}, ENVELOPE, tools=[ADD])
    assert plan.forced is not None
    pool = ScriptPool([BROKEN, GOOD[len(plan.forced().prefix):]])
    seen: list[str] = []
    runner = CallRunner(pool, turns=AgentTurns(), on_result=lambda plan, r: seen.append(plan.mode),  # type: ignore[arg-type]
                        strategy=FreeThenForced())
    out = runner.collect(plan)
    assert out.retried and seen == ["auto", "tools"] and "grammar" in pool.asked[1] and "grammar" not in pool.asked[0]
    lazy = CallRunner(pool, turns=AgentTurns())  # type: ignore[arg-type]
    pool.replies = [BROKEN]
    out = lazy.collect(plan)  # the default: one decode under the lazy grammar, no retry
    assert not out.retried and len(pool.asked) == 3 and pool.asked[2]["grammar"] == plan.lazy()


# --------------------------------------------------------------------------- turns
def test_turns_serialize_threads_of_one_agent_and_not_of_two() -> None:
    turns = AgentTurns()
    inside: dict[str, int] = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0, "both": 0}
    guard = threading.Lock()

    def work(agent: str) -> None:
        with turns.hold(agent):
            with guard:
                inside[agent] += 1
                peak[agent] = max(peak[agent], inside[agent])
                peak["both"] = max(peak["both"], inside["a"] + inside["b"])
            time.sleep(0.02)
            with guard:
                inside[agent] -= 1

    threads = [threading.Thread(target=work, args=(a,)) for a in "abab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert peak["a"] == peak["b"] == 1 and peak["both"] == 2, peak
    assert not turns.busy("a") and turns.waiting == 0


async def test_coroutines_wait_first_come_first_served_and_a_cancelled_waiter_keeps_nothing() -> None:
    """The LangChain lock polled with sleeps (no order, a cancelled waiter could race); turns hand over in order."""
    turns = AgentTurns()
    order: list[int] = []
    release = asyncio.Event()

    async def first() -> None:
        async with turns.ahold("a"):
            await release.wait()

    async def later(i: int) -> None:
        async with turns.ahold("a"):
            order.append(i)

    t0 = asyncio.create_task(first())
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(later(i)) for i in range(3)]
    cancelled = asyncio.create_task(later(99))
    await asyncio.sleep(0.01)
    assert turns.waiting == 4
    cancelled.cancel()
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(t0, *waiters)
    assert order == [0, 1, 2] and not turns.busy("a") and turns.waiting == 0


async def test_a_thread_and_a_coroutine_share_one_agent_turn() -> None:
    turns = AgentTurns()
    log: list[str] = []
    held = threading.Event()

    def thread() -> None:
        with turns.hold("a"):
            held.set()
            time.sleep(0.05)
            log.append("thread")

    t = threading.Thread(target=thread)
    t.start()
    await asyncio.to_thread(held.wait, 5)
    async with turns.ahold("a"):
        log.append("coroutine")
    t.join(5)
    assert log == ["thread", "coroutine"]


# --------------------------------------------------------------------------- the bridge
class SlowStream:
    """A stream that makes pieces until cancelled; records cancel and close."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.closed = False
        self.result: ChatResult | None = None

    def __iter__(self) -> SlowStream:
        return self

    def __next__(self) -> str:
        if self.cancelled.wait(0.01):
            raise StopIteration
        return "x"

    def cancel(self) -> None:
        self.cancelled.set()

    def close(self) -> None:
        self.closed = True


async def test_closing_a_bridged_stream_early_cancels_it_and_waits_for_its_close() -> None:
    stream = SlowStream()
    workers = Workers()
    items = drive_async(lambda: stream, workers=workers)
    assert await items.__anext__() == "x"
    await items.aclose()
    assert stream.cancelled.is_set() and stream.closed and workers.idle


async def test_a_bridged_error_is_raised_on_the_loop() -> None:
    def boom() -> Any:
        raise ConfigError("bad field x")

    with pytest.raises(ConfigError, match="field x"):
        async for _ in drive_async(boom):
            pass
