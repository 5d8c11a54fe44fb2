"""The OpenAI Responses API on `agentmem serve` (#25), driven by the official `openai` client on the tiny model.

The tiny model has random weights: these tests check the protocol — the translation into
a chat call, the response object and its usage, streaming events in OpenAI's order,
`previous_response_id` reading the kept KV, the store's scoping, and hostile input —
not what the model says. The translation itself is tested on its own first.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import httpx  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.server import KeyRing, ServerSettings, create_app  # noqa: E402
from agentmem.server.auth import ApiKey  # noqa: E402
from agentmem.server.responses_schemas import (  # noqa: E402
    ResponseCreateRequest,
    ResponsesInputError,
    normalize_input,
    to_chat,
)
from agentmem.server.responses_store import ResponseStore, StoredResponse  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                          "required": ["city"]}}
KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"


@pytest.fixture(scope="module")
def server(tiny_model_path: Any) -> Any:
    pool = MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=2, n_threads=1)
    keys = KeyRing([ApiKey.make(KEY_A, prefix="a/"), ApiKey.make(KEY_B, prefix="b/")])
    app = create_app(pool, settings=ServerSettings(model_name="tiny", default_max_tokens=16), keys=keys)
    with ServerThread(app) as srv:
        yield srv
    pool.close()


@pytest.fixture
def client(server: Any) -> Any:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY_A, max_retries=0) as c:
        yield c


def _chat(body: dict[str, Any], history: list[dict[str, Any]] | None = None) -> Any:
    req = ResponseCreateRequest.model_validate(body)
    return to_chat(req, [*(history or []), *normalize_input(req.input)])


# ---------------------------------------------------------------------------- translation
def test_translation_of_items_tools_and_format() -> None:
    chat = _chat({
        "instructions": "Be brief.", "max_output_tokens": 20, "temperature": 0.0, "top_p": 0.5,
        "parallel_tool_calls": False, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "developer", "content": [{"type": "input_text", "text": "Now "}, {"type": "input_text", "text": "answer."}]},
        ]})
    msgs = list(chat.messages)
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[1] == {"role": "user", "content": "Weather?"}
    assert msgs[2]["role"] == "assistant" and msgs[2]["content"] == "Checking."  # the text and its calls: one turn
    assert [c["id"] for c in msgs[2]["tool_calls"]] == ["call_1", "call_2"]
    assert msgs[2]["tool_calls"][1]["function"] == {"name": "get_weather", "arguments": '{"city":"Rome"}'}
    assert msgs[3:5] == [{"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                         {"role": "tool", "tool_call_id": "call_2", "content": "rain"}]
    assert msgs[5] == {"role": "system", "content": "Now answer."}
    assert chat.tools[0].name == "get_weather" and chat.tools[0].field == "tools[0].parameters"
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    s = chat.sampling
    assert (s.max_tokens, s.temperature, s.top_p, chat.parallel_tool_calls) == (20, 0.0, 0.5, False)


def test_string_input_json_schema_and_previous_conversation() -> None:
    history = normalize_input([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    chat = _chat({"input": "more", "text": {"format": {"type": "json_schema", "name": "pet", "strict": True,
                                                       "schema": {"type": "object"}}}}, history)
    got = [(m["role"], m["content"]) for m in chat.messages]
    assert got == [("user", "hi"), ("assistant", "hello"), ("user", "more")]
    assert chat.output is not None and chat.output.kind == "json_schema" and chat.output.schema == {"type": "object"}
    assert _chat({"input": "x", "text": {"format": {"type": "json_object"}}}).output.kind == "json_object"
    assert _chat({"input": "x", "text": {"format": {"type": "text"}}}).output is None


@pytest.mark.parametrize("body, field", [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [WEATHER, {"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[1].type"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": [{"type": "computer_call", "id": "c"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0].output"),
    ({"input": ["just a string"]}, "input[0]"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    # checked by the conversion itself: there is no second validation behind it (#32)
    ({"input": "x", "tools": [{**WEATHER, "description": 3}]}, "tools[0].description"),
    ({"input": "x", "tools": [{**WEATHER, "parameters": "x"}]}, "tools[0].parameters"),
    ({"input": "x", "tools": [{**WEATHER, "strict": "yes"}]}, "tools[0].strict"),
    ({"input": "x", "tools": [{**WEATHER, "name": "f" * 129}]}, "tools[0].name"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": 3, "schema": {}}}}, "text.format.name"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
    ({"input": "x", "stop": ["", "x"]}, "stop"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": []}, "input"),
])
def test_unsupported_input_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ResponsesInputError) as info:
        _chat(body)
    assert info.value.field == field, info.value


def test_store_is_an_lru_bounded_by_count_and_bytes() -> None:
    store = ResponseStore(max_items=2, max_bytes=10_000)

    def entry(rid: str, text: str = "x") -> StoredResponse:
        return StoredResponse({"id": rid}, [{"text": text}], 0, 0, "a")

    for rid in ("r1", "r2"):
        assert store.put("s", entry(rid))
    assert store.get("s", "r1") is not None  # r1 is now the most recently used
    store.put("s", entry("r3"))
    assert store.get("s", "r2") is None and store.get("s", "r1") is not None
    assert store.get("other", "r1") is None  # another scope
    assert not store.put("s", entry("big", "y" * 20_000))  # larger than the whole budget: not kept
    store.put("s", entry("r4", "y" * 6_000))
    store.put("s", entry("r5", "y" * 6_000))  # the bytes bound evicts r4 (and r1, r3 by count)
    assert store.stats("s")[0] == 1 and store.stats("s")[1] <= 10_000
    assert store.delete("s", "r5") and not store.delete("s", "r5") and store.stats("s") == (0, 0)


# ---------------------------------------------------------------------------- over HTTP
def test_create_get_delete_and_kv_reuse_through_previous_response_id(client: Any) -> None:
    first = client.responses.create(model="tiny", instructions="You count.", input="Count to three.",
                                    max_output_tokens=6, metadata={"run": "1"})
    assert first.object == "response" and first.id.startswith("resp_") and first.model == "tiny"
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert first.output[0].type == "message" and first.output[0].content[0].type == "output_text"
    assert first.output_text == first.output[0].content[0].text
    u = first.usage
    assert u.output_tokens == 6 and u.total_tokens == u.input_tokens + 6
    assert u.input_tokens_details.cached_tokens == 0 and u.output_tokens_details.reasoning_tokens == 0
    agent = first.model_extra["agentmem"]["agent_id"]
    assert agent.startswith("a/conv-")  # no agent named: a conversation line in the key's scope
    second = client.responses.create(model="tiny", instructions="You count.", input="Again.",
                                     previous_response_id=first.id, max_output_tokens=4)
    assert second.model_extra["agentmem"]["agent_id"] == agent and second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens >= u.input_tokens, (second.usage, u)
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.metadata == {"run": "1"}
    items = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == "Again."
    assert client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError, match="previous_response_id|no response"):
        client.responses.create(model="tiny", input="x", previous_response_id=first.id)


def test_store_false_is_not_retrievable(client: Any) -> None:
    r = client.responses.create(model="tiny", input="Hi.", store=False, max_output_tokens=2)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_a_strangers_response_is_a_404_like_an_unknown_one(server: Any, client: Any) -> None:
    mine = client.responses.create(model="tiny", input="Secret plan.", max_output_tokens=2)
    url = f"{server.base_url}/v1/responses"
    stranger = {"Authorization": f"Bearer {KEY_B}"}
    theirs = httpx.get(f"{url}/{mine.id}", headers=stranger)
    unknown = httpx.get(f"{url}/resp_{'0' * 32}", headers=stranger)
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"]["code"] == unknown.json()["error"]["code"] == "response_not_found"
    assert theirs.json()["error"]["message"].replace(mine.id, "ID") == unknown.json()["error"]["message"].replace(
        f"resp_{'0' * 32}", "ID")
    assert httpx.delete(f"{url}/{mine.id}", headers=stranger).status_code == 404
    assert httpx.get(f"{url}/{mine.id}/input_items", headers=stranger).status_code == 404
    chained = httpx.post(url, headers=stranger, json={"input": "x", "previous_response_id": mine.id})
    assert chained.status_code == 404 and chained.json()["error"]["param"] == "previous_response_id"
    assert client.responses.retrieve(mine.id).id == mine.id  # still there for its owner


def test_function_call_round_trip(client: Any) -> None:
    r = client.responses.create(model="tiny", input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                                max_output_tokens=64)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome") and calls[0].call_id
    r2 = client.responses.create(model="tiny", previous_response_id=r.id, tools=[WEATHER], tool_choice="none",
                                 input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                         "output": "sunny, 21 C"}], max_output_tokens=4)
    assert r2.output[0].type == "message"
    assert r2.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens, (r2.usage, r.usage)


def test_streaming_event_order_text(client: Any) -> None:
    events = list(client.responses.create(model="tiny", input="Say hi.", max_output_tokens=5, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == 5
    assert client.responses.retrieve(final.id).output_text == text


def test_streaming_function_call_through_the_stream_helper(client: Any) -> None:
    """`responses.stream` checks item identities between `added`, `done` and `completed` (openai ≥ 3)."""
    with client.responses.stream(model="tiny", input="Weather?", tools=[WEATHER], max_output_tokens=64,
                                 tool_choice={"type": "function", "name": "get_weather"}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[2:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done"]
    assert kinds[-1] == "response.completed"
    call = final.output[0]
    assert call.type == "function_call" and json.loads(call.arguments)["city"] in ("Paris", "Rome")


def test_sse_lines_name_their_event(server: Any) -> None:
    with httpx.stream("POST", f"{server.base_url}/v1/responses", headers={"Authorization": f"Bearer {KEY_A}"},
                      json={"input": "hi", "stream": True, "max_output_tokens": 2}) as r:
        body = r.read().decode()
    blocks = [b for b in body.split("\n\n") if b]
    for block in blocks:
        event, data = block.split("\n")
        assert event.startswith("event: ") and json.loads(data.removeprefix("data: "))["type"] == event[7:]
    assert "[DONE]" not in body


WIDE = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}}
"""A schema over `agentmem.tools.limits.MAX_OBJECT_PROPERTIES`: the error names the field it was sent in."""


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": "x", "max_output_tokens": "lots"}, "max_output_tokens"),
    ({"input": "x", "temperature": 9}, "temperature"),
    ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata.k"),
    ({"input": "x", "instructions": "\ud800"}, "instructions"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": "not a schema"}}}, "text.format.schema"),
    ({"input": "x", "max_output_tokens": 10**9}, "max_output_tokens"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 5}]}, "input[0].arguments"),
    ({"input": "x", "tools": [{**WEATHER, "parameters": WIDE}]}, "tools[0].parameters.properties"),
    ({"input": "x", "tools": [{**WEATHER, "description": ["x"]}]}, "tools[0].description"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
])
def test_hostile_requests_are_4xx_naming_the_field(server: Any, body: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{server.base_url}/v1/responses", content=json.dumps(body),  # ASCII: a lone surrogate as \\ud800
                   headers={"Authorization": f"Bearer {KEY_A}", "Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_input_items_paging_and_bad_queries(server: Any, client: Any) -> None:
    r = client.responses.create(model="tiny", max_output_tokens=1, input=[
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}, {"role": "user", "content": "three"}])
    page = client.responses.input_items.list(r.id, limit=2)  # newest first by default
    assert [i.content[0].text for i in page.data] == ["three", "two"] and page.has_more
    rest = client.responses.input_items.list(r.id, limit=2, after=page.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["one"] and not rest.has_more
    url = f"{server.base_url}/v1/responses/{r.id}/input_items"
    for query in ({"limit": 0}, {"limit": "x"}, {"order": "sideways"}, {"after": "msg_none"}):
        bad = httpx.get(url, params=query, headers={"Authorization": f"Bearer {KEY_A}"})
        assert bad.status_code == 400, (query, bad.text)


def test_agents_sdk_streamed_run_reads_the_events(server: Any) -> None:
    """The OpenAI Agents SDK's streamed run (`Runner.run_streamed`) parses the events into its items."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=KEY_A, max_retries=0)
    model = agents.OpenAIResponsesModel(model="tiny", openai_client=client)

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Weather of a city."""
        return f"{city}: sunny"

    agent = agents.Agent(name="w", model=model, tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(tool_choice="required", max_tokens=64))

    async def main() -> tuple[Any, list[str]]:
        run = agents.Runner.run_streamed(agent, "Weather?", max_turns=2)
        kinds = [e.type async for e in run.stream_events()]
        return run, kinds

    run, kinds = asyncio.run(main())
    assert run.final_output in ("Paris: sunny", "Rome: sunny")
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
