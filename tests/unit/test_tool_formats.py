"""Contract tests over every registered tool-call format, and the native formats under a real template.

The KV rule: a call rendered back into the next prompt is exactly the text the model was
made to emit, so the agent's kept KV covers the whole call.
"""

from __future__ import annotations

import json

import pytest

from agentmem.engine.chat_format import normalize_messages
from agentmem.engine.jinja_format import JinjaFormat
from agentmem.tools import split_forced_prefix
from agentmem.tools.formats import TOOL_FORMATS, detect_tool_format, get_tool_format
from agentmem.errors import PolicyError

TOOLS = [
    {"name": "get_weather", "description": "Weather of a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]}},
    {"name": "ping", "parameters": {"type": "object", "properties": {}}},
]
ARGS = {"city": "Zürich <x> & 'y'", "days": 3}

# Qwen2.5's template, verbatim from Qwen2.5-Coder-0.5B-Instruct's GGUF (tools block shortened).
QWEN25 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen.' }}{%- endif %}{{- \"\\n\\n# Tools\\n<tools>\" }}{%- for tool in tools %}{{- \"\\n\" }}"
    "{{- tool | tojson }}{%- endfor %}{{- \"\\n</tools><|im_end|>\\n\" }}{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == \"tool\" %}{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(params=sorted(TOOL_FORMATS))
def fmt(request: pytest.FixtureRequest):
    return TOOL_FORMATS[request.param]


def test_render_then_parse_round_trips(fmt) -> None:
    calls = [("get_weather", ARGS), ("ping", {})] if fmt.parallel else [("get_weather", ARGS)]
    text = fmt.render_call(calls)
    parsed = fmt.parse(text)
    assert parsed is not None and [(c.name, c.arguments) for c in parsed] == calls, (text, parsed)
    assert fmt.opens_call(text) is True and fmt.opens_call(text[:3]) in (None, True)
    assert fmt.opens_call("Hello there") is False and fmt.parse("Hello there") is None


def test_forced_prefix_is_the_start_of_the_rendered_call(fmt) -> None:
    prefix, rest = fmt.forced(TOOLS[:1])
    text = fmt.render_call([("get_weather", ARGS)])
    assert text.startswith(prefix), (prefix, text)
    assert "root ::=" in rest


def test_continuation_stops_before_the_arguments_or_the_name(fmt) -> None:
    prefix, _ = fmt.continuation(TOOLS[:1])
    assert prefix.endswith('"arguments":') or prefix.endswith('"parameters":'), prefix
    prefix, _ = fmt.continuation(TOOLS)
    assert prefix.endswith('"name": "'), prefix


def test_find_reads_a_call_after_text_and_ignores_unknown_tools(fmt) -> None:
    text = "Let me check.\n" + fmt.render_call([("get_weather", ARGS)])
    calls, before = fmt.find(text, ["get_weather"])
    assert [c.name for c in calls] == ["get_weather"] and before == "Let me check."
    assert fmt.find(text, ["other"]) is None


def test_a_cut_off_call_is_one_invalid_call(fmt) -> None:
    text = fmt.render_call([("get_weather", ARGS)])[:-8]
    parsed = fmt.parse(text)
    assert parsed is not None and len(parsed) == 1 and not parsed[0].ok, parsed


def test_written_back_is_content_then_call(fmt) -> None:
    call = fmt.render_call([("ping", {})])
    assert fmt.written_back("", [("ping", {})]) == call
    assert fmt.written_back(" Checking. ", [("ping", {})]) == f"Checking.\n{call}"


def test_marker_tokens_become_token_references() -> None:
    """llama.cpp's grammar does not match a special token against literal text: a forced Qwen call was
    written `<`, `tool`, `_call`, `>` and its KV did not match the next prompt (251 of 254 tokens)."""
    bound = TOOL_FORMATS["hermes"].with_tokens({"<tool_call>": 151657, "</tool_call>": 151658})
    g = bound.grammar(TOOLS[:1])
    assert "<tool_call>" in g and '"<tool_call>' not in g
    prefix, _ = split_forced_prefix(g)
    assert prefix.startswith("<tool_call>\n{")


def test_detection_from_template_text() -> None:
    assert detect_tool_format(QWEN25).name == "hermes"
    assert detect_tool_format("{{ '<|python_tag|>' }}{% if tools %}{% endif %}").name == "llama3"
    assert detect_tool_format("{% if tools %}[TOOL_CALLS]{% endif %}").name == "mistral"
    assert detect_tool_format("<start_of_turn>{{ messages }}").name == "envelope"
    assert detect_tool_format(None).name == "envelope"
    with pytest.raises(PolicyError, match="valid: hermes"):
        get_tool_format("nope")


# --------------------------------------------------------------------------- under the real Qwen2.5 template
def test_qwen_template_gets_tools_and_writes_a_call_back_as_emitted() -> None:
    f = JinjaFormat(QWEN25)
    assert f.tool_format.name == "hermes" and f.call_render_matches
    emitted = f.tool_format.render_call([("get_weather", ARGS)])
    msgs = normalize_messages([
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "name": "get_weather", "arguments": json.dumps(ARGS, ensure_ascii=False)}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ])
    segs = f.render(msgs, bos="", eos="", tools=TOOLS)
    assert '"name": "get_weather", "description": "Weather of a city."' in segs[0].text  # the native tools block
    call = next(s for s in segs if s.region == "tool_call")
    assert call.text == f"<|im_start|>assistant\n{emitted}<|im_end|>\n", call.text


def test_speaker_names_go_into_user_content_where_the_template_drops_them() -> None:
    f = JinjaFormat(QWEN25)
    assert f.keeps_names is False
    msgs = normalize_messages([
        {"role": "user", "content": "Plan it.", "name": "ceo"},
        {"role": "assistant", "content": "Sure.", "name": "pm"},
        {"role": "user", "content": "Go on."},
    ])
    text = "".join(s.text for s in f.render(msgs, bos="", eos=""))
    assert "<|im_start|>user\nceo: Plan it.<|im_end|>\n" in text
    assert "<|im_start|>assistant\nSure.<|im_end|>" in text  # the model's own turns stay as generated


def test_a_template_without_tool_support_gets_calls_as_the_envelope() -> None:
    plain = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
             "{% if add_generation_prompt %}<assistant>{% endif %}")
    f = JinjaFormat(plain)
    assert f.tool_format.name == "envelope" and f.call_render_matches
    msgs = normalize_messages([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "ping", "arguments": {}}]},
    ])
    text = "".join(s.text for s in f.render(msgs, bos="", eos=""))
    assert '<assistant>{"tool_calls": [{"name": "ping", "arguments": {}}]}</assistant>' in text
