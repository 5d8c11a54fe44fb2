"""A forced tool call's KV is the template's tokens of the call (`MemoryPool.chat`'s `opening`).

Regression guard: on Qwen2.5 a forced call's prefix went into the prompt as the content of
a final assistant message, tokenized as text (`<tool_call>` as several text tokens), while
the next prompt renders the call sent back with `<tool_call>` as markup; the next call of
the agent prefilled the whole call again (369-token prompt, the next one kept 372 of 417).
Now the prefix ends before a space (no token straddles the split) and the pool appends it
as the template renders a call, then makes the KV of opening + reply the template's tokens.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from agentmem.engine.chat_format import RenderedPrompt
from agentmem.engine.sampling import SamplingParams, TextAssembler
from agentmem.errors import ConfigError
from agentmem.pool.canon import CallCanon
from agentmem.tools.formats import get_tool_format
from agentmem.tools.grammar import split_forced_prefix

from tests.unit.test_canonical_calls import CANONICAL, VOCAB, FakeCore, FakeModel, drive, script_runner, toks  # the toy vocabulary, fakes

HERMES = get_tool_format("hermes")
CITY = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}}]


# --------------------------------------------------------------------------- the split
def test_a_forced_prefix_ends_before_a_space_and_the_grammar_starts_with_it() -> None:
    prefix, rest = HERMES.forced(CITY)
    assert prefix == '<tool_call>\n{"name": "get_weather", "arguments": {"city":', prefix
    assert rest.splitlines()[0].startswith('root ::= " \\""'), rest  # the space and the quote are generated


def test_a_prefix_that_already_ends_before_a_space_is_not_cut_further() -> None:
    nums = [{"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}]
    assert HERMES.forced(nums)[0].endswith('{"a":')  # ": " then the number: the space was already left out
    assert split_forced_prefix(HERMES.grammar(nums), at_space=True) == split_forced_prefix(HERMES.grammar(nums))


def test_a_token_named_by_its_text_stays_in_the_prefix() -> None:
    bound = HERMES.with_tokens({"<tool_call>": 7, "</tool_call>": 8})
    g = 'root ::= "x " <tool_call> "y"\n'
    assert split_forced_prefix(g, at_space=True)[0] == "x <tool_call>"
    assert bound.forced(CITY)[0].startswith("<tool_call>\n{")


# --------------------------------------------------------------------------- the pool's completion
OPENING = '<tool_call>\n{"name": "lookup_metric", "arguments":'
OPEN_TOKS = toks("<tool_call>", "\n", '{"', "name", '":', ' "', "lookup", "_metric", '",', ' "', "arguments", '":')


def forced_run(script: list[int], **params: Any) -> SimpleNamespace:
    """Generate `script` after `OPENING` through the turn loop, as `MemoryPool.chat(opening=...)` does."""
    core, dec, runner, a = script_runner(script)
    prompt, op = runner.canon.opening(RenderedPrompt(toks("Hello", "\n"), []), OPENING, HERMES)
    assert op.tokens == tuple(OPEN_TOKS) and prompt.tokens[2:] == OPEN_TOKS
    a.ledger.extend(prompt.tokens)
    p = SamplingParams.make(**{"max_tokens": 64, **params})
    asm = TextAssembler(p.stop)
    completion: list[int] = []
    gen = runner._generate(a, script[0], object(), p, asm, completion, None, None, op)  # type: ignore[arg-type]
    pieces, finish = drive(gen)
    pieces.append(asm.flush())
    assert "".join(pieces) == asm.text
    return SimpleNamespace(core=core, dec=dec, completion=completion, text=asm.text, finish=finish,
                           kv=a.ledger.tokens.tolist()[2:])


def test_the_reply_is_completed_to_the_template_tokens_and_counted() -> None:
    # the model stops before the closing, and its last token is not the one the whole text has
    r = forced_run(toks(' {"', "metric", '":', ' "', "p99", '"}}', "<eog>"))
    assert r.finish == "stop" and r.text == ' {"metric": "p99"}}\n</tool_call>'
    want = toks(*VOCAB_OF(CANONICAL))
    assert r.kv == want and r.kv == [*OPEN_TOKS, *r.completion]
    assert r.dec.prefills == [toks('"}}\n', "</tool_call>")]  # cut at the first differing token
    assert r.core.totals["closed_calls"] == 1 and r.core.totals["canonical_tokens"] == 2


def test_a_reply_already_in_template_tokens_is_left_alone() -> None:
    r = forced_run(toks(' {"', "metric", '":', ' "', "p99", '"}}\n', "</tool_call>", "<eog>"))
    assert r.text == CANONICAL[len(OPENING):] and r.dec.prefills == [] and r.core.totals["closed_calls"] == 0
    assert r.kv == toks(*VOCAB_OF(CANONICAL))


@pytest.mark.parametrize(("script", "params"), [
    (toks(" {", "Hello", "<eog>"), {}),  # no call
    (toks(' {"', "metric", '":', ' "', "p99", '"}}', "<eog>"), {"stop": ["</tool_call>"]}),  # a stop string in the closing
    (toks(' {"', "metric", '":', ' "', "p99"), {"max_tokens": 5}),  # cut by max_tokens: no end of turn
])
def test_other_ends_are_left_as_generated(script: list[int], params: dict[str, Any]) -> None:
    r = forced_run(script, **params)
    assert r.dec.prefills == [] and r.core.totals["closed_calls"] == 0
    assert r.kv == [*OPEN_TOKS, *r.completion][:len(r.kv)]  # (the last token of a cut reply is never decoded)


def VOCAB_OF(text: str) -> list[str]:
    return [VOCAB[t] for t in FakeModel().tokenize(text)]


def test_the_opening_is_appended_as_markup_and_text() -> None:
    seen: list[Any] = []

    class Recording(FakeModel):
        def tokenize_pieces(self, pieces: Any) -> list[int]:
            seen.append(list(pieces))
            return [1, 2, 3]

    core = FakeCore()
    core.model = Recording()
    canon = CallCanon(core, None)  # type: ignore[arg-type]
    prompt, op = canon.opening(RenderedPrompt([5, 6], []), '<tool_call>\n{"name": "f", "arguments":', HERMES)
    assert seen == [[("<tool_call>", True), ('\n{"name": "f", "arguments":', False)]]
    assert prompt.tokens == [5, 6, 1, 2, 3] and op.tokens == (1, 2, 3)
    assert [(s.start, s.end, s.region) for s in prompt.spans] == [(2, 5, "tool_call")]
    with pytest.raises(ConfigError, match="opening"):
        canon.opening(prompt, "", HERMES)


# --------------------------------------------------------------------------- the callers
def test_langchain_and_the_server_pass_a_native_forced_prefix_as_the_opening() -> None:
    pytest.importorskip("langchain_core")
    from agentmem_langchain._plan import plan_call

    pytest.importorskip("fastapi")
    from agentmem.server.calls import chat_call
    from agentmem.server.schemas import ChatCompletionRequest
    from agentmem.server.settings import ServerSettings

    msgs = [{"role": "user", "content": "weather?"}]
    tools = [{"name": "get_weather", "parameters": CITY[0]["parameters"]}]
    call = plan_call("a", msgs, {}, HERMES, {"tools": tools, "tool_choice": "get_weather"})
    assert call.mode == "tools" and call.sampling["opening"] == call.prefix and call.pool_messages() == msgs
    env = plan_call("a", msgs, {}, get_tool_format("envelope"), {"tools": tools, "tool_choice": "get_weather"})
    assert "opening" not in env.sampling and env.pool_messages()[-1] == {"role": "assistant", "content": env.prefix}
    req = ChatCompletionRequest(model="m", messages=msgs, tools=[{"type": "function", "function": tools[0]}],
                                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    sc = chat_call("a", req.to_call(), ServerSettings(), HERMES)
    assert sc.sampling["opening"] == sc.prefix and sc.pool_messages() == msgs


def test_autogen_passes_a_native_forced_prefix_as_the_opening() -> None:
    pytest.importorskip("autogen_core")
    from agentmem_autogen._plan import plan_call

    msgs = [{"role": "user", "content": "hi"}]
    schema = {"name": "get_weather", "description": "", "parameters": CITY[0]["parameters"]}
    plan = plan_call("a", msgs, {}, [schema], [schema], HERMES, "required", None,
                     parallel=False, force_tools=False, speaker_selection=False)
    assert plan.mode == "tools" and plan.prefix.startswith("<tool_call>")
    assert plan.sampling["opening"] == plan.prefix and plan.pool_messages() == msgs


# --------------------------------------------------------------------------- end to end on a tiny model
def test_the_call_after_a_forced_call_reuses_all_of_it(tmp_path: Any) -> None:
    """The grammar fixes the reply (an enum), so a random model writes a known call.

    The vocabulary has no space prefix, as Qwen2.5's byte-level BPE: the pool tokenizes a
    call's text on its own, which a SentencePiece space prefix would change (a known limit).
    """
    from agentmem import MemoryPool

    from tests.fixtures.tiny_gguf import QWEN2_TEMPLATE, build_tiny_gguf

    path = build_tiny_gguf(tmp_path / "q.gguf", arch="qwen2", chat_template=QWEN2_TEMPLATE, space_prefix=False)

    tools = [{"name": "set_mode", "parameters": {"type": "object", "properties": {
        "mode": {"type": "string", "enum": ["fast"]}}, "required": ["mode"]}}]
    msgs = [{"role": "user", "content": "go"}]
    with MemoryPool(path, n_ctx=2048, n_batch=128, n_threads=1, resident_agents=1) as pool:
        prefix, g = pool.tool_format.forced(tools)
        r1 = pool.chat("a", msgs, tools=tools, grammar=g, opening=prefix, max_tokens=64)
        calls = pool.tool_format.parse(prefix + r1.text)
        assert calls and calls[0].ok and calls[0].arguments == {"mode": "fast"}, r1.text
        assert r1.usage.prompt_tokens == pool.count_tokens(msgs, tools=tools) + len(
            pool.engine()._turns.canon._call_tokens(prefix, pool.tool_format.markers))
        follow = [*msgs, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "set_mode", "arguments": json.dumps({"mode": "fast"})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        r2 = pool.chat("a", follow, tools=tools, max_tokens=1)
        assert r2.usage.cached_tokens == r1.usage.prompt_tokens + r1.usage.completion_tokens, (r1.usage, r2.usage)
