"""agentmem_maf's translation: MAF messages, tools, tool_choice, response_format and usage ↔ agentmem's.

Pure functions, no model: what a MAF `Message` list becomes as agentmem message dicts
(calls, results named after their calls, speaker names, instructions), which tools and
choices a call's options allow, the schema a `response_format` asks for, and the usage
(cached tokens = the KV the pool reused).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("agent_framework")

from agent_framework import Content, Message, tool  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from agentmem import ChatResult, MessageError  # noqa: E402
from agentmem.pool.results import Timings, Usage  # noqa: E402
from agentmem_maf._identity import FALLBACK_AGENT_ID, resolve_agent_id, session_of  # noqa: E402
from agentmem_maf._messages import (  # noqa: E402
    call_contents,
    response_schema,
    to_agentmem_messages,
    tool_choice,
    tool_schemas,
    usage_details,
)


@tool
def order_weight(order_id: int) -> str:
    """The weight of an order in kilograms."""
    return f"{order_id * 1.5} kg"


class Verdict(BaseModel):
    ok: bool
    reason: str


def test_a_tool_round_trip_becomes_assistant_calls_and_named_tool_results():
    msgs = [
        Message("user", ["What does order 17 weigh?"], author_name="alice"),
        Message("assistant", [Content.from_function_call("c1", "order_weight", arguments='{"order_id": 17}')]),
        Message("tool", [Content.from_function_result("c1", result="25.5 kg")]),
        Message("assistant", ["It weighs 25.5 kg."], author_name="clerk"),
    ]
    out = to_agentmem_messages(msgs, "You answer questions about orders.")
    assert out == [
        {"role": "system", "content": "You answer questions about orders."},
        {"role": "user", "content": "What does order 17 weigh?", "name": "alice"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "order_weight",
                                                             "arguments": '{"order_id": 17}'}]},
        {"role": "tool", "content": "25.5 kg", "tool_call_id": "c1", "name": "order_weight"},
        {"role": "assistant", "content": "It weighs 25.5 kg."},
    ]


def test_several_results_in_one_message_are_one_tool_message_each():
    msgs = [
        Message("assistant", [Content.from_function_call("a", "f", arguments={}),
                              Content.from_function_call("b", "g", arguments={"x": 1})]),
        Message("tool", [Content.from_function_result("a", result="1"), Content.from_function_result("b", result={"y": 2})]),
    ]
    out = to_agentmem_messages(msgs)
    assert [m["role"] for m in out] == ["assistant", "tool", "tool"]
    assert [(m["name"], m["content"]) for m in out[1:]] == [("f", "1"), ("g", json.dumps({"y": 2}))]


def test_reasoning_and_usage_are_dropped_and_empty_messages_skipped():
    msgs = [
        Message("user", ["hi"]),
        Message("assistant", [Content.from_text_reasoning(text="thinking"), Content.from_text("hello"),
                              Content.from_usage({"input_token_count": 3})]),
        Message("assistant", []),
    ]
    assert to_agentmem_messages(msgs) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_instructions_as_a_list_join_into_one_system_message():
    out = to_agentmem_messages([Message("user", ["hi"])], ["Be terse.", "  ", "Pinned facts:\n- x"])
    assert out[0] == {"role": "system", "content": "Be terse.\nPinned facts:\n- x"}


@pytest.mark.parametrize(
    "messages, field",
    [
        ([Message("user", [Content.from_uri("https://example.com/a.png", media_type="image/png")])], "messages[0].contents[0]"),
        ([Message("critic", ["x"])], "messages[0].role"),
        (["not a message"], "messages[0]"),
        ([Message("tool", [Content.from_text("note"), Content.from_function_result("c", result="r")])], "messages[0]"),
        ([], "messages is empty"),
    ],
)
def test_malformed_messages_are_refused_naming_the_field(messages, field):
    with pytest.raises(MessageError, match=field.replace("[", r"\[").replace("]", r"\]")):
        to_agentmem_messages(messages)


def test_function_tools_and_dict_specs_become_schemas():
    spec = {"type": "function", "function": {"name": "ping", "description": "Ping.", "parameters": {"type": "object"}}}
    out = tool_schemas([order_weight, spec])
    assert [s["name"] for s in out] == ["order_weight", "ping"]
    assert out[0]["parameters"]["properties"]["order_id"]["type"] == "integer"
    assert out[0]["description"] == "The weight of an order in kilograms."
    assert tool_schemas(None) == []


@pytest.mark.parametrize(
    "tools, field",
    [([order_weight, order_weight], "duplicate"), ([object()], r"options.tools\[0\]"), ([{"function": {"name": ""}}], r"options.tools\[0\]")],
)
def test_bad_tools_are_refused_naming_the_field(tools, field):
    with pytest.raises(ValueError, match=field):
        tool_schemas(tools)


def test_tool_choice_modes():
    assert tool_choice(None, ["f"]) == ("auto", None)
    assert tool_choice(None, []) == ("none", None)
    assert tool_choice("required", ["f"]) == ("required", None)
    assert tool_choice({"mode": "required", "required_function_name": "f"}, ["f", "g"]) == ("required", "f")
    with pytest.raises(ValueError, match="not among the tools"):
        tool_choice({"mode": "required", "required_function_name": "h"}, ["f"])
    with pytest.raises(ValueError, match="no function tools"):
        tool_choice("required", [])
    with pytest.raises(ValueError, match="options.tool_choice"):
        tool_choice("always", ["f"])


def test_response_formats_become_schemas():
    assert response_schema(None) is None
    assert response_schema(Verdict)["properties"].keys() == {"ok", "reason"}
    assert response_schema({"type": "json_object"}) == {}
    raw = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert response_schema(raw) == raw
    assert response_schema({"type": "json_schema", "json_schema": {"name": "x", "schema": raw}}) == raw
    with pytest.raises(ValueError, match="options.response_format"):
        response_schema(42)


def test_calls_become_function_call_contents_with_fresh_ids():
    out = call_contents([("order_weight", {"order_id": 17}), ("ping", None)], "Let me look.")
    assert [c.type for c in out] == ["text", "function_call", "function_call"]
    assert out[1].name == "order_weight" and json.loads(out[1].arguments) == {"order_id": 17}
    assert json.loads(out[2].arguments) == {}
    assert out[1].call_id and out[1].call_id != out[2].call_id


def test_usage_sums_generations_and_reports_the_reused_kv_as_cached():
    def result(p: int, c: int, done: int) -> ChatResult:
        return ChatResult("a", "x", "stop", Usage(prompt_tokens=p, cached_tokens=c, completion_tokens=done), Timings(), "reused")

    u = usage_details([result(100, 80, 10), result(12, 12, 0)])
    assert u == {"input_token_count": 112, "output_token_count": 10, "total_token_count": 122,
                 "cache_read_input_token_count": 92}


class _Session:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id


def test_agent_id_rule():
    s = _Session("conv-1")
    assert resolve_agent_id("pm", s) == "pm"  # the client's agent_id (or its agent's name) first
    assert resolve_agent_id(None, s) == "conv-1"  # else the caller's session
    assert resolve_agent_id(None, None) == FALLBACK_AGENT_ID
    # a session the framework made for one run names nothing (its id is new every run)
    assert session_of({"session": s, "_approval_session_is_authoritative": False}) is None
    assert session_of({"session": s, "_approval_session_is_authoritative": True}) is s


def test_another_agents_messages_are_what_that_agent_said():
    """In a workflow the writer gets the clerk's call, result and answer: they are the clerk's words, not its own."""
    msgs = [
        Message("user", ["What does order 17 weigh?"]),
        Message("assistant", [Content.from_function_call("c1", "order_weight", arguments='{"order_id": 17}')],
                author_name="clerk"),
        Message("tool", [Content.from_function_result("c1", result="25.5 kg")], author_name="clerk"),
        Message("assistant", ["It weighs 25.5 kg."], author_name="clerk"),
        Message("assistant", ["Dear customer, 25.5 kg."], author_name="writer"),
    ]
    out = to_agentmem_messages(msgs, speaker="writer")
    assert out[1:] == [
        {"role": "user", "content": '(called order_weight({"order_id": 17}))', "name": "clerk"},
        {"role": "user", "content": "(order_weight returned: 25.5 kg)", "name": "clerk"},
        {"role": "user", "content": "It weighs 25.5 kg.", "name": "clerk"},
        {"role": "assistant", "content": "Dear customer, 25.5 kg."},
    ]
    assert to_agentmem_messages(msgs, speaker="clerk")[2]["role"] == "tool"  # the clerk's own round trip
