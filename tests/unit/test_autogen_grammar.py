"""GBNF builders of agentmem_autogen: canonical spacing, llama.cpp accepts them, outputs parse.

The grammars are compiled by llama.cpp's grammar sampler on the tiny model (an invalid
grammar raises there), and what the model writes under them is checked with ``json``.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("autogen_core")

from agentmem import MemoryPool  # noqa: E402
from agentmem.engine.chat_format import ToolCall, tool_calls_text  # noqa: E402
from agentmem.tools import (  # noqa: E402
    JSON_OBJECT_GRAMMAR,
    call_or_document_grammar,
    choice_grammar,
    schema_grammar,
    tool_call_continuation,
    tool_call_grammar,
)

FLAG = {
    "name": "set_flag",
    "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
}
LEVEL = {
    "name": "set_level",
    "parameters": {
        "type": "object",
        "properties": {"level": {"enum": ["low", "high"]}, "note": {"type": "string", "title": "Note"}},
        "required": ["level"],
    },
}
NOARGS = {"name": "ping", "description": "no arguments"}


@pytest.fixture(scope="module")
def pool(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=1024, resident_agents=1, chat_format="chatml", n_threads=1) as p:
        yield p


def generate(pool: MemoryPool, grammar: str, *, prefix: str | None = None, max_tokens: int = 160) -> str:
    msgs = [{"role": "user", "content": "go"}]
    if prefix is not None:
        msgs.append({"role": "assistant", "content": prefix})
    r = pool.chat("g", msgs, max_tokens=max_tokens, grammar=grammar)
    assert r.finish_reason == "stop", f"grammar output did not complete: {r.text!r}"
    return (prefix or "") + r.text


def test_schema_grammar_is_canonically_spaced():
    props = {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "boolean"}}, "c": {"type": "string"}}
    g = schema_grammar({"type": "object", "properties": props, "required": ["a", "b", "c"]})
    assert "space" not in g  # the converter's optional-space rule is gone
    assert '": "' in g and '", "' in g
    # raw control characters are barred from strings: json.loads (strict) rejects them
    assert r'[^"\\\x7F\x00-\x1F]' in g


@pytest.mark.parametrize(
    "tools", [[FLAG], [FLAG, LEVEL], [NOARGS], [LEVEL, NOARGS]], ids=["one", "two", "noargs", "mixed"]
)
@pytest.mark.parametrize("parallel", [False, True], ids=["single", "parallel"])
def test_tool_call_grammars_compile_and_produce_the_prompt_format(pool, tools, parallel):
    names = {t["name"] for t in tools}
    full = generate(pool, tool_call_grammar(tools, parallel=parallel))
    prefix, rest = tool_call_continuation(tools, parallel=parallel)
    cont = generate(pool, rest, prefix=prefix)
    for text in (full, cont):
        doc = json.loads(text)
        assert list(doc) == ["tool_calls"]
        calls = doc["tool_calls"]
        assert calls and (parallel or len(calls) == 1)
        assert all(c["name"] in names and isinstance(c["arguments"], dict) for c in calls)
        # what the model wrote is exactly how the prompt renders a past call
        assert text == tool_calls_text([ToolCall(id="", name=c["name"], arguments=c["arguments"]) for c in calls])


def test_single_tool_prefix_leaves_only_the_arguments(pool):
    prefix, _ = tool_call_continuation([FLAG])
    assert prefix == '{"tool_calls": [{"name": "set_flag", "arguments":'
    prefix, _ = tool_call_continuation([FLAG, LEVEL])
    assert prefix == '{"tool_calls": [{"name": "'


def test_json_object_grammar(pool):
    assert isinstance(json.loads(generate(pool, JSON_OBJECT_GRAMMAR)), dict)


def test_choice_grammar(pool):
    assert generate(pool, choice_grammar(["pm", "engineer", 'say "hi"'])) in ("pm", "engineer", 'say "hi"')
    with pytest.raises(ValueError, match="non-empty strings"):
        choice_grammar(["pm", ""])


def test_unusable_schema_is_a_value_error():
    with pytest.raises(ValueError, match="cannot turn this JSON schema"):
        schema_grammar({"$ref": "https://example.com/remote.json"})
    with pytest.raises(ValueError, match="at least one tool"):
        tool_call_grammar([])


def test_call_or_document_grammar(pool):
    doc = {
        "type": "object",
        "properties": {"verdict": {"$ref": "#/$defs/Verdict"}},
        "required": ["verdict"],
        "$defs": {"Verdict": {"enum": ["ship", "wait"]}},
    }
    g = call_or_document_grammar([FLAG], doc)
    out = json.loads(generate(pool, g))
    assert out.get("verdict") in ("ship", "wait") or out["tool_calls"][0]["name"] == "set_flag", out
