"""Free tool calls made canonical as they are generated (`agentmem.tools.canonical`, `agentmem.pool.canon`).

Regression guard for issue 16's diagnosis: on Qwen2.5 with tools offered freely the model
wrote its call as a bare `{"name": ...}` object, the next prompt rendered it inside
`<tool_call>` tags, and the whole call was prefilled again on every tool call. The turn's
decode loop is driven here on fakes (a toy vocabulary, a decoder that replays a script),
so every branch of the decision is checked without a model.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from types import SimpleNamespace
from typing import Any, Iterator, Sequence

import pytest

from agentmem.engine.sampling import SamplingParams, TextAssembler
from agentmem.errors import ConfigError
from agentmem.pool import residence
from agentmem.pool.state import AgentState
from agentmem.pool.blocks import BlockRefs
from agentmem.pool.sequence import Sequences
from agentmem.pool.window import NoWindow
from agentmem.pool.turn import TurnRunner
from agentmem.tools.canonical import BareCallWatch, bare_call_watch, watch_for
from agentmem.tools.formats import TOOL_FORMATS, get_tool_format

HERMES = get_tool_format("hermes")
NAMES = ("lookup_metric", "send_email")


# --------------------------------------------------------------------------- the decision
@pytest.mark.parametrize(
    ("lead", "verdict"),
    [
        ("", None), ("  \n", None), ("{", None), ('{"', None), ('{"name": "look', None),
        ('{"name": "lookup_metric"', True), ('\n{ "name" :"send_email", "arg', True),
        ('{"name": "lookup_metric_2"', False),  # another name: no call to an offered tool
        ('{"name": "Alice", "age": 3}', False),  # JSON the user asked for
        ('{"answer": 42}', False), ("Sure, let me", False), ("<tool_call>", False),  # already canonical
        ("```json\n{", False),
    ],
)
def test_the_watch_decides_from_the_first_characters(lead: str, verdict: bool | None) -> None:
    assert bare_call_watch(HERMES, NAMES).decide(lead) is verdict  # type: ignore[union-attr]


def test_a_name_that_prefixes_another_waits_for_its_closing_quote() -> None:
    w = BareCallWatch(opening="<tool_call>\n", heads=['{"name": "f"', '{"name": "fg"'])
    assert w.decide('{"name": "f') is None and w.decide('{"name": "fg"') is True and w.decide('{"name": "f"') is True


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_every_format_opening_and_heads_rebuild_its_rendered_call(name: str) -> None:
    """Contract: opening + head is how `render_call` starts, so the KV ends up as the template's text."""
    fmt = TOOL_FORMATS[name]
    w = bare_call_watch(fmt, NAMES)
    if not fmt.bare_opening:
        assert w is None and fmt.bare_heads(NAMES) == ()  # envelope, llama3: the bare object is no call / is canonical
        return
    assert w is not None
    for n, head in zip(NAMES, fmt.bare_heads(NAMES)):
        text = fmt.render_call([(n, {"x": 1})])
        assert text.startswith(fmt.bare_opening + head), (text, head)
        assert w.decide(text[len(fmt.bare_opening):]) is True
        assert w.written_back(text) == text
    # an unclosed Hermes call still parses (its body runs to the end), so it can be closed
    assert bare_call_watch(HERMES, NAMES).written_back('<tool_call>\n{"name": "send_email", "arguments": {}}') == (  # type: ignore[union-attr]
        HERMES.render_call([("send_email", {})]))


