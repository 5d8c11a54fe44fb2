"""Clients that default to the OpenAI Responses API, against `agentmem serve` on the instruct model (#25).

Each client runs in its default set-up, only `base_url` and `api_key` changed: the
official `openai` client (`client.responses.create`), the OpenAI Agents SDK, pydantic-ai's
default OpenAI model and Microsoft Agent Framework's `OpenAIChatClient`. Each does a tool
round trip where the model calls the tool, then a second turn whose history is read
from kept KV (`cached_tokens`, or the agent's counters in `GET /agents`). Which endpoint
each client used is read from the server's own request counter (`/metrics`).

The 0.5B model is weak: prompts name the tool, `tool_choice` forces the call where the
client lets a single step force it, sampling is greedy and replies short.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import pytest

openai = pytest.importorskip("openai")

import httpx  # noqa: E402

from tests.integration.clients.conftest import Served  # noqa: E402

pytestmark = pytest.mark.integration

logger = logging.getLogger(__name__)

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
           "strict": True}
_SERIES = re.compile(r'^agentmem_requests_total\{model="[^"]*",route="([^"]+)",status="(\d+)"\} ([0-9.e+]+)$', re.M)


def get_weather_text(city: str) -> str:
    """What every test's tool answers."""
    return f"{city}: sunny, 21 C"


def _routes(served: Served) -> dict[str, int]:
    """Requests answered so far, per `route status` (the server's `agentmem_requests_total`)."""
    text = httpx.get(f"{served.base_url}/metrics", timeout=30.0).text
    out: dict[str, int] = {}
    for r, s, n in _SERIES.findall(text):  # summed over the `model` label (one model here)
        if r.startswith("/v1/"):
            out[f"{r} {s}"] = out.get(f"{r} {s}", 0) + int(float(n))
    return out


def _sent(served: Served, before: dict[str, int], who: str) -> dict[str, int]:
    """The requests sent since `before` (`_routes`), logged as what `who` sent."""
    after = _routes(served)
    sent = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    logger.info("%s sent: %s", who, sent)
    return sent


def _agent(served: Served, agent_id: str) -> dict[str, Any]:
    return next(a for a in served.agents() if a["id"] == agent_id)


def test_openai_client_function_call_then_output_with_previous_response_id(served: Served) -> None:
    before = _routes(served)
    client = openai.OpenAI(base_url=served.v1, api_key="unused", max_retries=0, timeout=300.0)
    instructions = "You are a weather assistant. Use the get_weather tool, then answer in one short sentence."
    first = client.responses.create(model=served.model, instructions=instructions, input="What is the weather in Paris?",
                                    tools=[WEATHER], tool_choice="required", temperature=0, max_output_tokens=48)
    calls = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1, first.output
    assert calls[0].name == "get_weather" and "paris" in json.loads(calls[0].arguments)["city"].lower()
    second = client.responses.create(
        model=served.model, instructions=instructions, previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": get_weather_text("Paris")}],
        tool_choice="none", temperature=0, max_output_tokens=16)  # the tools stay shown: the prompt's prefix holds
    u1, u2 = first.usage, second.usage
    logger.info("openai: turn 1 %s, turn 2 %s, text %r", u1, u2, second.output_text)
    assert second.model_extra["agentmem"]["agent_id"] == first.model_extra["agentmem"]["agent_id"]
    # the second prompt is the first, the call and its output: the first turn's prompt is all cached
    assert u2.input_tokens_details.cached_tokens >= u1.input_tokens + u1.output_tokens - 2, (u1, u2)
    assert second.output_text.strip()
    assert _sent(served, before, "openai") == {"/v1/responses 200": 2}


