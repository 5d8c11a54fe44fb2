"""A free tool turn decodes once (issue 25): the official `openai` client, `tool_choice: "auto"`.

The server's default decode strategy (`lazy`) runs a free tool turn under the lazy call
grammar of the offered tools: free text until the model opens a call, constrained from
there, and never a second, forced decode. So the usage billed is one attempt's: the
prompt tokens of an `auto` turn equal those of a plain turn (`tool_choice: "none"`, the
same prompt), whether the model calls a tool or answers in text, and text streams from its
first pieces. The TTFT side (≤ 1.2× a plain turn) is measured by `benchmarks/tool_turn.py`.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.clients.conftest import WEATHER_TOOL, Served

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.integration


def _turn(client: Any, model: str, system: str, question: str, choice: str) -> tuple[Any, int, list[str], bool]:
    """One streamed turn: its usage, how many content chunks came, the content pieces, whether it called a tool."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    usage, pieces, called = None, [], False
    for chunk in client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER_TOOL], tool_choice=choice,
                                                max_tokens=40, temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            if ch.delta.content:
                pieces.append(ch.delta.content)
            called = called or bool(ch.delta.tool_calls)
    assert usage is not None
    return usage, len(pieces), pieces, called


def test_a_free_tool_turn_is_billed_one_decode(served: Served) -> None:
    client = openai.OpenAI(base_url=served.v1, api_key="none", max_retries=0, timeout=600)
    call_q = "What is the weather in Paris right now? Use the tool."
    plain, _, _, plain_called = _turn(client, served.model, "Session one-decode-a. You are a weather bot.", call_q, "none")
    auto, _, _, called = _turn(client, served.model, "Session one-decode-b. You are a weather bot.", call_q, "auto")
    assert not plain_called and called, "the model calls the tool when it may (and not when it may not)"
    assert auto.prompt_tokens == plain.prompt_tokens, (auto, plain)  # one attempt billed: the prompt, once
    assert auto.completion_tokens <= 40


def test_a_free_turn_that_answers_in_text_streams_it(served: Served) -> None:
    client = openai.OpenAI(base_url=served.v1, api_key="none", max_retries=0, timeout=600)
    q = "Explain in two sentences what a weather front is. Do not use a tool."
    plain, _, plain_pieces, _ = _turn(client, served.model, "Session one-decode-c. You are a weather bot.", q, "none")
    auto, n, pieces, called = _turn(client, served.model, "Session one-decode-d. You are a weather bot.", q, "auto")
    assert not called and auto.prompt_tokens == plain.prompt_tokens
    assert n >= 3, f"text streams piece by piece, not as one block at the end: {pieces!r}"
    assert "".join(pieces).strip(), pieces
