"""`agentmem.server.calls` in each tool format: what goes to the pool and how a reply reads."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from agentmem.server.call_request import ChatCallRequest  # noqa: E402
from agentmem.server.calls import StreamHolder, chat_call, read_reply  # noqa: E402
from agentmem.server.schemas import ChatCompletionRequest  # noqa: E402
from agentmem.server.settings import ServerSettings  # noqa: E402
from agentmem.tools import get_tool_format  # noqa: E402

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
HERMES = get_tool_format("hermes")


def request(choice: str = "auto") -> ChatCallRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                 tools=[TOOL], tool_choice=choice).to_call()


def test_native_format_passes_tools_to_the_template_and_envelope_to_the_system_block() -> None:
    native = chat_call("a", request(), ServerSettings(), HERMES)
    assert [t["name"] for t in native.tools or []] == ["get_weather"]
    assert native.messages == [{"role": "user", "content": "Weather in Paris?"}]
    envelope = chat_call("a", request(), ServerSettings())
    assert envelope.tools is None and envelope.messages is not None
    assert envelope.messages[0]["role"] == "system" and "tool_calls" in envelope.messages[0]["content"]


def test_forced_native_call_opens_with_the_tool_call_tag() -> None:
    call = chat_call("a", request("required"), ServerSettings(), HERMES)
    assert call.mode == "tools" and call.prefix.startswith("<tool_call>\n{"), call.prefix
    reply = read_reply(call, call.fmt.render_call([("get_weather", {"city": "Paris"})])[len(call.prefix):])
    assert [json.loads(c["function"]["arguments"]) for c in reply.tool_calls] == [{"city": "Paris"}]
    assert reply.written_back == HERMES.render_call([("get_weather", {"city": "Paris"})])


def test_auto_native_call_in_another_shape_is_found_and_written_back_as_the_template_writes_it() -> None:
    call = chat_call("a", request(), ServerSettings(), HERMES)
    reply = read_reply(call, 'Sure.\n{"name": "get_weather", "arguments": {"city": "Rome"}}')
    assert reply.content == "Sure." and reply.tool_calls[0]["function"]["name"] == "get_weather"
    want = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert reply.written_back == want
    holder = StreamHolder(call)
    assert holder.push("<tool") == "" and holder.push("_call>") == ""  # held: a hermes call is opening
    assert read_reply(call, "Just text.").content == "Just text."
    assert read_reply(chat_call("a", request(), ServerSettings()), "Just text.").written_back is None
