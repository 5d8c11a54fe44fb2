"""AgentMemChatClient and AgentMemContextProvider inside MAF, on a scripted pool.

The pool here is a fake that replies what each test scripts and records every call: what
is pinned is the adapter's logic — MAF's function-invocation loop driving a tool round
trip through the client, streaming updates, structured output, usage, the agent id rule,
the protocol's grammar/opening choices, and the provider's facts and recall. The real
model runs in tests/integration/test_maf_real.py.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from agentmem.tools.lazy import LazyGrammar

pytest.importorskip("agent_framework")

from agent_framework import Agent, Message, tool  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import agentmem_maf  # noqa: E402
from agentmem import ChatResult, PoolConfig  # noqa: E402
from agentmem.pool.results import ChatStream, Timings, Usage  # noqa: E402
from agentmem.tools import get_tool_format  # noqa: E402
from agentmem.tools.recall import FACTS_HEADER, RECALL_HEADER  # noqa: E402
from agentmem_maf import AgentMemChatClient, AgentMemContextProvider, clients_for  # noqa: E402

CALL = '<tool_call>\n{"name": "order_weight", "arguments": {"order_id": 17}}\n</tool_call>'


@tool
def order_weight(order_id: int) -> str:
    """The weight of an order in kilograms."""
    return f"order {order_id} weighs {order_id * 1.5} kg"


class Verdict(BaseModel):
    ok: bool
    reason: str


@dataclass
class _Span:
    start: int
    end: int
    score: float = 1.0
    region: int = 0

from tests.fixtures.model_pools import FakeModelPool


class _Model:
    @staticmethod
    def detokenize(tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens)


class ScriptedPool(FakeModelPool):
    """A pool of one whose engine is itself: it replies from a script (Qwen's tool syntax) and records each call."""

    config = model_path = None  # plain attributes here (the pool's are read from its engine)

    def __init__(self, replies: list[str], *, cached: int = 0) -> None:  # no model: nothing of the real pool runs
        self.config = PoolConfig(n_ctx=1024)
        self.model_path = "/fake/qwen2.5-fake.gguf"
        super().__init__({"qwen2.5-fake": self})
        self.model = _Model()
        self.replies = list(replies)
        self.cached = cached
        self.calls: list[dict[str, Any]] = []
        self.pins: list[tuple[str, int, bool]] = []
        self.history = ""
        self.evicted: list[_Span] = []

    closed = False

    @property
    def tool_format(self):  # type: ignore[override]
        return get_tool_format("hermes")

    kv_matches = True  # whether the KV holds a call as the template writes it back (no write-back)

    @property
    def renderer(self):  # type: ignore[override]
        return _Renderer(self)

    def chat_stream(self, agent_id: str, messages: Any, **kw: Any) -> ChatStream:  # type: ignore[override]
        self.calls.append({"agent": agent_id, "messages": list(messages), **kw})
        text = self.replies.pop(0) if self.replies and kw.get("max_tokens") != 0 else ("done" if kw.get("max_tokens") else "")
        result = ChatResult(agent_id, text, "stop", Usage(prompt_tokens=40, cached_tokens=self.cached,
                                                          completion_tokens=len(text)), Timings(), "reused")
        return ChatStream(self._pieces(text, result))

    slow = 0.0  # seconds per piece
    stopped: list[str] = []  # replies whose generation was closed before its end

    def _pieces(self, text: str, result: ChatResult) -> Any:
        done = False
        try:
            for i in range(0, len(text), 5):
                time.sleep(self.slow)
                yield text[i : i + 5]
            done = True
            yield result
        finally:
            if not done:
                self.stopped.append(text)

    def pin(self, agent_id: str, message_index: int, pinned: bool = True) -> int:  # type: ignore[override]
        self.pins.append((agent_id, message_index, pinned))
        return 1

    def recall(self, agent_id: str, query: str, k: int = 5) -> list[Any]:  # type: ignore[override]
        return self.evicted[:k]

    def recall_stats(self) -> dict[str, Any]:  # a keyword recall: the recall tool's shared-word gate applies
        return {"embedder": None, "mode": "keyword"}

    def history_tokens(self, agent_id: str) -> list[int]:  # type: ignore[override]
        return [ord(c) for c in self.history]


class _Renderer:
    def __init__(self, pool: ScriptedPool) -> None:
        self.pool = pool

    def render(self, messages: Any, tools: Any = None) -> Any:
        class _Prompt:  # what `CallRunner.kv_holds` reads of a `RenderedPrompt`: its token ids
            ids = np.array([] if self.pool.kv_matches else [-1], dtype=np.int32)
        return _Prompt()


def run(coro):
    return asyncio.run(coro)


def test_the_function_loop_runs_a_tool_round_trip_through_the_client():
    pool = ScriptedPool([CALL, "Order 17 weighs 25.5 kg."], cached=30)
    agent = Agent(client=AgentMemChatClient(pool), name="clerk", instructions="Use the tools.", tools=[order_weight])
    r = run(agent.run("What does order 17 weigh?"))
    assert r.text == "Order 17 weighs 25.5 kg."
    assert [c.type for m in r.messages for c in m.contents][:2] == ["function_call", "function_result"]
    first, second = pool.calls
    assert first["agent"] == second["agent"] == "clerk"  # the agent's name names its KV
    assert [t["name"] for t in first["tools"]] == ["order_weight"]  # a native format: through the template
    assert second["messages"][-1] == {"role": "tool", "content": "order 17 weighs 25.5 kg", "tool_call_id":
                                      second["messages"][-2]["tool_calls"][0]["id"], "name": "order_weight"}
    assert second["messages"][-2]["tool_calls"][0]["arguments"] == '{"order_id": 17}'
    assert len(pool.calls) == 2, "the call was written as the template writes it back: no write-back prefill"
    assert r.usage_details["cache_read_input_token_count"] == 60
    assert r.usage_details["input_token_count"] == 80


def test_a_required_call_is_forced_by_its_opening_and_grammar():
    pool = ScriptedPool([' 17}}\n</tool_call>', "It weighs 25.5 kg."])  # the rest after the forced opening
    client = AgentMemChatClient(pool, agent_id="clerk")
    r = run(client.get_response([Message("user", ["weigh 17"])],
                                options={"tools": [order_weight], "tool_choice": "required"}))
    forced, after = pool.calls  # no write-back: opening + reply is the call as the template writes it
    assert forced["opening"].startswith("<tool_call>") and forced["grammar"]
    (content,) = r.messages[0].contents
    assert content.type == "function_call" and json.loads(content.arguments) == {"order_id": 17}
    # MAF unsets a required choice after the call: the answer to the result is a free tool turn (a lazy
    # grammar, one decode), tools still shown
    assert "opening" not in after and isinstance(after["grammar"], LazyGrammar) and after["tools"]
    assert r.text == "It weighs 25.5 kg."


def test_a_call_written_in_another_shape_is_written_back_in_the_templates():
    pool = ScriptedPool([' 17}}\n</tool_call>'])
    pool.kv_matches = False  # the KV holds the reply in another shape than the next prompt renders it
    client = AgentMemChatClient(pool, agent_id="clerk", function_invocation_configuration={"enabled": False})
    run(client.get_response([Message("user", ["weigh 17"])], options={"tools": [order_weight], "tool_choice": "required"}))
    _, back = pool.calls
    assert back["max_tokens"] == 0 and back["messages"][-1] == {"role": "assistant", "content": CALL}  # prefill only


def test_at_the_function_call_limit_the_tools_stay_shown_but_not_callable():
    """`max_function_calls=1`: the call after the result has tool_choice "none" — a small model answers."""
    pool = ScriptedPool([CALL, CALL])
    client = AgentMemChatClient(pool, agent_id="clerk", function_invocation_configuration={"max_function_calls": 1})
    r = run(client.get_response([Message("user", ["weigh 17"])], options={"tools": [order_weight]}))
    assert len(pool.calls) == 2
    assert pool.calls[1]["tools"] == pool.calls[0]["tools"], "the same prompt prefix: the KV stays reusable"
    assert pool.calls[1]["canonical_calls"] is False
    assert [c.type for c in r.messages[-1].contents] == ["text"]


def test_streaming_yields_text_updates_then_usage():
    pool = ScriptedPool(["Hello there, clerk here."], cached=12)
    client = AgentMemChatClient(pool, agent_id="clerk")

    async def go():
        stream = client.get_response([Message("user", ["hi"])], stream=True)
        pieces = [u.text async for u in stream]
        return pieces, await stream.get_final_response()

    pieces, final = run(go())
    assert len([p for p in pieces if p]) > 1 and "".join(pieces) == "Hello there, clerk here."
    assert final.text == "Hello there, clerk here."
    assert final.usage_details["cache_read_input_token_count"] == 12


def test_a_streamed_tool_call_is_held_back_and_arrives_as_a_call():
    pool = ScriptedPool([CALL, "Order 17 weighs 25.5 kg."])
    client = AgentMemChatClient(pool, agent_id="clerk")

    async def go():
        stream = client.get_response([Message("user", ["weigh 17"])], stream=True, options={"tools": [order_weight]})
        updates = [u async for u in stream]
        return updates, await stream.get_final_response()

    updates, final = run(go())
    text = "".join(u.text for u in updates)
    assert "<tool_call>" not in text and text.endswith("Order 17 weighs 25.5 kg.")
    kinds = [c.type for u in updates for c in u.contents]
    assert "function_call" in kinds and "function_result" in kinds  # the loop ran the tool between the two calls
    assert final.text.endswith("Order 17 weighs 25.5 kg.")


def test_structured_output_is_constrained_to_the_schema_and_parsed():
    pool = ScriptedPool([' true, "reason": "fits"}'])  # the grammar's forced start '{"ok":' is in the prompt
    client = AgentMemChatClient(pool, agent_id="judge")
    r = run(client.get_response([Message("user", ["judge it"])], options={"response_format": Verdict}))
    assert "ok" in pool.calls[0]["grammar"] and r.value == Verdict(ok=True, reason="fits")


def test_agent_id_rule_in_a_run():
    pool = ScriptedPool(["a", "b", "c"])
    named = Agent(client=AgentMemChatClient(pool, agent_id="kv-pm"), name="pm")
    run(named.run("x"))
    nameless = Agent(client=AgentMemChatClient(pool))
    session = nameless.create_session(session_id="conv-7")
    run(nameless.run("y", session=session))
    run(Agent(client=AgentMemChatClient(pool)).run("z"))
    assert [c["agent"] for c in pool.calls] == ["kv-pm", "conv-7", agentmem_maf.FALLBACK_AGENT_ID]


def test_clients_for_gives_each_agent_its_id():
    pool = ScriptedPool([])
    clients = clients_for(pool, ["researcher", "writer"], max_tokens=32)
    assert {k: c.agent_id for k, c in clients.items()} == {"researcher": "researcher", "writer": "writer"}
    with pytest.raises(ValueError, match="duplicate"):
        clients_for(pool, ["a", "a"])


def test_the_provider_pins_its_facts_and_recalls_evicted_text_ahead_of_the_input():
    pool = ScriptedPool(["noted", "The vault password is marmalade."])
    pool.history = "user\nThe vault password is marmalade.\nassistant\nnoted\n"
    start = pool.history.index("vault")
    pool.evicted = [_Span(start, start + len("vault password"))]
    memory = AgentMemContextProvider(pool, facts=["The customer is ACME."])
    agent = Agent(client=AgentMemChatClient(pool), name="analyst", instructions="Be brief.", context_providers=[memory])
    session = agent.create_session()
    run(agent.run("What is the vault password?", session=session))
    msgs = pool.calls[0]["messages"]
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.\n" + FACTS_HEADER)
    assert ("analyst", 0, True) in pool.pins  # the facts' message is pinned in the KV
    assert msgs[-2]["role"] == "system" and msgs[-2]["content"].startswith(RECALL_HEADER)
    assert "The vault password is marmalade." in msgs[-2]["content"]
    run(agent.run("And the vault password again?", session=session))
    second = pool.calls[1]["messages"]
    assert sum(RECALL_HEADER in str(m["content"]) for m in second) == 1, "kept in the history, not recalled twice"
    assert second[: len(msgs)] == msgs, "the second prompt extends the first (the KV stays a prefix)"


def test_bad_arguments_are_refused():
    pool = ScriptedPool([])
    with pytest.raises(Exception, match="agent_id"):
        AgentMemChatClient(pool, agent_id="")
    with pytest.raises(TypeError, match="MemoryPool"):
        AgentMemChatClient(object())  # type: ignore[arg-type]
    with pytest.raises(Exception, match="k"):
        AgentMemContextProvider(pool, k=-1)


def test_public_surface():
    assert sorted(agentmem_maf.__all__) == sorted(
        ["FALLBACK_AGENT_ID", "AgentMemChatClient", "AgentMemContextProvider", "clients_for"]
    )


def test_tools_and_a_response_format_share_one_call_or_document_grammar():
    pool = ScriptedPool(['{"ok": false, "reason": "no weight asked"}'])
    client = AgentMemChatClient(pool, agent_id="judge", function_invocation_configuration={"enabled": False})
    r = run(client.get_response([Message("user", ["judge it"])],
                                options={"tools": [order_weight], "response_format": Verdict}))
    call = pool.calls[0]
    assert "tc-root" in call["grammar"] and "doc" in call["grammar"] and call["tools"]
    assert r.value == Verdict(ok=False, reason="no weight asked")


def test_a_call_without_tools_keeps_the_agents_tools_shown():
    """The prompt (and so the KV prefix) of an agent must not change when one call passes no tools."""
    pool = ScriptedPool(["a", "b"])
    client = AgentMemChatClient(pool, agent_id="clerk")
    run(client.get_response([Message("user", ["x"])], options={"tools": [order_weight]}))
    run(client.get_response([Message("user", ["x"]), Message("assistant", ["a"]), Message("user", ["y"])]))
    first, second = pool.calls
    assert second["tools"] == first["tools"] and second["canonical_calls"] is False


def test_a_closed_client_refuses_calls():
    client = AgentMemChatClient(ScriptedPool([]), agent_id="clerk")
    run(client.close())
    with pytest.raises(RuntimeError, match="closed"):
        run(client.get_response([Message("user", ["x"])]))


def test_import_without_the_agent_framework_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "agent_framework", None)
    for name in [m for m in sys.modules if m == "agentmem_maf" or m.startswith("agentmem_maf.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'agentmem-kv\[maf\]'"):
        importlib.import_module("agentmem_maf")


def test_cancelling_a_streamed_run_stops_the_generation():
    pool = ScriptedPool(["word " * 200])
    pool.slow, pool.stopped = 0.01, []
    client = AgentMemChatClient(pool, agent_id="talker", max_tokens=500)

    async def go() -> list[str]:
        seen: list[str] = []

        async def consume() -> None:
            async for u in client.get_response([Message("user", ["talk"])], stream=True):
                seen.append(u.text)

        task = asyncio.create_task(consume())
        while not seen:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):  # the worker thread closes the pool stream at its next piece
            if pool.stopped:
                break
            await asyncio.sleep(0.01)
        return seen

    seen = run(go())
    assert pool.stopped, "the pool stream was closed before its end"
    assert 0 < len(seen) < 200


def test_leaving_a_stream_early_stops_the_generation():
    pool = ScriptedPool(["word " * 200])
    pool.slow, pool.stopped = 0.01, []
    client = AgentMemChatClient(pool, agent_id="talker", max_tokens=500)

    async def go() -> None:
        async with client.get_response([Message("user", ["talk"])], stream=True) as stream:  # MAF's way to close early
            async for _ in stream:
                break
        for _ in range(200):
            if pool.stopped:
                return
            await asyncio.sleep(0.01)

    run(go())
    assert pool.stopped, "the pool stream was closed before its end"
