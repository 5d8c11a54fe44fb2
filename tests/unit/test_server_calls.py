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


def test_every_front_end_converts_its_body_once_into_the_same_call_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """#32: the Anthropic, Ollama and Responses adapters built OpenAI's `ChatCompletionRequest` from their
    validated bodies and validated it a second time; now each converts straight to `ChatCallRequest`."""
    from agentmem.server import anthropic_schemas, ollama_schemas, responses_schemas
    from agentmem.server.call_request import CompletionCallRequest
    from agentmem.server.schemas import CompletionRequest

    def validated_twice(*_: object, **__: object) -> None:
        raise AssertionError("a front-end validated its request a second time, as an OpenAI body")

    for wire in (ChatCompletionRequest, CompletionRequest):
        monkeypatch.setattr(wire, "model_validate", classmethod(validated_twice))
    fn = TOOL["function"]
    convs = [
        anthropic_schemas.to_chat_request(anthropic_schemas.MessagesRequest(
            max_tokens=8, messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[{"name": fn["name"], "input_schema": fn["parameters"]}], tool_choice={"type": "any"})),
        ollama_schemas.to_chat_request(ollama_schemas.ChatRequest(
            messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[TOOL], options={"num_predict": 8})),
        responses_schemas.to_chat(*(lambda r: (r, responses_schemas.normalize_input(r.input)))(
            responses_schemas.ResponseCreateRequest(input="Weather in Paris?", max_output_tokens=8,
                                                    tools=[{"type": "function", **fn}], tool_choice="required"))),
    ]
    for conv in convs:
        assert isinstance(conv, ChatCallRequest) and conv.sampling.max_tokens == 8
        assert list(conv.messages) == [{"role": "user", "content": "Weather in Paris?"}]
        plan = chat_call("a", conv, ServerSettings(), HERMES)
        assert [t["name"] for t in plan.tools or []] == ["get_weather"]
    assert [chat_call("a", c, ServerSettings(), HERMES).mode for c in convs] == ["tools", "auto", "tools"]
    raw = ollama_schemas.to_generate_request(ollama_schemas.GenerateRequest(prompt="abc", raw=True))
    assert isinstance(raw, CompletionCallRequest) and raw.prompt == "abc"