def test_watch_for_needs_a_native_wrapping_format_names_and_a_bool() -> None:
    w = watch_for(HERMES, ["lookup_metric"])
    assert w is not None and w.decide('{"name": "lookup_metric"') is True
    assert watch_for(HERMES, ["lookup_metric"], False) is None and watch_for(HERMES, []) is None
    assert watch_for(get_tool_format("envelope"), ["lookup_metric"]) is None
    assert watch_for(get_tool_format("llama3"), ["lookup_metric"]) is None
    with pytest.raises(ConfigError, match="canonical_calls"):
        watch_for(HERMES, ["lookup_metric"], "yes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the decode loop, on fakes
VOCAB = [
    "<eog>", "<tool_call>", "</tool_call>", "\n", " ", '{"', "name", '":', ' "', "lookup", "_metric", '",', "arguments",
    ' {"', "metric", "p99", '"}}', '"}}\n', "Hello", " there", "answer", " 42", "}", "Alice", ' {',
]
ID = {t: i for i, t in enumerate(VOCAB)}
EOG = ID["<eog>"]


class FakeModel:
    """A toy vocabulary: tokenize is greedy longest match, as a BPE would split these texts."""

    def token_bytes(self, tok: int) -> bytes:
        return b"" if tok == EOG else VOCAB[tok].encode()

    def is_eog(self, tok: int) -> bool:
        return tok == EOG

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            t = max((v for v in VOCAB[1:] if text.startswith(v, i)), key=len)
            out.append(ID[t])
            i += len(t)
        return out


    def tokenize_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
        return self.tokenize("".join(t for t, _ in pieces))


class FakeCtx:
    def __init__(self) -> None:
        self.removed: list[tuple[int, int, int]] = []

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.removed.append((seq, p0, p1))


class FakeCore:
    def __init__(self) -> None:
        self.model, self.ctx = FakeModel(), FakeCtx()
        self.lock = threading.RLock()
        self.capacity = 1000
        self.totals: dict[str, int] = defaultdict(int)

    def budget(self, a: AgentState) -> int:
        return 0


class ScriptDecoder:
    """Decodes into the agent's ledger and samples the next token of `script` (the model's choices)."""

    def __init__(self, script: Sequence[int]) -> None:
        self.script = list(script)
        self.prefills: list[list[int]] = []

    def _next(self) -> int:
        return self.script.pop(0) if self.script else EOG

    def step(self, a: AgentState, tok: int, sampler: Any, t: Any) -> int:
        a.ledger.extend([tok])
        return self._next()

    def prefill(self, a: AgentState, tokens: Sequence[int], spans: Any, sampler: Any, t: Any) -> int | None:
        self.prefills.append(list(tokens))
        a.ledger.extend(tokens)
        return self._next() if sampler is not None else None


def toks(*pieces: str) -> list[int]:
    return [ID[p] for p in pieces]


PROMPT = toks("Hello", "\n")
CALL = toks('{"', "name", '":', ' "', "lookup", "_metric", '",', ' "', "arguments", '":', ' {"', "metric", '":', ' "', "p99", '"}}')
CANONICAL = '<tool_call>\n{"name": "lookup_metric", "arguments": {"metric": "p99"}}\n</tool_call>'



def drive(gen: Iterator[str]) -> tuple[list[str], Any]:
    """The pieces a `_generate` generator yields, and the finish reason it returns."""
    pieces = []
    try:
        while True:
            pieces.append(next(gen))
    except StopIteration as stop:
        return pieces, stop.value


def script_runner(script: list[int]) -> tuple[FakeCore, ScriptDecoder, TurnRunner, AgentState]:
    """A turn loop over the fakes whose decoder replays `script` (its first token is the prefill's), and a resident agent."""
    core = FakeCore()
    dec = ScriptDecoder(script[1:])
    runner = TurnRunner(core, mover=None, sharing=None, decoder=dec,  # type: ignore[arg-type]
                        after_call=lambda _: None)
    a = AgentState("a")
    seqs = Sequences(core.ctx, BlockRefs(core), core.totals, window=NoWindow())  # type: ignore[arg-type]
    residence.seat(a, seqs.open(a, 0, fit=lambda attempt: attempt()))
    return core, dec, runner, a


def run(script: list[int], *, names: tuple[str, ...] | None = NAMES, **params: Any) -> tuple[list[str], str, Any, list[int]]:
    """Generate `script` through the turn loop: (streamed pieces, finish, what was used, ledger tokens)."""
    core, dec, runner, a = script_runner(script)
    a.ledger.extend(PROMPT)
    p = SamplingParams.make(**{"max_tokens": 64, **params})
    asm = TextAssembler(p.stop)
    completion: list[int] = []
    watch = bare_call_watch(HERMES, names) if names else None
    gen: Iterator[str] = runner._generate(a, script[0], object(), p, asm, completion, None, watch)  # type: ignore[arg-type]
    pieces, finish = drive(gen)
    pieces.append(asm.flush())
    assert "".join(pieces) == asm.text, (pieces, asm.text)  # the stream is the text
    used = SimpleNamespace(core_=core, dec_=dec, completion_=completion, asm_=asm)
    return pieces, finish, used, a.ledger.tokens.tolist()


def test_a_bare_call_is_rewritten_with_its_opening_and_closed_as_the_template_writes_it() -> None:
    pieces, finish, r, kv = run([*CALL, EOG])
    assert finish == "stop" and r.asm_.text == CANONICAL
    assert kv == PROMPT + FakeModel().tokenize(CANONICAL), [VOCAB[t] for t in kv]  # the KV holds the template's text
    assert r.completion_ == kv[len(PROMPT):]
    assert r.core_.ctx.removed[0] == (0, len(PROMPT), -1)  # the held tokens were cut from the prompt's end
    assert r.core_.totals["canonical_calls"] == 1 and r.core_.totals["closed_calls"] == 1
    assert pieces[0].startswith("<tool_call>\n{"), pieces  # nothing of the bare object streamed before the opening


def test_leading_whitespace_before_the_bare_call_is_dropped() -> None:
    _, _, r, kv = run([ID["\n"], *CALL, EOG])
    assert r.asm_.text == CANONICAL and kv == PROMPT + FakeModel().tokenize(CANONICAL)


def test_a_call_the_model_closes_itself_needs_no_closing() -> None:
    _, _, r, kv = run([*CALL[:-1], ID['"}}\n'], ID["</tool_call>"], EOG])
    assert r.asm_.text == CANONICAL and r.core_.totals["closed_calls"] == 0
    assert kv == PROMPT + FakeModel().tokenize(CANONICAL)


def test_a_native_call_left_unclosed_is_closed_too() -> None:
    """The model wrote `<tool_call>` itself (no rewrite) but ended before `</tool_call>`."""
    _, _, r, kv = run([ID["<tool_call>"], ID["\n"], *CALL, EOG])
    assert r.core_.totals["canonical_calls"] == 0 and r.core_.totals["closed_calls"] == 1
    assert r.asm_.text == CANONICAL and kv == PROMPT + FakeModel().tokenize(CANONICAL)


@pytest.mark.parametrize(
    "script",
    [
        toks("Hello", " there"),  # text
        toks('{"', "answer", '":', " 42", "}"),  # JSON naming no tool
        toks('{"', "name", '":', ' "', "Alice", '",'),  # JSON with a name that is no tool
        toks('{"'),  # ends undecided
    ],
)
def test_other_replies_stay_as_the_model_wrote_them(script: list[int]) -> None:
    _, finish, r, kv = run([*script, EOG])
    assert finish == "stop" and r.asm_.text == "".join(VOCAB[t] for t in script)
    assert kv == PROMPT + script and r.completion_ == script and not r.core_.ctx.removed
    assert r.core_.totals["canonical_calls"] == 0


def test_without_a_watch_a_bare_call_is_kept_as_written() -> None:
    """The old behaviour, kept for `canonical_calls=False` (tool_choice `none`)."""
    _, _, r, kv = run([*CALL, EOG], names=None)
    assert r.asm_.text == "".join(VOCAB[t] for t in CALL) and kv == PROMPT + CALL


def test_max_tokens_while_undecided_ends_the_reply_as_written() -> None:
    _, finish, r, kv = run([*CALL, EOG], max_tokens=3)
    assert finish == "length" and r.completion_ == CALL[:3] and r.asm_.text == '{"name":'
    assert not r.core_.ctx.removed


def test_an_opening_that_would_not_fit_max_tokens_is_not_inserted() -> None:
    _, finish, r, _ = run([*CALL, EOG], max_tokens=8)  # decided after 7 tokens; 2 more for the opening
    assert finish == "length" and r.asm_.text.startswith('{"name"') and r.core_.totals["canonical_calls"] == 0


def test_a_stop_string_inside_the_opening_keeps_the_reply_as_written() -> None:
    _, _, r, _ = run([*CALL, EOG], stop=["\n"])
    assert r.core_.totals["canonical_calls"] == 0 and r.asm_.text == "".join(VOCAB[t] for t in CALL)


def test_a_stop_string_in_the_call_stops_it_as_before() -> None:
    _, finish, r, _ = run([*CALL, EOG], stop=["p99"])
    assert finish == "stop" and r.core_.totals["closed_calls"] == 0
    assert r.asm_.text == '<tool_call>\n{"name": "lookup_metric", "arguments": {"metric": "'


# --------------------------------------------------------------------------- the callers' choices
def test_tool_choice_none_turns_the_rewrite_off_in_the_server_and_the_integrations() -> None:
    pytest.importorskip("fastapi")
    from agentmem.server.call_request import ChatCallRequest
    from agentmem.server.calls import chat_call
    from agentmem.server.schemas import ChatCompletionRequest
    from agentmem.server.settings import ServerSettings

    tool = {"type": "function", "function": {"name": "lookup_metric", "parameters": {"type": "object", "properties": {}}}}

    def req(choice: str) -> ChatCallRequest:
        return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=[tool],
                                     tool_choice=choice).to_call()

    assert chat_call("a", req("none"), ServerSettings(), HERMES).sampling["canonical_calls"] is False
    assert "canonical_calls" not in chat_call("a", req("auto"), ServerSettings(), HERMES).sampling