def test_openai_agents_sdk_tool_round_trip_and_second_run(served: Served) -> None:
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    before = _routes(served)
    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=served.v1, api_key="unused", max_retries=0,
                                                 timeout=300.0), use_for_tracing=False)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return get_weather_text(city)

    # run 1 forces the call and stops on it (one model call); run 2 sends the call's output back
    # with the whole history, as the SDK always does (no previous_response_id unless asked)
    agent = Agent(name="forecaster", model=served.model, tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                  instructions="You are the agents-sdk forecaster. Call get_weather, then answer in one sentence.",
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48))

    async def main() -> tuple[Any, Any]:
        first = await Runner.run(agent, "What is the weather in Rome?", max_turns=2)
        follow = first.to_input_list() + [{"role": "user", "content": "Is it warm there? Answer yes or no."}]
        # the SDK raises on `incomplete` (max_tokens reached): end the reply at its first line
        answer = agent.clone(model_settings=ModelSettings(tool_choice="none", temperature=0, max_tokens=48,
                                                          extra_body={"stop": ["\n"]}))
        return first, await Runner.run(answer, follow, max_turns=2)

    first, second = asyncio.run(main())
    assert [c.lower() for c in seen][:1] == ["rome"], seen
    assert first.final_output == get_weather_text(seen[0])  # stop_on_first_tool: the tool's output
    assert isinstance(second.final_output, str) and second.final_output.strip()
    u1 = first.context_wrapper.usage
    u2 = second.context_wrapper.usage
    logger.info("agents sdk: run 1 %s; run 2 %s; %r / %r", u1, u2, first.final_output, second.final_output)
    # run 2 resends run 1's conversation: the kept line serves all of run 1's prompt and call
    assert u2.input_tokens_details.cached_tokens >= u1.input_tokens + u1.output_tokens - 2, (u1, u2)
    assert _sent(served, before, "agents sdk") == {"/v1/responses 200": 2}


def test_pydantic_ai_default_openai_model_tool_round_trip_and_second_run(served: Served, monkeypatch: Any) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models import infer_model
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    before = _routes(served)
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    assert type(infer_model(f"openai:{served.model}")) is OpenAIResponsesModel  # the default is the Responses API
    model = OpenAIResponsesModel(served.model, provider=OpenAIProvider(base_url=served.v1, api_key="unused"))

    def settings(ctx: Any) -> dict[str, Any]:
        """Force the call until a tool has answered, then text only (the tools stay shown)."""
        answered = any(getattr(p, "part_kind", "") == "tool-return" for m in ctx.messages for p in getattr(m, "parts", ()))
        return {"temperature": 0.0, "max_tokens": 16 if answered else 48, "tool_choice": "none" if answered else "required"}

    agent = Agent(model, instructions="You are the pydantic-ai weather bot. Call get_weather, then answer briefly.",
                  model_settings=settings)
    seen: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return get_weather_text(city)

    first = agent.run_sync("Use get_weather to get the weather in Oslo.")
    second = agent.run_sync("Is it warm there? Answer yes or no.", message_history=first.all_messages())
    logger.info("pydantic-ai: %s / %s; %r / %r", first.usage, second.usage, first.output, second.output)
    assert [c.lower() for c in seen][:1] == ["oslo"], seen
    assert first.output.strip() and second.output.strip()
    # run 1: the forced call, then the answer on the call's output (its prompt all cached);
    # run 2 resends run 1's history: read from kept KV
    u2 = second.usage
    assert u2.cache_read_tokens >= 0.8 * u2.input_tokens, u2
    assert set(_sent(served, before, "pydantic-ai")) == {"/v1/responses 200"}


def test_agent_framework_openai_chat_client_tool_round_trip_and_second_turn(served: Served) -> None:
    pytest.importorskip("agent_framework_openai")
    from agent_framework import Agent
    from agent_framework.openai import OpenAIChatClient

    before = _routes(served)
    seen: list[str] = []

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return get_weather_text(city)

    # one model round trip, then the framework's final request with tool_choice "none"
    client = OpenAIChatClient(model=served.model, base_url=served.v1, api_key="unused",
                              function_invocation_configuration={"max_iterations": 1})
    agent = Agent(client=client, name="maf-weather", tools=[get_weather],
                  instructions="You are the agent-framework weather bot. Call get_weather, then answer in one sentence.")

    async def main() -> tuple[Any, Any]:
        session = agent.create_session()
        opts = {"temperature": 0.0, "max_tokens": 16}
        first = await agent.run("What is the weather in Lima?", session=session,
                                options={**opts, "max_tokens": 48, "tool_choice": "required"})
        second = await agent.run("Is it warm there? Answer yes or no.", session=session,
                                 options={**opts, "tool_choice": "none"})
        return first, second

    first, second = asyncio.run(main())
    logger.info("agent framework: %s / %s; %r / %r", first.usage_details, second.usage_details, first.text, second.text)
    assert [c.lower() for c in seen][:1] == ["lima"], seen
    assert second.text.strip()
    u = second.usage_details or {}
    assert u["cache_read_input_token_count"] >= 0.8 * u["input_token_count"], u
    assert set(_sent(served, before, "agent framework")) == {"/v1/responses 200"}
