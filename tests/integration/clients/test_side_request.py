"""#25's side request: a call that drops `tools` on a conversation's line leaves the line's KV kept.

CrewAI's last call of a run drops `tools` (so do title and summary requests, a sub-agent
sharing the history, a changed tool list). Before conversation lines, that call replaced
the agent's KV beyond the first tokens that still matched (61 of them on CrewAI), so the
main line's next call prefilled its whole history again. Now the side request is a branch
(a new agent) and the main line's next call continues the kept line: the official `openai`
client, no agent id, the shared `served` server in its defaults.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from tests.integration.clients.conftest import WEATHER_TOOL, Served  # noqa: E402

pytestmark = pytest.mark.integration

logger = logging.getLogger(__name__)

SYSTEM = ("You are the side-request test's weather assistant. Once a tool has answered, "
          "reply to the user in one plain sentence.")


def _ext(r: Any) -> dict[str, Any]:
    """The response's `agentmem` object (agent id, line, kv, timings)."""
    return dict(r.model_extra["agentmem"])


def test_a_side_request_without_tools_keeps_the_main_line(served: Served) -> None:
    """#25: tools, a tool round trip, a side request without `tools`, then the main line again.

    The main line's next call must read >= 95 % of its previous prompt from kept KV (the
    side request may not overwrite it), and continue the same agent.
    """
    client = openai.OpenAI(base_url=served.v1, api_key="x", max_retries=0, timeout=600.0)
    tools = [WEATHER_TOOL]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": "What is the weather in Paris?"}]
    # Main line: the model calls the tool, the result goes back, the model answers.
    call = client.chat.completions.create(model=served.model, messages=msgs, tools=tools,
                                          tool_choice="required", max_tokens=48)
    assert call.choices[0].message.tool_calls, call
    tc = call.choices[0].message.tool_calls[0]
    msgs += [call.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": tc.id, "content": "sunny, 21 C"}]
    answer = client.chat.completions.create(model=served.model, messages=msgs, tools=tools,
                                            tool_choice="none", max_tokens=32)
    msgs.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    # Side request: the same history, no tools (its prompt leaves the line at the system prompt).
    side = client.chat.completions.create(model=served.model, max_tokens=16, messages=msgs + [
        {"role": "user", "content": "Give this conversation a title of at most five words."}])
    # The main line's next call.
    msgs.append({"role": "user", "content": "And in London?"})
    nxt = client.chat.completions.create(model=served.model, messages=msgs, tools=tools,
                                         tool_choice="required", max_tokens=48)
    main, s, n = _ext(answer), _ext(side), _ext(nxt)
    cached = nxt.usage.prompt_tokens_details.cached_tokens
    fraction = cached / answer.usage.prompt_tokens
    for name, r in (("call", call), ("answer", answer), ("side", side), ("next", nxt)):
        e = _ext(r)
        logger.info("side request: %-6s %s %s %s prompt %d cached %d ttft %.2f s", name, e["agent_id"], e["line"],
                    e["kv"], r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens,
                    e["timings"]["ttft_s"])
    logger.info("side request: next call read %d of the previous prompt's %d = %.3f", cached,
                answer.usage.prompt_tokens, fraction)
    assert s["agent_id"] != main["agent_id"], (s, main)
    assert n["agent_id"] == main["agent_id"] and n["line"] == "continued", (n, main)
    assert fraction >= 0.95, f"{cached=} of {answer.usage.prompt_tokens=}: {fraction=:.3f}"
    assert nxt.choices[0].message.tool_calls, nxt