def test_tool_choice_none_turns_the_rewrite_off_in_langchain() -> None:
    pytest.importorskip("langchain_core")
    from agentmem_langchain._plan import plan_call

    tools = [{"name": "lookup_metric", "description": "", "parameters": {"type": "object", "properties": {}}}]
    msgs = [{"role": "user", "content": "hi"}]
    assert plan_call("a", msgs, {}, HERMES, {"tools": tools, "tool_choice": "none"}).sampling["canonical_calls"] is False
    assert "canonical_calls" not in plan_call("a", msgs, {}, HERMES, {"tools": tools}).sampling


def test_tools_shown_but_not_offered_turn_the_rewrite_off_in_autogen() -> None:
    pytest.importorskip("autogen_core")
    from agentmem_autogen._plan import plan_call

    schema = {"name": "lookup_metric", "description": "", "parameters": {"type": "object", "properties": {}}}
    msgs = [{"role": "user", "content": "hi"}]
    kw = {"parallel": False, "force_tools": False, "speaker_selection": False}
    none = plan_call("a", msgs, {}, [schema], [schema], HERMES, "none", None, **kw)
    assert none.sampling["canonical_calls"] is False
    auto = plan_call("a", msgs, {}, [schema], [schema], HERMES, "auto", None, **kw)
    assert "canonical_calls" not in auto.sampling


