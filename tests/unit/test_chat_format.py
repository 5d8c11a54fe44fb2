"""Chat formats: exact rendered text, regions, validation (no model needed)."""

from __future__ import annotations

import pytest

from agentmem.engine.chat_format import (
    ChatMLFormat,
    GemmaFormat,
    JinjaFormat,
    normalize_messages,
    select_format,
    tool_calls_text,
)
from agentmem.errors import MessageError, PolicyError


def render(fmt, msgs):
    segs = fmt.render(normalize_messages(msgs), bos="", eos="")
    return "".join(s.text for s in segs), [(s.region, s.text) for s in segs]


def test_gemma_matches_gemma3_template_layout():
    text, _ = render(
        GemmaFormat(),
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ],
    )
    assert text == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_regions_and_tools():
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U", "name": "alice"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "content": "2", "tool_call_id": "1"},
    ]
    text, segs = render(GemmaFormat(), msgs)
    regions = [r for r, _ in segs]
    assert regions == ["system", "user", "assistant", "tool_call", "tool_result", "assistant"]
    assert "alice: U" in text
    assert '{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}' in text
    assert "Tool result (1):\n2" in text


def test_final_assistant_message_is_continued():
    text, _ = render(GemmaFormat(), [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "The answer is"}])
    assert text.endswith("<start_of_turn>model\nThe answer is")
    text, _ = render(ChatMLFormat(), [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "Sure"}])
    assert text.endswith("<|im_start|>assistant\nSure")


def test_chatml_layout():
    text, _ = render(ChatMLFormat(), [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_jinja_regions_from_cumulative_renders():
    tpl = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    text, segs = render(JinjaFormat(tpl), [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert text.endswith("<|im_start|>assistant\n")
    assert [r for r, _ in segs] == ["system", "user", "assistant"]


def test_select_format():
    assert select_format("auto", None, has_gemma_turns=True).name == "gemma"
    assert select_format("auto", None).name == "chatml"
    assert select_format("auto", "{{ '<start_of_turn>' }}").name == "gemma"
    assert select_format("auto", "{{ messages }}").name == "jinja"
    with pytest.raises(PolicyError, match="valid: auto"):
        select_format("nope", None)
    with pytest.raises(PolicyError, match="no tokenizer.chat_template"):
        select_format("jinja", None)


def test_validation_messages():
    with pytest.raises(MessageError, match=r"messages\[1\].tool_calls is only allowed on assistant"):
        normalize_messages([{"role": "user", "content": "a"}, {"role": "user", "content": "b", "tool_calls": [{"name": "x"}]}])
    with pytest.raises(MessageError, match=r"tool_calls\[0\].name"):
        normalize_messages([{"role": "assistant", "content": "", "tool_calls": [{"arguments": {}}]}])
    with pytest.raises(MessageError, match="pin must be a bool"):
        normalize_messages([{"role": "user", "content": "a", "pin": "yes"}])
    parts = normalize_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert parts[0].content == "ab"


def test_tool_calls_text_is_json():
    import json

    calls = normalize_messages([{"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"q": "x"}}]}])[0].tool_calls
    assert json.loads(tool_calls_text(calls)) == {"tool_calls": [{"name": "f", "arguments": {"q": "x"}}]}
