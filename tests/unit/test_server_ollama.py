"""The Ollama API of `agentmem serve`, driven by the official `ollama` client and raw HTTP.

On the tiny random-weight models: these tests check the translation (tool calls without
ids, tool results by name, `format`, `options`), the shapes (NDJSON chunks, Ollama's
counters), the model routes, and errors as `{"error": ...}` 400s naming the field (never
a 500); not what the model says.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

ollama = pytest.importorskip("ollama")
pytest.importorskip("fastapi")

import httpx  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.server import KeyRing, ServerSettings, create_app  # noqa: E402
from agentmem.server.http_errors import ApiError  # noqa: E402
from agentmem.server.ollama_schemas import ChatRequest, GenerateRequest, to_chat_request, to_generate_request  # noqa: E402
from agentmem.server.call_request import ChatCallRequest, CompletionCallRequest  # noqa: E402
from tests.fixtures.serving import ServerThread, serve_model  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def server(tiny_qwen2_path: Any) -> Any:
    with serve_model(tiny_qwen2_path, "tiny-qwen2", default_max_tokens=8) as srv:
        yield srv


@pytest.fixture
def client(server: Any) -> Any:
    return ollama.Client(host=server.base_url)


def _post(server: Any, path: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", content=json.dumps(body),
                      headers={"content-type": "application/json", **headers}, timeout=60.0)


# ------------------------------------------------------------------ translation (no model)
def test_tool_calls_get_ids_and_results_pair_by_name() -> None:
    req = ChatRequest.model_validate({"tools": [WEATHER], "format": None, "options": {"num_predict": -1, "seed": 3},
                                      "messages": [
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "lookup", "arguments": '{"q": "Rome"}'}}]},
        {"role": "tool", "content": "found", "tool_name": "lookup"},
        {"role": "tool", "content": "sunny"},
    ]})
    chat = to_chat_request(req)
    got = list(chat.messages)
    assert got[1]["tool_calls"] == [
        {"id": "call_1_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_1_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "Rome"}'}}]
    assert [(m["tool_call_id"], m["content"]) for m in got[2:]] == [("call_1_1", "found"), ("call_1_0", "sunny")]
    assert chat.sampling.max_tokens is None and chat.sampling.seed == 3  # a negative num_predict: the server's default
    assert [t.name for t in chat.tools] == ["get_weather"]


def test_format_and_options() -> None:
    chat = to_chat_request(ChatRequest.model_validate({"format": "json", "options": {
        "temperature": 0, "top_k": 4, "num_predict": 7, "stop": ["\n"], "num_ctx": 99999},
        "messages": [{"role": "user", "content": "x"}]}))
    assert chat.output is not None and chat.output.kind == "json_object"
    s = chat.sampling
    assert (s.temperature, s.top_k, s.max_tokens, s.stop) == (0, 4, 7, ("\n",))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    chat = to_chat_request(ChatRequest.model_validate({"format": schema, "messages": [{"role": "user", "content": "x"}]}))
    assert chat.output is not None and chat.output.kind == "json_schema" and chat.output.schema == schema
    raw = to_generate_request(GenerateRequest.model_validate({"prompt": "abc", "raw": True}))
    assert isinstance(raw, CompletionCallRequest) and raw.prompt == "abc"
    chat = to_generate_request(GenerateRequest.model_validate({"prompt": "abc", "system": "s"}))
    assert isinstance(chat, ChatCallRequest)
    assert list(chat.messages) == [{"role": "system", "content": "s"}, {"role": "user", "content": "abc"}]


@pytest.mark.parametrize(("body", "field"), [
    ({"messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]}, "messages[0].images"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]},
     "messages[0].tool_calls[0].function.name"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"format": "yaml", "messages": [{"role": "user", "content": "x"}]}, "format"),
    ({"options": {"stop": ["", "x"]}, "messages": [{"role": "user", "content": "x"}]}, "options.stop[0]"),
])
def test_untranslatable_chat_bodies_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ApiError) as info:
        to_chat_request(ChatRequest.model_validate(body))
    assert info.value.status == 400 and info.value.param == field, (info.value.param, info.value.message)


# ------------------------------------------------------------------ the client, over HTTP
def test_chat_counters_and_kv_reuse(server: Any, client: Any) -> None:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Ollama A."}, {"role": "user", "content": "Plan a picnic."}]
    first = client.chat(model="x", messages=msgs, stream=False, options={"num_predict": 5, "temperature": 0})
    assert first.done and first.done_reason == "length" and first.eval_count == 5 and first.model == "tiny-qwen2"
    assert first.total_duration >= first.prompt_eval_duration > 0
    msgs += [{"role": "assistant", "content": first.message.content}, {"role": "user", "content": "And then?"}]
    body = _post(server, "/api/chat", {"messages": msgs, "stream": False, "options": {"num_predict": 5}}).json()
    ext = body["agentmem"]  # the client drops unknown fields: read it raw
    assert ext["line"] == "continued" and ext["agent_id"].startswith("conv-")
    assert ext["cached_tokens"] >= first.prompt_eval_count, (first, ext)
    assert body["prompt_eval_count"] == ext["prompt_tokens"] - ext["cached_tokens"] < first.prompt_eval_count


def test_chat_streams_ndjson_by_default(server: Any, client: Any) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": "Count."}], "options": {"num_predict": 4},
            "agent_id": "o-stream"}
    with httpx.stream("POST", f"{server.base_url}/api/chat", json=body, timeout=60.0) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["eval_count"] == 4 and lines[-1]["done_reason"] == "length"
    text = "".join(x["message"]["content"] for x in lines)
    whole = client.chat(model="x", messages=body["messages"], stream=False, options={"num_predict": 4})
    assert whole.message.content == text
    parts = list(client.chat(model="x", messages=body["messages"], stream=True, options={"num_predict": 4}))
    assert parts[-1].done and "".join(p.message.content or "" for p in parts) == text


def test_forced_tool_round_trip_through_the_client(server: Any, client: Any) -> None:
    """Ollama has no tool_choice: a grammar-forced call needs the agentmem-side `tool_choice` (not sent by
    the client); here the model is free, so the call is read if it makes one, and the round trip is checked
    with the client's own message shapes."""
    msgs: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat(model="x", messages=msgs, tools=[WEATHER], stream=False, options={"num_predict": 12})
    msgs.append(r.message)
    msgs.append({"role": "tool", "content": "sunny", "tool_name": "get_weather"})
    again = client.chat(model="x", messages=msgs, tools=[WEATHER], stream=False, options={"num_predict": 4})
    # the second turn evaluates only what is new: the tool result (and the reply, when it was rewritten)
    assert again.prompt_eval_count < r.prompt_eval_count, (r, again)