def test_the_closing_tokenizes_the_format_markers_as_markup_and_the_call_as_text() -> None:
    """A marker that is a control token (Mistral's `[TOOL_CALLS]`) must come back as that token,
    as the template renders it; the call's own text never does."""
    from agentmem.pool.canon import CallCanon

    seen: list[list[tuple[str, bool]]] = []

    class Recording(FakeModel):
        def tokenize_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
            seen.append(list(pieces))
            return []

    core = FakeCore()
    core.model = Recording()
    CallCanon(core, None)._call_tokens(CANONICAL, HERMES.markers)  # type: ignore[arg-type]
    body = CANONICAL[len("<tool_call>"):-len("</tool_call>")]
    assert seen == [[("<tool_call>", True), (body, False), ("</tool_call>", True)]]


def test_the_pool_checks_canonical_calls_and_runs_a_free_call_with_tools(tiny_qwen2_path: Any) -> None:
    from agentmem import MemoryPool

    msgs = [{"role": "user", "content": "hi"}]
    tools = [{"name": "lookup_metric", "parameters": {"type": "object", "properties": {}}}]
    with MemoryPool(tiny_qwen2_path, n_ctx=512, n_batch=64, n_threads=1, resident_agents=1) as pool:
        assert pool.tool_format.name == "hermes"
        with pytest.raises(ConfigError, match="canonical_calls"):
            pool.chat("a", msgs, tools=tools, canonical_calls=1)  # type: ignore[arg-type]
        on = pool.chat("a", msgs, tools=tools, max_tokens=6)
        off = pool.chat("b", msgs, tools=tools, max_tokens=6, canonical_calls=False)
        assert on.text == off.text and on.tokens == off.tokens  # a random model's reply is no call: nothing changes
