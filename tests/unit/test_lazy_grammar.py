"""Lazy grammars (issue 25, "one decode per tool turn"): validation, trigger matching, the stream gate.

Before, a free tool turn (`tool_choice: "auto"`) had no grammar: a malformed call was
decoded to the end, then decoded again under the forced grammar. `SamplingParams` now
takes trigger patterns and tokens that make its grammar lazy, `lazy_call_grammar` builds
the grammar and triggers of a free turn per tool format, and `LazyCallGate` releases text
as soon as no trigger can fire. These tests fail on the old code (no such fields/modules).
"""

from __future__ import annotations

import re

import pytest

from agentmem.engine.sampling import SamplingParams
from agentmem.engine.triggers import MAX_TRIGGERS, TriggerWatch, check_triggers, find_trigger
from agentmem.errors import ConfigError, GrammarLimitError
from agentmem.tools.formats import TOOL_FORMATS
from agentmem.tools.lazy import BARE_CALL_OPEN, LazyCallGate, LazyGrammar, Trigger, lazy_call_grammar
from agentmem.tools.limits import check_grammar

TOOLS = [
    {"name": "lookup_metric", "parameters": {"type": "object", "properties": {"metric": {"type": "string"}},
                                             "required": ["metric"]}},
    {"name": "send_email", "parameters": {"type": "object", "properties": {"to": {"type": "string"}},
                                          "required": ["to"]}},
]
G = 'root ::= "{" [a-z]* "}"'


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kw", "error", "field"),
    [
        ({"grammar_triggers": ("x",) * (MAX_TRIGGERS + 1)}, GrammarLimitError, "grammar_triggers"),
        ({"grammar_triggers": ("a" * 513,)}, GrammarLimitError, "grammar_triggers[0]"),
        ({"grammar_triggers": ("ok", "(a+)+$")}, GrammarLimitError, "grammar_triggers[1]"),
        ({"grammar_triggers": ("(a|ab)*",)}, GrammarLimitError, "grammar_triggers[0]"),
        ({"grammar_triggers": ("((a)*)+",)}, GrammarLimitError, "grammar_triggers[0]"),
        ({"grammar_triggers": (r"\s*\s*a+x",)}, GrammarLimitError, "grammar_triggers[0]"),
        ({"grammar_triggers": ("a{2,}b*c+",)}, GrammarLimitError, "grammar_triggers[0]"),
        ({"grammar_triggers": ("(",)}, ConfigError, "grammar_triggers[0]"),
        ({"grammar_triggers": ("",)}, ConfigError, "grammar_triggers[0]"),
        ({"grammar_triggers": (3,)}, ConfigError, "grammar_triggers[0]"),
        ({"grammar_triggers": ("\ud800",)}, ConfigError, "grammar_triggers[0]"),
        ({"grammar_triggers": "abc"}, ConfigError, "grammar_triggers"),
        ({"grammar_trigger_tokens": (-1,)}, ConfigError, "grammar_trigger_tokens[0]"),
        ({"grammar_trigger_tokens": (1, "2")}, ConfigError, "grammar_trigger_tokens[1]"),
        ({"grammar_trigger_tokens": tuple(range(65))}, GrammarLimitError, "grammar_trigger_tokens"),
    ],
)
def test_hostile_triggers_are_typed_errors_naming_the_field(kw: dict, error: type, field: str) -> None:
    with pytest.raises(error) as exc:
        SamplingParams(grammar=G, **kw)
    assert field in str(exc.value)
    if error is GrammarLimitError:
        assert exc.value.field == field


@pytest.mark.parametrize(
    "pattern", [r"^\s*(\{)", r"[\s\S]*?(<tool_call>)[\s\S]*", r"(?:ab)?c", r"(x)+", r"^(\[TOOL_CALLS\])$", r"[(+*]+\*", r"a{2,5}"]
)
def test_ordinary_patterns_pass(pattern: str) -> None:
    assert check_triggers([pattern]) == (pattern,)


def test_triggers_need_a_grammar_and_the_grammar_is_still_checked() -> None:
    with pytest.raises(ConfigError, match="need a grammar"):
        SamplingParams(grammar_triggers=("x",))
    with pytest.raises(GrammarLimitError) as exc:
        SamplingParams.make(grammar=LazyGrammar('root ::= "a"{0,99999}', (Trigger("a"),)))
    assert exc.value.field == "grammar"


