"""The official `anthropic` client on `agentmem serve`, in its default set-up (only `base_url`, `api_key`).

The client (2.15) has no `temperature` argument: the server's default, 0 (greedy), applies.
No agent id, no extra header: the conversation is found by its history (`--anonymous
lines`). A tool round trip on the instruct model (the call forced by `tool_choice`, so the
0.5B model calls deterministically), whose second turn reads the first from kept KV
(`usage.cache_read_input_tokens`), and one streamed call through `client.messages.stream`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.integration

logger = logging.getLogger(__name__)

WEATHER = {"name": "get_weather", "description": "Current weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
def client(served: Any) -> Any:
    with anthropic.Anthropic(base_url=served.base_url, api_key="x", max_retries=0) as c:
        yield c


def test_tool_round_trip_reads_the_first_turn_from_kept_kv(served: Any, client: Any) -> None:
    t0 = time.perf_counter()
    system = "You are a weather assistant (anthropic client test). Use the tool."
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(model=served.model, max_tokens=32, system=system, messages=msgs,
                                   tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    use = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use, first
    assert use[0].name == "get_weather" and "paris" in str(use[0].input.get("city", "")).lower(), use
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id,
                                           "content": "18 C, sunny"}]}]
    # the same tools (they are part of the prompt), `none`: an answer in words, one decode
    second = client.messages.create(model=served.model, max_tokens=12, system=system, messages=msgs,
                                    tools=[WEATHER], tool_choice={"type": "none"})
    text = "".join(b.text for b in second.content if b.type == "text")
    first_prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    logger.info("anthropic: first %s; second %s %r; %.1f s", first.usage, second.usage, text, time.perf_counter() - t0)
    assert second.usage.cache_read_input_tokens >= first_prompt, (first.usage, second.usage)
    assert second.model_extra["agentmem"]["agent_id"] == first.model_extra["agentmem"]["agent_id"]
    assert second.stop_reason in ("end_turn", "max_tokens") and text


def test_streamed_message(served: Any, client: Any) -> None:
    msgs = [{"role": "user", "content": "Name one fruit. One word."}]
    with client.messages.stream(model=served.model, max_tokens=8, messages=msgs,
                                system="You answer briefly (anthropic stream test).") as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    logger.info("anthropic stream: %r, %s", pieces, final.usage)
    assert pieces and "".join(pieces) == final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens > 10
