"""Hypothesis fuzz of the grammar path: hostile JSON schemas and tool definitions → GBNF → llama.cpp's parser.

Random schemas (every keyword the converter reads, with huge, negative, fractional,
boolean and mistyped values, deep nesting, long patterns, `$ref` chains, wide objects)
go through `schema_grammar`, `tool_call_grammar` and each tool format's forced grammar.
Each must end in a typed `AgentMemError`, or in a grammar that passes `check_grammar`
and that llama.cpp's own parser accepts, in a child process (`tests.fixtures.native_grammar`)
so a crash fails the test instead of killing pytest. Never another exception, never a crash.

A few hundred examples by default (well under a minute); `AGENTMEM_FUZZ_EXAMPLES=5000`
runs a longer profile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agentmem.errors import AgentMemError
from agentmem.tools import TOOL_FORMATS, schema_grammar, tool_call_grammar
from agentmem.tools.limits import check_grammar
from tests.fixtures.native_grammar import NativeGrammar

N = int(os.environ.get("AGENTMEM_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=N, deadline=None, derandomize="AGENTMEM_FUZZ_SEED" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

COUNT = st.one_of(st.integers(0, 80), st.integers(60, 600), st.sampled_from([255, 256, 257, 511, 4096, 20_000,
                  30_000, 100_000, 100_001, 10**9, -1]), st.floats(allow_nan=True), st.booleans(), st.text(max_size=3))
BOUND = st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                  st.text(max_size=3))
NAME = st.text(min_size=0, max_size=12) | st.sampled_from(["a", "b", "title", "$ref", "type", "\u0000", "x" * 100])
TYPE = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array", "nonsense"])
PATTERN = st.one_of(st.from_regex(r"\^?[a-z.\\d]{0,4}(\{\d{1,5}(,\d{0,5})?\})?[a-z]?\$?", fullmatch=True),
                    st.text(max_size=30), st.just("(" * 600 + "a" + ")" * 600), st.just("a{0,100000}"))
JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                          lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids,
                                                                                     max_size=3), max_leaves=6)


def _schema(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    keyword = st.one_of(
        st.tuples(st.just("type"), TYPE | st.lists(TYPE, max_size=3)),
        st.tuples(st.sampled_from(["minLength", "maxLength", "minItems", "maxItems", "minProperties"]), COUNT),
        st.tuples(st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]), BOUND),
        st.tuples(st.just("pattern"), PATTERN),
        st.tuples(st.just("format"), st.sampled_from(["date", "uuid", "date-time", "time", "email", "x"])),
        st.tuples(st.just("properties"), st.dictionaries(NAME, kids, max_size=4)),
        st.tuples(st.just("required"), st.lists(NAME, max_size=3) | JSON_VALUE),
        st.tuples(st.sampled_from(["items", "additionalProperties", "not"]), kids | st.booleans()),
        st.tuples(st.sampled_from(["anyOf", "oneOf", "allOf", "prefixItems"]), st.lists(kids, max_size=3)),
        st.tuples(st.sampled_from(["enum", "const"]), st.lists(JSON_VALUE, max_size=4) | JSON_VALUE),
        st.tuples(st.just("$ref"), st.sampled_from(["#/$defs/a", "#/$defs/b", "#", "#/nope", "http://x/y", "a"])),
        st.tuples(st.just("$defs"), st.dictionaries(st.sampled_from(["a", "b"]), kids, max_size=2)),
    )
    return st.lists(keyword, max_size=5).map(dict)


SCHEMA = st.recursive(st.just({}) | _schema(st.just({"type": "string"})), _schema, max_leaves=12)


@st.composite
def hostile(draw: st.DrawFn) -> Any:
    """A random schema, sometimes wrapped deep, made wide or a long `$ref` chain, sometimes not a dict at all."""
    s = draw(SCHEMA)
    shape = draw(st.sampled_from(["plain"] * 6 + ["deep", "wide", "chain", "junk"]))
    if shape == "deep":
        for _ in range(draw(st.integers(20, 400))):
            s = draw(st.sampled_from([{"type": "object", "properties": {"a": s}}, {"anyOf": [s]},
                                      {"type": "array", "items": s}]))
    elif shape == "wide":
        n = draw(st.sampled_from([50, 255, 257, 2000]))
        s = {"type": "object", "properties": {f"p{i}": s for i in range(n)}}
    elif shape == "chain":
        n = draw(st.integers(2, 3000))
        defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"type": "null"}]} for i in range(n)}
        s = {"$ref": "#/$defs/d0", "$defs": {**defs, f"d{n}": s}}
    elif shape == "junk":
        s = draw(JSON_VALUE)
    return s


@pytest.fixture(scope="module")
def native(tiny_model_path: Path) -> Iterator[NativeGrammar]:
    with NativeGrammar(tiny_model_path) as n:
        yield n


def _through(native: NativeGrammar, build: Any) -> None:
    """`build()` either raises an AgentMemError or returns a grammar llama.cpp parses (in the child)."""
    try:
        out = build()
    except AgentMemError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    grammar = out[1] if isinstance(out, tuple) else out
    check_grammar(grammar)  # what the sampler checks; a grammar we built must pass it
    verdict = native.verdict(grammar)
    event(f"llama.cpp: {verdict}")
    assert verdict == "ok", f"llama.cpp: {verdict} on a grammar of {len(grammar)} bytes: {grammar[:300]!r}"


@FUZZ
@given(schema=hostile())
def test_schemas_are_refused_or_parse(native: NativeGrammar, schema: Any) -> None:
    _through(native, lambda: schema_grammar(schema))


FORMATS = sorted(TOOL_FORMATS)


@FUZZ
@given(params=st.lists(hostile(), min_size=1, max_size=3), fmt=st.sampled_from(FORMATS),
       names=st.lists(NAME, min_size=3, max_size=3), parallel=st.booleans())
def test_tool_definitions_are_refused_or_parse(native: NativeGrammar, params: list[Any], fmt: str,
                                               names: list[str], parallel: bool) -> None:
    tools = [{"name": n, "parameters": p} for n, p in zip(names, params)]
    f = TOOL_FORMATS[fmt]
    _through(native, lambda: tool_call_grammar(tools, parallel=parallel))
    _through(native, lambda: f.forced(tools, parallel=parallel and f.parallel))


def test_the_fuzz_reaches_both_outcomes(native: NativeGrammar) -> None:
    """The strategies are not all refused (or all accepted): both ends are exercised."""
    assert native.verdict(schema_grammar({"type": "string", "maxLength": 100_000})) == "ok"
    with pytest.raises(AgentMemError):
        schema_grammar(json.loads('{"type": "array", "maxItems": 30000}'))