def test_generate_templated_raw_and_streamed(server: Any, client: Any) -> None:
    r = client.generate(model="x", prompt="Once upon", system="Story.", options={"num_predict": 4})
    assert r.done and r.eval_count == 4 and isinstance(r.response, str)
    raw = client.generate(model="x", prompt="Once upon a time", raw=True, options={"num_predict": 3})
    assert raw.eval_count == 3 and raw.prompt_eval_count > 0
    parts = list(client.generate(model="x", prompt="Once upon", system="Story.", stream=True,
                                 options={"num_predict": 4}))
    assert parts[-1].done and "".join(p.response for p in parts) == r.response
    loaded = client.generate(model="x", prompt="")
    assert loaded.done and loaded.done_reason == "load"


def test_model_routes(server: Any, client: Any) -> None:
    models = client.list().models
    assert [m.model for m in models] == ["tiny-qwen2"]
    assert models[0].size == server.pool.model_path.stat().st_size and models[0].details.format == "gguf"
    assert models[0].details.family == "qwen2"
    shown = client.show("tiny-qwen2")
    assert "tools" in shown.capabilities and "<tool_call>" in shown.template
    assert shown.modelinfo["general.architecture"] == "qwen2"
    assert client.ps().models[0].context_length == 2048
    assert httpx.get(f"{server.base_url}/api/version").json()["version"]


