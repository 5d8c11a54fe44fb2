"""A free tool call on Qwen2.5 is kept in the KV as its template renders it back (issue 16).

Before: with `tools=` and no forcing, Qwen2.5-Coder-0.5B wrote its call as a bare
`{"name": ..., "arguments": ...}` object; the next call, which carries the call back
inside `<tool_call>` tags, kept only the prompt (257 of 302 tokens on this exchange) and
prefilled the whole call again. Now the pool writes the opening into the KV as the call
starts and completes its closing, so the next call reuses every token of the reply.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmem import MemoryPool

pytestmark = pytest.mark.integration

TOOLS = [
    {"name": "lookup_metric", "description": "Look up the current value of a named service metric.",
     "parameters": {"type": "object", "properties": {"metric": {"type": "string"}}, "required": ["metric"]}},
    {"name": "send_email", "description": "Send an email to a person.",
     "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                    "required": ["to", "body"]}},
]
MSGS = [
    {"role": "system", "content": "You are a helpful assistant. Use the tools when useful."},
    {"role": "user", "content": "What is the current value of the metric p99_latency_ms? Use the tool."},
]


def test_the_call_after_a_free_tool_call_reuses_the_whole_call(instruct_model_path: Path) -> None:
    with MemoryPool(instruct_model_path, n_ctx=1024, resident_agents=1, n_threads=1) as pool:
        r1 = pool.chat("a", MSGS, tools=TOOLS, max_tokens=48)
        calls = pool.tool_format.parse(r1.text)
        assert calls and calls[0].ok and calls[0].name == "lookup_metric", r1.text
        assert r1.text == pool.tool_format.render_call([(c.name, c.arguments) for c in calls]), r1.text
        follow = [*MSGS,
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c1", "type": "function",
                       "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]},
                  {"role": "tool", "tool_call_id": "c1", "content": "412"}]
        r2 = pool.chat("a", follow, tools=TOOLS, max_tokens=1)
        # every token of the first call (prompt + reply) is reused; only the tool turn is new
        assert r2.usage.cached_tokens == r1.usage.prompt_tokens + r1.usage.completion_tokens, (r1.usage, r2.usage)
        assert pool.stats()["totals"]["canonical_calls"] == 1


def test_a_streamed_free_call_through_langchain_is_a_tool_call_only(instruct_model_path: Path) -> None:
    """Before: the bare object streamed out as content chunks, then the call was redone under the grammar."""
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import tool

    from agentmem_langchain import ChatAgentMem

    @tool
    def lookup_metric(metric: str) -> str:
        """Look up the current value of a named service metric."""
        return "412"

    with MemoryPool(instruct_model_path, n_ctx=1024, resident_agents=1, n_threads=1) as pool:
        model = ChatAgentMem(pool=pool, agent_id="s", max_tokens=48).bind_tools([lookup_metric])
        chunks = list(model.stream([SystemMessage(MSGS[0]["content"]), HumanMessage(MSGS[1]["content"])]))
        full = chunks[0]
        for c in chunks[1:]:
            full = full + c
        assert not [c.content for c in chunks if c.content], "no call text leaks out as content"
        assert [c["name"] for c in full.tool_calls] == ["lookup_metric"], full
        assert not full.response_metadata.get("retried_with_grammar"), full.response_metadata
        assert pool.stats()["totals"]["calls"] == 1  # no redo, no write-back call


def test_the_call_after_a_forced_call_through_langchain_reuses_the_whole_call(instruct_model_path: Path) -> None:
    """A call forced by name (`tool_choice`) is sent back as `tool_calls`; its KV must be what that renders.

    Before: the forced prefix went into the prompt as assistant-message text (`<tool_call>`
    as text tokens), and the next call re-prefilled the whole call (it kept the prompt + 3
    of 45 new tokens on the tools app).
    """
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    from agentmem_langchain import ChatAgentMem

    @tool
    def lookup_metric(metric: str) -> str:
        """Look up the current value of a named service metric."""
        return "412"

    with MemoryPool(instruct_model_path, n_ctx=1024, resident_agents=1, n_threads=1) as pool:
        chat = ChatAgentMem(pool=pool, agent_id="f", max_tokens=48)
        msgs = [SystemMessage(MSGS[0]["content"]), HumanMessage(MSGS[1]["content"])]
        ai = chat.bind_tools([lookup_metric], tool_choice="lookup_metric").invoke(msgs)
        assert [c["name"] for c in ai.tool_calls] == ["lookup_metric"], ai
        u1 = ai.usage_metadata
        assert u1 is not None
        after = chat.bind_tools([lookup_metric]).invoke(
            [*msgs, ai, ToolMessage("412", tool_call_id=ai.tool_calls[0]["id"])], max_tokens=1)
        u2 = after.usage_metadata
        assert u2 is not None
        # the prompt (which ends with the forced opening) and every token of the call are reused
        assert u2["input_token_details"]["cache_read"] >= u1["input_tokens"] + u1["output_tokens"], (u1, u2)
