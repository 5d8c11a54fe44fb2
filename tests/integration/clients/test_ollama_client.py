"""The official `ollama` client on `agentmem serve`, in its default set-up (only `host`).

No agent id: the conversation is found by its history (`--anonymous lines`). `chat` with
tools on the instruct model (Ollama has no `tool_choice`: the model chooses, and the
0.5B one calls the weather tool for a weather question), the tool result sent back with
`tool_name`, the second turn evaluating only what is new (`prompt_eval_count` small next
to its prompt, whose size `GET /agents` shows); a streamed chat; `list()` and `show()`.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.integration

logger = logging.getLogger(__name__)


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: the city's name.
    """
    return f"18 C and sunny in {city}"


@pytest.fixture
def client(served: Any) -> Any:
    return ollama.Client(host=served.base_url)


def _agent_tokens(served: Any) -> dict[str, int]:
    return {a["id"]: a["tokens"] for a in served.agents()}


def test_tool_round_trip_reads_the_history_from_kept_kv(served: Any, client: Any) -> None:
    msgs: list[Any] = [{"role": "system", "content": "You are a weather assistant (ollama client test)."},
                       {"role": "user", "content": "What is the weather in Paris?"}]
    opts = {"temperature": 0, "num_predict": 32}
    first = client.chat(model=served.model, messages=msgs, tools=[get_weather], options=opts)
    calls = first.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather", first.message
    assert "paris" in str(calls[0].function.arguments.get("city", "")).lower()
    msgs.append(first.message)
    msgs.append({"role": "tool", "content": get_weather(**calls[0].function.arguments), "tool_name": "get_weather"})
    before = _agent_tokens(served)
    second = client.chat(model=served.model, messages=msgs, tools=[get_weather], options={**opts, "num_predict": 8})
    after = _agent_tokens(served)
    grown = [k for k in after if after[k] > before.get(k, 0)]
    assert len(grown) == 1, (before, after)
    kept = after[grown[0]] - second.eval_count  # the agent's tokens: the second prompt + its reply
    logger.info("ollama: first prompt_eval %d eval %d; second prompt_eval %d of a %d-token prompt, eval %d: %r",
                first.prompt_eval_count, first.eval_count, second.prompt_eval_count, kept, second.eval_count,
                second.message.content)
    assert second.prompt_eval_count <= 0.25 * kept, (second.prompt_eval_count, kept)
    assert second.done and second.eval_count > 0  # the 0.5B model may answer or call again: either is a turn


def test_streamed_chat(served: Any, client: Any) -> None:
    msgs = [{"role": "system", "content": "You answer briefly (ollama stream test)."},
            {"role": "user", "content": "Name one colour. One word."}]
    parts = list(client.chat(model=served.model, messages=msgs, stream=True, options={"temperature": 0, "num_predict": 8}))
    text = "".join(p.message.content or "" for p in parts)
    logger.info("ollama stream: %d chunks %r, last %s", len(parts), text, parts[-1])
    assert len(parts) >= 2 and parts[-1].done and text.strip()
    assert all(not p.done for p in parts[:-1]) and parts[-1].eval_count > 0


def test_list_and_show(served: Any, client: Any) -> None:
    models = client.list().models
    assert [m.model for m in models] == [served.model]
    assert models[0].size > 100_000_000 and models[0].details.family == "qwen2"
    shown = client.show(served.model)
    logger.info("ollama list: %s; show details %s, capabilities %s", models[0], shown.details, shown.capabilities)
    assert "tools" in shown.capabilities and shown.details.quantization_level.startswith("Q4_K")
    assert shown.modelinfo["general.architecture"] == "qwen2"
