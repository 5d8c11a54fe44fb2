"""CrewAI 1.15 in its default set-up against an OpenAI-compatible server: run by test_crewai.py in `.venv-crewai`.

`LLM(model="openai/<name>", base_url=..., api_key=...)` (CrewAI's own OpenAI provider, chat
completions, no agent id), one Agent with one tool, a Crew with one Task, kicked off twice. With `max_iter=1` a kickoff
is two calls: one with `tools` (the model calls `get_weather`), then CrewAI's forced final
answer, which drops `tools` (the side request of #25).
Every LLM call's usage is recorded from CrewAI's event bus (`LLMCallCompletedEvent.usage`,
which carries `cached_prompt_tokens`); the summary goes to the JSON file named by `--out`.

    .venv-crewai/bin/python tests/integration/clients/crewai_run.py --base-url http://127.0.0.1:8000/v1 \
        --model qwen2.5-coder-0.5b-instruct --out crewai.json

This file runs in CrewAI's venv, not the project's: it imports nothing from agentmem.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # no network from the test machine
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import LLM, Agent, Crew, Task  # noqa: E402
from crewai.events import LLMCallCompletedEvent, crewai_event_bus  # noqa: E402
from crewai.tools import tool  # noqa: E402

logger = logging.getLogger("crewai_run")

TOOL_CALLS: list[str] = []
LLM_CALLS: list[dict[str, Any]] = []


@tool("get_weather")
def get_weather(city: str) -> str:
    """Current weather in a city."""
    TOOL_CALLS.append(city)
    return f"sunny, 21 C in {city}"


@crewai_event_bus.on(LLMCallCompletedEvent)
def _record(source: Any, event: LLMCallCompletedEvent) -> None:
    """Keep each LLM call's usage and how many messages it sent."""
    del source
    LLM_CALLS.append({"usage": dict(event.usage or {}), "messages": len(event.messages or []),
                      "run": RUN[0], "at": time.monotonic()})
    logger.info("run %d, LLM call %d: %d messages, usage %s", RUN[0], len(LLM_CALLS), LLM_CALLS[-1]["messages"],
                LLM_CALLS[-1]["usage"])


RUN = [0]


def build(base_url: str, api_key: str, model: str, max_iter: int) -> Crew:
    """The crew: one agent with `get_weather`, one task."""
    llm = LLM(model=f"openai/{model}", base_url=base_url, api_key=api_key, max_tokens=40)
    reporter = Agent(role="CrewAI weather reporter", goal="Report the current weather of a city in one sentence.",
                     backstory="You always use the get_weather tool before you answer.", tools=[get_weather],
                     llm=llm, max_iter=max_iter, verbose=False)
    task = Task(description="What is the weather in {city}? Use the get_weather tool.",
                expected_output="One sentence about the weather.", agent=reporter)
    return Crew(agents=[reporter], tasks=[task], verbose=False)


def main() -> None:
    """Two kickoffs of the same crew; the summary JSON to `--out`."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", default=os.environ.get("OPENAI_API_BASE", "http://127.0.0.1:8000/v1"))
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "x"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-iter", type=int, default=1)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    crew = build(args.base_url, args.api_key, args.model, args.max_iter)
    runs = []
    for i in range(args.runs):
        RUN[0] = i
        t0 = time.monotonic()
        out = crew.kickoff(inputs={"city": "Rome"})
        usage = out.token_usage
        runs.append({"seconds": round(time.monotonic() - t0, 2), "raw": str(out.raw)[:200],
                     "prompt_tokens": usage.prompt_tokens, "cached_prompt_tokens": usage.cached_prompt_tokens,
                     "completion_tokens": usage.completion_tokens, "requests": usage.successful_requests})
        logger.info("run %d: %s", i, runs[-1])
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"runs": runs, "tool_calls": TOOL_CALLS,
                   "llm_calls": [{k: v for k, v in c.items() if k != "at"} for c in LLM_CALLS]}, f, indent=1)


if __name__ == "__main__":
    main()
