"""`agentmem serve` on the real bundled models, driven by the official `openai` client."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from pydantic import BaseModel  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.server import ServerSettings, create_app  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

pytestmark = pytest.mark.integration


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int


def test_agents_switch_by_restore_over_http(gemma_model_path: Path) -> None:
    """Two agents share one live sequence: every switch parks one and restores the other.

    On Gemma only (the suite's time, issue #36): the HTTP layer is the same on every model;
    Qwen2.5 over HTTP is test_native_tool_loop_reuses_the_calls_kv, its restores test_pool_real's."""
    pool = MemoryPool(str(gemma_model_path), n_ctx=4096, resident_agents=1, n_threads=1)
    try:
        with ServerThread(create_app(pool, settings=ServerSettings(model_name="gemma"))) as srv, \
                openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0) as client:
            histories: dict[str, list[dict[str, Any]]] = {
                "planner": [{"role": "system", "content": "You are a planner. Answer in one short sentence."}],
                "critic": [{"role": "system", "content": "You are a critic. Answer in one short sentence."}],
            }
            seen: dict[str, list[Any]] = {k: [] for k in histories}
            for question in ("Name one risk of a picnic.", "Name another one."):
                for agent, msgs in histories.items():
                    msgs.append({"role": "user", "content": question})
                    r = client.chat.completions.create(model="gemma", messages=msgs, user=agent, max_tokens=24)
                    msgs.append({"role": "assistant", "content": r.choices[0].message.content})
                    seen[agent].append(r)
            for agent, (first, second) in seen.items():
                assert first.choices[0].message.content.strip(), agent
                assert first.usage.prompt_tokens_details.cached_tokens == 0
                assert second.model_extra["agentmem"]["kv"] == "restored"
                assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens

            stream = client.chat.completions.create(model="gemma", messages=histories["planner"] + [
                {"role": "user", "content": "Summarize."}], user="planner", max_tokens=16, stream=True,
                stream_options={"include_usage": True})
            chunks = list(stream)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
            assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0

            r = client.chat.completions.parse(model="gemma", user="judge", response_format=Verdict, max_tokens=48,
                                              messages=[{"role": "user", "content": "Is the sky blue? Reply in JSON."}])
            assert isinstance(r.choices[0].message.parsed, Verdict)
    finally:
        pool.close()


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_native_tool_loop_reuses_the_calls_kv(instruct_model_path: Path) -> None:
    """Qwen2.5 sees its own tool prompt, calls in `<tool_call>` JSON, and the call's KV carries to the next request."""
    pool = MemoryPool(str(instruct_model_path), n_ctx=4096, resident_agents=1, n_threads=1)
    try:
        assert pool.tool_format.name == "hermes"
        with ServerThread(create_app(pool, settings=ServerSettings(model_name="qwen"))) as srv, \
                openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0) as client:
            msgs: list[Any] = [{"role": "system", "content": "You are a helpful assistant. Once a tool has "
                                "answered, reply to the user in one plain sentence."},
                               {"role": "user", "content": "What is the weather in Paris?"}]
            r = client.chat.completions.create(model="qwen", messages=msgs, user="tools", tools=[WEATHER],
                                               tool_choice="required", max_tokens=48)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls", choice
            call = choice.message.tool_calls[0]
            assert call.function.name == "get_weather" and "paris" in call.function.arguments.lower(), call
            msgs += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
            # "none": the 0.5B model, left to choose, calls the tool again rather than answer
            r2 = client.chat.completions.create(model="qwen", messages=msgs, user="tools", tools=[WEATHER],
                                                tool_choice="none", max_tokens=48)
            answer = r2.choices[0].message
            cached = r2.usage.prompt_tokens_details.cached_tokens
            first = r.usage.prompt_tokens + r.usage.completion_tokens
            assert cached >= first - 3, (cached, r.usage, r.model_extra["agentmem"])
            assert r2.model_extra["agentmem"]["kv"] == "reused"
            assert not answer.tool_calls and answer.content, answer
    finally:
        pool.close()