def test_make_unpacks_a_lazy_grammar() -> None:
    lazy = lazy_call_grammar(TOOL_FORMATS["hermes"].with_tokens({"<tool_call>": 7}), TOOLS)
    p = SamplingParams.make(grammar=lazy, max_tokens=8)
    assert p.lazy and p.grammar == lazy.grammar
    assert p.grammar_triggers == lazy.patterns and p.grammar_trigger_tokens == (7,)
    assert not SamplingParams(grammar=G).lazy
    with pytest.raises(ConfigError, match="carries its own triggers"):
        SamplingParams.make(grammar=lazy, grammar_triggers=["x"])
    with pytest.raises(ConfigError, match="LazyGrammar through SamplingParams.make"):
        SamplingParams(grammar=lazy)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- matching (llama.cpp's semantics)
def test_the_grammar_starts_at_the_first_non_empty_group() -> None:
    rx = [re.compile(r"(a)?(b)")]
    assert find_trigger(rx, "xxb") == 2  # group 1 did not match: group 2
    assert find_trigger([re.compile(r"x(y)")], "axy") == 2
    assert find_trigger([re.compile(r"xy")], "axy") == 1  # no group: the match's start
    assert find_trigger([re.compile(r"^(b)$")], "ab") is None
    assert find_trigger([re.compile(r"^a(b)$")], "ab") == 1  # ^…$: the whole text
    assert find_trigger([re.compile("q"), re.compile("b"), re.compile("a")], "ab") == 1  # first pattern in order


def test_the_watch_fires_on_text_split_across_tokens_and_on_trigger_tokens() -> None:
    w = TriggerWatch([Trigger(BARE_CALL_OPEN, at_start=True).pattern], [99])
    assert [w.observe(1, p) for p in (b" \n", b'{"na', b'me":', b' "')] == [None, None, None, 2]
    w = TriggerWatch([Trigger(BARE_CALL_OPEN, at_start=True).pattern], [99])
    assert w.observe(1, b"Sure ") is None and w.observe(2, b'{"name": "') is None  # not at the start
    assert w.observe(99, b"<tool_call>") == len('Sure {"name": "')
    w = TriggerWatch([], [])
    assert w.observe(1, "é".encode()[:1]) is None and w.observe(2, "é".encode()[1:]) is None and w.text == "é"


# --------------------------------------------------------------------------- per format
@pytest.mark.parametrize("name", list(TOOL_FORMATS))
def test_every_format_has_a_checked_lazy_grammar_whose_triggers_open_its_calls(name: str) -> None:
    fmt = TOOL_FORMATS[name]
    lazy = lazy_call_grammar(fmt, TOOLS)
    check_grammar(lazy.grammar, field="grammar")
    assert check_triggers(lazy.patterns) == lazy.patterns
    call = fmt.render_call([("lookup_metric", {"metric": "x"})])
    bare = '{"name": "lookup_metric", "arguments": {"metric": "x"}}'
    for text, at in ((call, 0), ("  " + bare, 2), ("Let me look.\n" + call, 13 if fmt.opener != '{"name"' else None)):
        assert lazy.find(text) == at, (name, text)
        rx = [re.compile(p) for p in lazy.patterns]
        assert find_trigger(rx, text) == at, (name, text)  # the sampler's regexes agree with the gate's literals
    assert lazy.find('{"answer": 4}') is None and lazy.find("Paris.") is None
    assert lazy_call_grammar(fmt, TOOLS) is lazy  # cached per tool set


def test_a_bound_format_triggers_on_its_opener_token() -> None:
    fmt = TOOL_FORMATS["hermes"].with_tokens({"<tool_call>": 151657, "</tool_call>": 151658})
    lazy = lazy_call_grammar(fmt, TOOLS)
    assert lazy.trigger_tokens == (151657,)
    assert "<tool_call>" in lazy.grammar and '"<tool_call>' not in lazy.grammar  # a token reference


def test_no_tools_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="at least one tool"):
        lazy_call_grammar(TOOL_FORMATS["hermes"], [])


# --------------------------------------------------------------------------- streaming
def _stream(gate: LazyCallGate, pieces: list[str]) -> list[str]:
    return [gate.push(p) for p in pieces]


def test_text_that_opens_with_a_brace_is_released_once_it_cannot_be_a_call() -> None:
    gate = LazyCallGate(lazy_call_grammar(TOOL_FORMATS["hermes"], TOOLS))
    assert _stream(gate, [" ", "{", '"', "answer", '": 4}']) == ["", "", "", ' {"answer', '": 4}']
    assert gate.decided == "text" and gate.finish(False) == ""


def test_a_bare_call_is_held_from_its_start() -> None:
    gate = LazyCallGate(lazy_call_grammar(TOOL_FORMATS["hermes"], TOOLS))
    assert _stream(gate, ["{", '"name', '": "', "lookup_metric", '"}']) == [""] * 5
    assert gate.decided == "tool" and gate.call_start == 0 and gate.held.startswith(BARE_CALL_OPEN)
    assert gate.finish(True) == ""


def test_text_streams_until_an_opener_and_holds_only_what_may_open_one() -> None:
    gate = LazyCallGate(lazy_call_grammar(TOOL_FORMATS["hermes"], TOOLS))
    assert _stream(gate, ["Let", " me", " check.\n<tool_"]) == ["Let", " me", " check.\n"]
    assert gate.decided == "text" and gate.held == "<tool_"
    assert _stream(gate, ["call>\n", '{"name": "x"}']) == ["", ""]
    assert gate.decided == "tool" and gate.shown == "Let me check.\n" and gate.call_start == len("Let me check.\n")


def test_a_reply_that_only_looked_like_a_call_is_released_at_the_end() -> None:
    gate = LazyCallGate(lazy_call_grammar(TOOL_FORMATS["envelope"], TOOLS))
    assert _stream(gate, ['{"name": "nope"']) == [""]
    assert gate.decided == "tool"
    assert gate.finish(False) == '{"name": "nope"' and gate.held == ""


def test_plain_text_goes_out_at_once() -> None:
    gate = LazyCallGate(lazy_call_grammar(TOOL_FORMATS["mistral"], TOOLS))
    assert _stream(gate, ["Paris", " is", " the capital [TOOL"]) == ["Paris", " is", " the capital "]
    assert gate.finish(False) == "[TOOL"