WIDE = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}}
"""A schema over `agentmem.tools.limits.MAX_OBJECT_PROPERTIES`: the error names the field it was sent in."""


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]}, "messages[0].images"),
    ("/api/chat", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "options": {"temperature": "hot"}},
     "options.temperature"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 10 ** 9}}, "max_tokens"),
    ("/api/chat", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
    ("/api/chat", {"messages": "hello"}, "messages"),
    ("/api/generate", {"prompt": "x", "raw": True, "format": "json"}, "format"),
    ("/api/generate", {"prompt": "x", "images": ["AAAA"]}, "images"),
    # the body's own validation names a bad tool: no second validation behind it (#32)
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "function", "function": {"name": ""}}]},
     "tools.0.function.name"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools.0.function.parameters"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "function", "function": {"name": "f", "parameters": WIDE}}]},
     "tools[0].function.parameters"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "options": {"stop": [""]}}, "options.stop[0]"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "format": WIDE},
     "format"),
    ("/api/chat", [1], None),
])
def test_hostile_bodies_are_ollama_400s_naming_the_field(server: Any, path: str, body: Any, field: str | None) -> None:
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert set(err) == {"error"} and isinstance(err["error"], str)
    if field is not None:
        assert field in err["error"], err


def test_client_raises_the_error(client: Any) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="x", messages=[{"role": "user", "content": "x", "images": [b"\x89PNG"]}], stream=False)
    assert info.value.status_code == 400 and "messages[0].images" in info.value.error


def test_keys_apply_to_the_ollama_routes(tiny_model_path: Any) -> None:
    pool = MemoryPool(str(tiny_model_path), n_ctx=1024, resident_agents=1, n_threads=1)
    app = create_app(pool, settings=ServerSettings(model_name="tiny"), keys=KeyRing.build(api_keys=["sk-right"]))
    try:
        with ServerThread(app) as srv:
            good = ollama.Client(host=srv.base_url, headers={"Authorization": "Bearer sk-right"})
            assert good.chat(model="x", messages=[{"role": "user", "content": "hi"}], stream=False,
                             options={"num_predict": 2}).eval_count == 2
            with pytest.raises(ollama.ResponseError) as info:
                ollama.Client(host=srv.base_url).list()
            assert info.value.status_code == 401
            assert httpx.get(f"{srv.base_url}/api/version").status_code == 200  # as in Ollama: no key
    finally:
        pool.close()


HOSTILE: list[Any] = [None, True, -1, 1e308, "", "\x00", [], {}, [None], [{}], {"function": []}]
PATHS = [("messages",), ("messages", 0), ("messages", 0, "content"), ("messages", 0, "role"), ("messages", 1, "tool_calls"),
         ("messages", 1, "tool_calls", 0), ("messages", 1, "tool_calls", 0, "function"),
         ("messages", 1, "tool_calls", 0, "function", "arguments"), ("messages", 2, "tool_name"), ("tools",),
         ("tools", 0, "function"), ("format",), ("options",), ("options", "num_predict"), ("options", "stop"),
         ("stream",), ("keep_alive",)]


def test_every_field_hostile_is_a_4xx_never_a_500(server: Any) -> None:
    """Each of these fields replaced by each hostile value: an `{"error": ...}` 4xx (or a 200), never a 500."""
    base = {"model": "x", "stream": False, "options": {"num_predict": 1}, "tools": [WEATHER], "agent_id": "o-sweep",
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "", "tool_calls": [
                             {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                         {"role": "tool", "content": "ok", "tool_name": "get_weather"}]}
    seen = set()
    for path in PATHS:
        for value in HOSTILE:
            body = json.loads(json.dumps(base))
            node = body
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
            r = _post(server, "/api/chat", body)
            seen.add(r.status_code)
            assert r.status_code < 500, (path, value, r.text)
            if r.status_code >= 400:
                assert set(r.json()) == {"error"}, (path, value, r.text)
    assert 400 in seen and 200 in seen
