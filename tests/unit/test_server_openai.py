"""`agentmem serve` driven by the official `openai` client, over real HTTP, on the tiny model.

The tiny model has random weights: these tests check the protocol (shapes, usage,
per-agent KV reuse, streaming, tools and structured output under grammars, errors),
not what the model says.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import httpx  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.server import ServerSettings, create_app  # noqa: E402
from tests.fixtures.serving import ServerThread, serve_model  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                       "required": ["city"]},
    },
}


class Pet(BaseModel):
    kind: Literal["cat", "dog"]
    friendly: bool


@pytest.fixture(scope="module")
def server(tiny_model_path: Any) -> Any:
    with serve_model(tiny_model_path, "tiny", default_max_tokens=16) as srv:
        yield srv


@pytest.fixture
def client(server: Any) -> Any:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_and_health(server: Any, client: Any) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}


def test_metrics_label_the_one_model_and_nothing_else(server: Any, client: Any) -> None:
    """With one model the call series only gain `model="tiny"`, whatever model a request names."""
    r = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], user="metrics-1",
                                       max_tokens=2)
    assert r.model == "tiny" and httpx.get(f"{server.base_url}/health").status_code == 200
    text = httpx.get(f"{server.base_url}/metrics").text
    assert 'agentmem_requests_total{model="tiny",route="/v1/chat/completions",status="200"}' in text
    assert 'agentmem_requests_total{model="tiny",route="/health",status="200"}' in text
    assert 'llamacpp:prompt_tokens_total{model="tiny"}' in text
    assert 'agentmem_prompt_tokens_cached_total{model="tiny"}' in text
    assert 'agentmem_ttft_seconds_count{kv="prefilled",model="tiny"}' in text
    assert "gpt-4o" not in text and 'model=""' not in text
    assert "\nagentmem_client_disconnects_total " in text  # server-wide: no label


def test_chat_reuses_the_agents_kv_across_calls(client: Any) -> None:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You plan."}, {"role": "user", "content": "Plan a picnic."}]
    first = client.chat.completions.create(model="tiny", messages=msgs, user="planner", max_tokens=8)
    assert first.object == "chat.completion" and first.model == "tiny"
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert first.usage.completion_tokens == 8 and first.choices[0].finish_reason == "length"
    assert first.model_extra["agentmem"]["kv"] == "prefilled"
    msgs += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "And then?"}]
    second = client.chat.completions.create(model="tiny", messages=msgs, user="planner", max_tokens=8)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens, (cached, first.usage)
    assert second.model_extra["agentmem"]["kv"] == "reused"


def test_identity_order_header_then_user_then_extension(server: Any, client: Any) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, user="u-agent", max_tokens=2,
                                       extra_headers={"X-Agent-Id": "h-agent"}, extra_body={"agent_id": "x-agent"})
    assert r.model_extra["agentmem"]["agent_id"] == "h-agent"
    r = client.chat.completions.create(model="tiny", messages=msgs, user="u-agent", max_tokens=2, extra_body={"agent_id": "x"})
    assert r.model_extra["agentmem"]["agent_id"] == "u-agent"
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, extra_body={"agent_id": "x-agent"})
    assert r.model_extra["agentmem"]["agent_id"] == "x-agent"


def test_no_agent_is_served_by_a_conversation_line(client: Any) -> None:
    """#25: with no agent named the default (`--anonymous lines`) gives the conversation a derived id
    (the 400 `missing_agent_id` is now `--anonymous reject`: tests/unit/test_conversation_lines.py)."""
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.model_extra["agentmem"]["agent_id"].startswith("conv-")
    assert r.model_extra["agentmem"]["line"] in ("new", "branched")


def test_streaming_with_usage(client: Any) -> None:
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Count."}], user="streamer", max_tokens=6, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    again = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Count."}],
                                           user="streamer-2", max_tokens=6)
    assert again.choices[0].message.content == text  # greedy: the same text streamed or not


def test_stop_and_max_completion_tokens(client: Any) -> None:
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], user="stopper",
                                       max_completion_tokens=3, max_tokens=50)
    assert r.usage.completion_tokens == 3
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], user="stopper2",
                                       max_tokens=20, stop=[" "], temperature=0.7, top_p=0.9, seed=7)
    assert " " not in r.choices[0].message.content


def test_async_clients_run_agents_concurrently(server: Any) -> None:
    async def main() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0) as c:
            calls = [c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"hi {i}"}],
                                               user=f"async-{i}", max_tokens=8) for i in range(3)]
            return await asyncio.gather(*calls)

    results = asyncio.run(main())
    assert sorted(r.model_extra["agentmem"]["agent_id"] for r in results) == ["async-0", "async-1", "async-2"]
    assert all(r.usage.completion_tokens == 8 for r in results)


def test_async_streaming(server: Any) -> None:
    async def main() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0) as c:
            stream = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go"}],
                                                     user="async-stream", max_tokens=4, stream=True)
            return [chunk async for chunk in stream]

    chunks = asyncio.run(main())
    assert chunks[-1].choices[0].finish_reason == "length"


def test_forced_tool_call_and_tool_loop(client: Any) -> None:
    msgs: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, user="tooler", tools=[WEATHER],
                                       tool_choice="required", max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    r2 = client.chat.completions.create(model="tiny", messages=msgs, user="tooler", tools=[WEATHER],
                                        tool_choice="none", max_tokens=6)
    assert r2.choices[0].finish_reason == "length" and not r2.choices[0].message.tool_calls
    # the whole first prompt (tools block included) stays cached through the tool loop
    p0 = client.chat.completions.create(model="tiny", messages=msgs[:1], user="tooler-ref", tools=[WEATHER],
                                        tool_choice="none", max_tokens=1).usage.prompt_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens >= p0, (r2.usage, p0)


def test_named_tool_call_streams_as_tool_call_chunks(client: Any) -> None:
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather?"}], user="tool-stream", tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=64, stream=True,
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Rome")
    assert not "".join(d.content or "" for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_unknown_tool_choice_is_400(client: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], user="t",
                                       tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})


def test_structured_output_parse(client: Any) -> None:
    r = client.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "A pet?"}], user="typed",
                                      response_format=Pet, max_tokens=64)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "JSON?"}], user="typed-2",
                                       response_format={"type": "json_object"}, max_tokens=64)
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_legacy_completions(client: Any) -> None:
    r = client.completions.create(model="tiny", prompt="Once upon a time", user="writer", max_tokens=5)
    assert r.object == "text_completion" and r.usage.completion_tokens == 5
    r2 = client.completions.create(model="tiny", prompt="Once upon a time" + r.choices[0].text + " and", user="writer",
                                   max_tokens=5)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1
    chunks = list(client.completions.create(model="tiny", prompt="Hello", user="writer-2", max_tokens=3, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"


def test_bad_messages_are_400_not_500(client: Any) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "tool", "content": "x"}], user="bad")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "robot", "content": "x"}], user="bad")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[], user="bad")
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], user="bad", n=2)
    with pytest.raises(openai.BadRequestError, match="reserved prefix"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], user="share:brief")


def test_context_overflow_is_400_context_length_exceeded(client: Any) -> None:
    long = "word " * 3000
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}], user="overflow")
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:  # streaming: an HTTP error too, not a broken stream
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}], user="overflow",
                                       stream=True)
    assert info.value.code == "context_length_exceeded"


@pytest.fixture(scope="module")
def qwen_client(tiny_qwen2_path: Any) -> Any:
    pool = MemoryPool(str(tiny_qwen2_path), n_ctx=2048, resident_agents=1, n_threads=1)
    app = create_app(pool, settings=ServerSettings(model_name="tiny-qwen2", default_max_tokens=16))
    with ServerThread(app) as srv, openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0) as c:
        c.pool = pool
        yield c
    pool.close()


def test_native_tool_call_on_qwen_template_carries_its_kv_to_the_next_request(qwen_client: Any) -> None:
    """Qwen2.5's template shows the tools itself and the call is `<tool_call>` JSON, re-rendered as generated."""
    pool = qwen_client.pool
    assert pool.tool_format.name == "hermes"
    msgs: list[Any] = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Paris?"}]
    r = qwen_client.chat.completions.create(model="tiny-qwen2", messages=msgs, user="native", tools=[WEATHER],
                                            tool_choice="required", max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    kept = pool.engine().model.detokenize(pool.tokens("native"))
    assert "<tools>" in kept and '{"tool_calls"' not in kept, kept  # the template's own tool prompt
    assert "<tool_call>\n{" in kept, kept
    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    r2 = qwen_client.chat.completions.create(model="tiny-qwen2", messages=msgs, user="native", tools=[WEATHER],
                                             tool_choice="none", max_tokens=4)
    assert not r2.choices[0].message.tool_calls
    cached = r2.usage.prompt_tokens_details.cached_tokens
    first = r.usage.prompt_tokens + r.usage.completion_tokens
    assert cached >= first - 3, (cached, r.usage, r.model_extra["agentmem"])


def test_native_named_tool_call_streams_as_tool_call_chunks(qwen_client: Any) -> None:
    stream = qwen_client.chat.completions.create(
        model="tiny-qwen2", messages=[{"role": "user", "content": "Weather?"}], user="native-stream", tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=64, stream=True,
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Rome")
    assert not "".join(d.content or "" for d in deltas)  # the <tool_call> text is never shown
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
