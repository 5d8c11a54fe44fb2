"""The Anthropic Messages API of `agentmem serve`, driven by the official `anthropic` client and raw HTTP.

On the tiny random-weight models: these tests check the translation (system, blocks,
tools, tool_choice), the shapes (message, usage, stream events in Anthropic's order),
errors in Anthropic's shape (400 naming the field, never a 500) and auth by `x-api-key`,
not what the model says.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")
pytest.importorskip("fastapi")

import httpx  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.server import KeyRing, ServerSettings, create_app  # noqa: E402
from agentmem.server.anthropic_schemas import MessagesRequest, to_chat_request  # noqa: E402
from agentmem.server.http_errors import ApiError  # noqa: E402
from tests.fixtures.serving import ServerThread, serve_model  # noqa: E402

WEATHER = {"name": "get_weather", "description": "Weather of a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def server(tiny_qwen2_path: Any) -> Any:
    with serve_model(tiny_qwen2_path, "tiny-qwen2", default_max_tokens=16) as srv:
        yield srv


@pytest.fixture
def client(server: Any) -> Any:
    with anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


def _post(server: Any, body: Any, path: str = "/v1/messages", **headers: str) -> httpx.Response:
    """`body` as ASCII JSON (a lone surrogate goes as `\\ud800`, as a hostile client may send it)."""
    return httpx.post(f"{server.base_url}{path}", content=json.dumps(body),
                      headers={"content-type": "application/json", **headers}, timeout=60.0)


# ------------------------------------------------------------------ translation (no model)
def test_blocks_translate_to_chat_messages_in_order() -> None:
    req = MessagesRequest.model_validate({
        "max_tokens": 8, "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
        "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "...", "signature": "s"},
                                              {"type": "text", "text": "Checking."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "sunny"}]},
                                         {"type": "text", "text": "And Rome?"}]},
        ], "stop_sequences": ["\n\n"], "top_k": 5, "metadata": {"user_id": "user-1"}})
    chat = to_chat_request(req)
    got = list(chat.messages)
    assert got == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "And Rome?"},
    ]
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert chat.parallel_tool_calls is False and chat.sampling.stop == ("\n\n",) and chat.sampling.top_k == 5
    assert chat.sampling.max_tokens == 8
    assert chat.user is None  # metadata.user_id is an end user, not a conversation: not an agent id
    assert chat.tools[0].parameters == WEATHER["input_schema"] and chat.tools[0].field == "tools[0].input_schema"


@pytest.mark.parametrize(("choice", "want"), [({"type": "auto"}, "auto"), ({"type": "any"}, "required"),
                                              ({"type": "none"}, "none")])
def test_tool_choice_types(choice: dict[str, Any], want: str) -> None:
    req = MessagesRequest.model_validate({"max_tokens": 4, "tools": [WEATHER], "tool_choice": choice,
                                          "messages": [{"role": "user", "content": "hi"}]})
    assert to_chat_request(req).tool_choice == want


@pytest.mark.parametrize(("content", "field"), [
    ([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}],
     "messages[0].content[0].type"),
    ([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}],
     "messages[0].content[0].content[0].type"),
    ([{"type": "tool_result", "content": "x"}], "messages[0].content[0].tool_use_id"),
    ([{"type": "text", "text": 3}], "messages[0].content[0].text"),
    ([{"type": "tool_use", "id": "t", "name": "f", "input": {}}], "messages[0].content[0].type"),
    ([{"type": "bogus"}], "messages[0].content[0].type"),
])
def test_untranslatable_blocks_name_the_field(content: list[Any], field: str) -> None:
    req = MessagesRequest.model_validate({"max_tokens": 4, "messages": [{"role": "user", "content": content}]})
    with pytest.raises(ApiError) as info:
        to_chat_request(req)
    assert info.value.status == 400 and info.value.param == field, (info.value.param, info.value.message)


# ------------------------------------------------------------------ the client, over HTTP
def test_message_shape_and_kv_reuse(client: Any) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Plan a picnic."}]
    first = client.messages.create(model="x", max_tokens=6, system="You plan.", messages=msgs,
                                   extra_headers={"X-Agent-Id": "a-planner"})
    assert first.type == "message" and first.role == "assistant" and first.id.startswith("msg_")
    assert first.model == "tiny-qwen2" and first.stop_reason in ("max_tokens", "end_turn")
    assert [b.type for b in first.content] == ["text"]
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_creation_input_tokens == 0
    assert first.model_extra["agentmem"]["agent_id"] == "a-planner"
    msgs += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "And then?"}]
    second = client.messages.create(model="x", max_tokens=6, system="You plan.", messages=msgs,
                                    extra_headers={"X-Agent-Id": "a-planner"})
    assert second.usage.cache_read_input_tokens >= first.usage.input_tokens, (first.usage, second.usage)
    assert second.model_extra["agentmem"]["kv"] == "reused"


def test_without_an_agent_id_the_history_finds_its_conversation(client: Any) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Count sheep, line by line."}]
    first = client.messages.create(model="x", max_tokens=4, system="Anonymous A.", messages=msgs)
    agent = first.model_extra["agentmem"]["agent_id"]
    assert agent.startswith("conv-")
    msgs += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "More."}]
    second = client.messages.create(model="x", max_tokens=4, system="Anonymous A.", messages=msgs)
    assert second.model_extra["agentmem"]["agent_id"] == agent and second.model_extra["agentmem"]["line"] == "continued"
    assert second.usage.cache_read_input_tokens >= first.usage.input_tokens


def test_forced_tool_use_round_trip(client: Any) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.messages.create(model="x", max_tokens=40, messages=msgs, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "get_weather"}, extra_headers={"X-Agent-Id": "a-tool"})
    assert r.stop_reason == "tool_use"
    use = [b for b in r.content if b.type == "tool_use"]
    assert len(use) >= 1 and use[0].id.startswith("toolu_") and use[0].name == "get_weather"
    assert use[0].input["city"] in ("Paris", "Rome")  # the grammar: the enum
    msgs += [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "sunny"} for u in use]}]
    again = client.messages.create(model="x", max_tokens=4, messages=msgs, tools=[WEATHER],
                                   tool_choice={"type": "none"}, extra_headers={"X-Agent-Id": "a-tool"})
    assert again.usage.cache_read_input_tokens >= r.usage.input_tokens + r.usage.output_tokens - 2, (r.usage, again.usage)


def test_stream_events_in_anthropic_order(server: Any) -> None:
    body = {"model": "x", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "Count."}]}
    with httpx.stream("POST", f"{server.base_url}/v1/messages", json=body, headers={"X-Agent-Id": "a-stream"},
                      timeout=60.0) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = "".join(r.iter_text())
    events = [block.split("\n") for block in raw.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in events]
    datas = [json.loads(lines[1].removeprefix("data: ")) for lines in events]
    assert all(d["type"] == n for n, d in zip(names, datas))
    assert names[:3] == ["message_start", "content_block_start", "ping"], names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert set(names[3:-3]) <= {"content_block_delta"}
    assert datas[-2]["usage"]["output_tokens"] == 5 and datas[-2]["delta"]["stop_reason"] == "max_tokens"
    whole = httpx.post(f"{server.base_url}/v1/messages", json={**body, "stream": False},
                       headers={"X-Agent-Id": "a-stream-2"}, timeout=60.0).json()
    assert "".join(d["delta"]["text"] for d in datas if d["type"] == "content_block_delta") == whole["content"][0]["text"]


def test_client_stream_of_a_tool_call(client: Any) -> None:
    with client.messages.stream(model="x", max_tokens=40, messages=[{"role": "user", "content": "Rome?"}],
                                tools=[WEATHER], tool_choice={"type": "any"},
                                extra_headers={"X-Agent-Id": "a-stream-tool"}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds and kinds[-1] == "message_stop"
    assert final.stop_reason == "tool_use" and final.content[-1].type == "tool_use"
    assert final.content[-1].input["city"] in ("Paris", "Rome")
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0


def test_count_tokens(client: Any) -> None:
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    n = client.messages.count_tokens(model="x", messages=msgs, tools=[WEATHER]).input_tokens
    r = client.messages.create(model="x", max_tokens=1, messages=msgs, tools=[WEATHER], tool_choice={"type": "none"},
                               extra_headers={"X-Agent-Id": "a-count"})
    assert n == r.usage.input_tokens + r.usage.cache_read_input_tokens


WIDE = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}}
"""A schema over `agentmem.tools.limits.MAX_OBJECT_PROPERTIES`: the error names the field it was sent in."""


@pytest.mark.parametrize(("body", "field"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": True, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"max_tokens": 4, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]}, "temperature"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 4, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"},
      "messages": [{"role": "user", "content": "x"}]}, "tool_choice.name"),
    ({"max_tokens": 4, "tool_choice": {"type": "maybe"}, "messages": [{"role": "user", "content": "x"}]},
     "tool_choice.type"),
    ({"max_tokens": 4, "system": [{"type": "image"}], "messages": [{"role": "user", "content": "x"}]}, "system[0].type"),
    ({"max_tokens": 4, "tools": [{**WEATHER, "type": "web_search_20250305"}],
      "messages": [{"role": "user", "content": "x"}]}, "tools[0].type"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
    ({"max_tokens": 4, "stop_sequences": ["ok", ""], "messages": [{"role": "user", "content": "x"}]},
     "stop_sequences[1]"),
    ({"max_tokens": 4, "tools": [{**WEATHER, "input_schema": WIDE}],
      "messages": [{"role": "user", "content": "x"}]}, "tools[0].input_schema"),
    ({"max_tokens": 4, "output_config": {"format": {"type": "json_schema", "schema": WIDE}},
      "messages": [{"role": "user", "content": "x"}]}, "output_config.format.schema"),
    ([1, 2], None),
])
def test_hostile_bodies_are_anthropic_400s_naming_the_field(server: Any, body: Any, field: str | None) -> None:
    r = _post(server, body, **{"X-Agent-Id": "a-hostile"})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    if field is not None:
        assert field in err["error"]["message"], err


def test_client_errors_are_typed(client: Any) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert "messages[0].content[0].type" in str(info.value)


def test_x_api_key_is_accepted_and_a_wrong_key_is_an_anthropic_401(tiny_model_path: Any) -> None:
    pool = MemoryPool(str(tiny_model_path), n_ctx=1024, resident_agents=1, n_threads=1)
    app = create_app(pool, settings=ServerSettings(model_name="tiny"), keys=KeyRing.build(api_keys=["sk-right"]))
    try:
        with ServerThread(app) as srv:
            with anthropic.Anthropic(base_url=srv.base_url, api_key="sk-right", max_retries=0) as good:
                r = good.messages.create(model="x", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
                assert r.usage.output_tokens == 2
            with anthropic.Anthropic(base_url=srv.base_url, api_key="sk-wrong", max_retries=0) as bad:
                with pytest.raises(anthropic.AuthenticationError) as info:
                    bad.messages.create(model="x", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
            assert info.value.body["error"]["type"] == "authentication_error"
    finally:
        pool.close()


def test_output_config_format_is_a_json_schema(client: Any) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    req = MessagesRequest.model_validate({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                                          "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    chat = to_chat_request(req)
    assert chat.output is not None and chat.output.kind == "json_schema" and chat.output.schema == schema
    r = client.messages.create(model="x", max_tokens=24, messages=[{"role": "user", "content": "ok?"}],
                               output_config={"format": {"type": "json_schema", "schema": schema}},
                               extra_headers={"X-Agent-Id": "a-json"})
    if r.stop_reason == "end_turn":  # the grammar: a finished reply is JSON of the schema
        assert isinstance(json.loads(r.content[0].text)["ok"], bool)
    bad = MessagesRequest.model_validate({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                                          "output_config": {"format": {"type": "yaml"}}})
    with pytest.raises(ApiError) as info:
        to_chat_request(bad)
    assert info.value.param == "output_config.format.type"


def test_a_forced_choice_writes_one_call_and_auto_may_write_several() -> None:
    """Regression: `{"type": "tool"}` with Anthropic's default (parallel calls allowed) let the 0.5B model
    repeat `<tool_call>` blocks under the grammar until max_tokens, and the reply came back as text."""
    def parallel(choice: dict[str, Any]) -> bool | None:
        req = MessagesRequest.model_validate({"max_tokens": 4, "tools": [WEATHER], "tool_choice": choice,
                                              "messages": [{"role": "user", "content": "hi"}]})
        return to_chat_request(req).parallel_tool_calls

    assert parallel({"type": "tool", "name": "get_weather"}) is False and parallel({"type": "any"}) is False
    assert parallel({"type": "auto"}) is True and parallel({"type": "auto", "disable_parallel_tool_use": True}) is False


HOSTILE: list[Any] = [None, True, -1, 1e308, "", "\x00", [], {}, [None], [{}], {"type": []}, [{"type": ["text"]}]]
PATHS = [("system",), ("messages",), ("messages", 0), ("messages", 0, "content"), ("messages", 0, "content", 0),
         ("messages", 0, "content", 0, "type"), ("messages", 0, "content", 0, "text"), ("messages", 1, "content", 0, "input"),
         ("messages", 1, "content", 0, "id"), ("messages", 2, "content", 0, "content"),
         ("messages", 2, "content", 0, "tool_use_id"), ("messages", 2, "content", 0, "is_error"), ("tools",),
         ("tools", 0, "input_schema"), ("tool_choice",), ("tool_choice", "type"), ("stop_sequences",), ("metadata",),
         ("max_tokens",), ("output_config",), ("top_k",)]


def _replaced(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def test_every_field_hostile_is_a_4xx_never_a_500(server: Any) -> None:
    """Each of these fields replaced by each hostile value: an Anthropic-shaped 4xx (or a 200), never a 500."""
    base = {"model": "x", "max_tokens": 1, "system": "s", "tools": [WEATHER], "tool_choice": {"type": "auto"},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                            "input": {"city": "Paris"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}
    seen = set()
    for path in PATHS:
        for value in HOSTILE:
            r = _post(server, _replaced(base, path, value), **{"X-Agent-Id": "a-sweep"})
            seen.add(r.status_code)
            assert r.status_code < 500, (path, value, r.text)
            if r.status_code >= 400:
                assert r.json()["type"] == "error", (path, value, r.text)
    assert 400 in seen and 200 in seen


def test_stop_sequence_is_reported_with_the_one_that_matched(client: Any) -> None:
    msgs = [{"role": "user", "content": "Write on."}]
    free = client.messages.create(model="x", max_tokens=12, messages=msgs, extra_headers={"X-Agent-Id": "a-stop-1"})
    text = free.content[0].text
    stop = text[len(text) // 2:][:3]
    if not stop.strip():
        pytest.skip(f"the tiny model's text has no usable middle: {text!r}")
    r = client.messages.create(model="x", max_tokens=12, messages=msgs, stop_sequences=["\x01never", stop],
                               extra_headers={"X-Agent-Id": "a-stop-2"})
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop, (text, stop, r)
    assert r.content[0].text == text[: text.index(stop)]


def test_an_error_after_the_first_event_is_an_error_event() -> None:
    from agentmem.server.anthropic_routes import _stream_error

    (chunk,) = _stream_error(RuntimeError("boom"))
    name, data = chunk.decode().strip().split("\n")
    assert name == "event: error"
    body = json.loads(data.removeprefix("data: "))
    assert body["type"] == "error" and body["error"]["type"] == "api_error"


def test_a_body_that_is_not_json_is_a_400(server: Any) -> None:
    """Regression (fuzz): bytes that are not UTF-8 JSON raised FastAPI's HTTPException, answered as a 500."""
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/api/chat", "/api/generate", "/api/show"):
        r = httpx.post(f"{server.base_url}{path}", content=b"\x80", headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, r.status_code, r.text)
