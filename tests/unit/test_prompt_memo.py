"""The prompt value and incremental rendering (`agentmem.engine.prompt_memo`, `jinja_tail`, `jinja_locality`).

A call renders only what its conversation adds to a kept render; every test here holds the
incremental render to the whole render (`memo_tokens=0`) token for token and span for span.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import random
from pathlib import Path

import jinja2
import pytest

from agentmem import MemoryPool
from agentmem.engine import jinja_tail
from agentmem.engine.chat_format import RenderedPrompt, normalize_messages
from agentmem.engine.context import LlamaModel
from agentmem.engine.jinja_locality import is_local
from agentmem.engine.prompt_memo import RenderMemo, Sent
from agentmem.engine.renderer import ChatRenderer
from agentmem.errors import MessageError
from tests.fixtures.tiny_gguf import CHATML_TEMPLATE, QWEN2_TEMPLATE, build_tiny_gguf

TOOLS = [{"name": "f", "description": "look up",
          "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}]


@pytest.fixture(scope="module")
def qwen2(tiny_qwen2_path: Path):
    with LlamaModel(tiny_qwen2_path) as m:
        yield m


@pytest.fixture(scope="module")
def llama(tiny_model_path: Path):
    with LlamaModel(tiny_model_path) as m:
        yield m


def conversation(rng: random.Random, n: int) -> list[dict]:
    """A system prompt and `n` messages of every kind: user, assistant, tool calls (some with content), tool results."""
    msgs: list[dict] = [{"role": "system", "content": "Be brief."}]
    for i in range(n):
        kind = rng.choice(["user", "user", "assistant", "call", "tool"])
        if kind == "call":
            msgs.append({"role": "assistant", "content": rng.choice(["", "ok"]),
                         "tool_calls": [{"id": f"c{i}", "function": {"name": "f", "arguments": {"x": i}}}]})
        elif kind == "tool":
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i}"})
        else:
            msgs.append({"role": kind, "content": rng.choice(["", " hi there ", f"message {i}: the plan", "x\n"])})
    return msgs


def renders_of(renderer: ChatRenderer) -> list[int]:
    """A counter of the template's renders (wraps the renderer's sandboxed template)."""
    count = [0]
    tpl = renderer.format._tpl
    inner = tpl.render

    def counted(*args, **kwargs):
        count[0] += 1
        return inner(*args, **kwargs)

    tpl.render = counted
    return count


def _model(request, name):
    return request.getfixturevalue(name)


@pytest.mark.parametrize("model_name,fmt", [
    ("qwen2", "auto"), ("qwen2", "chatml"), ("qwen2", "gemma"), ("llama", "auto"), ("llama", "gemma"),
])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_incremental_render_equals_the_whole_render(request, model_name, fmt, tools):
    """Growing conversations (1 to 3 messages a call, every message kind, continued assistant turns):
    the render from the kept one has the whole render's tokens and spans, or raises the same error."""
    model = _model(request, model_name)
    inc, whole = ChatRenderer(model, fmt), ChatRenderer(model, fmt, memo_tokens=0)
    rng = random.Random(7)
    for _ in range(6):
        full = conversation(rng, 16)
        n = 1
        while n <= len(full):
            outcomes = []
            for r in (inc, whole):
                try:
                    outcomes.append(r.render(full[:n], tools=tools))
                except MessageError as exc:
                    outcomes.append(str(exc))
            assert outcomes[0] == outcomes[1], (fmt, n, full[:n])
            n += rng.choice([1, 2, 2, 3])


def test_a_call_adding_two_messages_renders_a_bounded_number_of_times(qwen2):
    """Issue 32: every call rendered the template once per message of the whole history (46 renders
    for 2 new messages after 44). Now the count is the same at 20 and at 200 messages."""
    r = ChatRenderer(qwen2)
    assert r.format.local
    counter = renders_of(r)
    counts = {}
    for n in (20, 200):
        full = conversation(random.Random(n), n + 10)
        r.render(full[:n])
        counter[0] = 0
        r.render(full[: n + 2])
        counts[n] = counter[0]
    assert counts[20] == counts[200] <= 12, counts


def test_a_template_that_rewrites_earlier_messages_is_rendered_whole(tmp_path, monkeypatch):
    """A template whose text for an earlier message changes when messages are added (here: every user
    message says how many there are) is caught by the text check and rendered whole, never trusted."""
    tpl = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.n = ns.n + 1 %}"
           "{% endif %}{% endfor %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
           "{% if m.role == 'user' %} ({{ ns.n }} asked){% endif %}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with LlamaModel(build_tiny_gguf(tmp_path / "rw.gguf", chat_template=tpl)) as model:
        inc, whole = ChatRenderer(model, "jinja"), ChatRenderer(model, "jinja", memo_tokens=0)
        assert not inc.format.local
        outcomes = []
        real = jinja_tail._from_whole
        monkeypatch.setattr(jinja_tail, "_from_whole", lambda *a: outcomes.append(real(*a)) or outcomes[-1])
        msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(9)]
        for n in range(1, 10, 2):
            assert inc.render(msgs[:n]) == whole.render(msgs[:n])
        assert outcomes and all(o is None for o in outcomes)  # every reuse refused


def test_a_kept_tool_turn_closed_later_is_rendered_again(qwen2):
    """Qwen2.5 closes a run of tool results after the last one: the kept last tool result's region
    changes when another result follows, and the render from the kept one still equals the whole."""
    inc, whole = ChatRenderer(qwen2), ChatRenderer(qwen2, memo_tokens=0)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "name": "f", "arguments": {}},
                                                                {"id": "b", "name": "f", "arguments": {}}]},
            {"role": "tool", "tool_call_id": "a", "content": "one"},
            {"role": "tool", "tool_call_id": "b", "content": "two"},
            {"role": "tool", "tool_call_id": "b", "content": "three"}]
    for n in range(2, len(msgs) + 1):
        assert inc.render(msgs[:n], tools=TOOLS) == whole.render(msgs[:n], tools=TOOLS)


def test_the_same_request_renders_once(qwen2):
    """The server renders a request for the line lookup, the prompt limit and the call: one render."""
    r = ChatRenderer(qwen2)
    counter = renders_of(r)
    msgs = conversation(random.Random(3), 12)
    first = r.render(msgs, tools=TOOLS)
    n = counter[0]
    assert r.render([dict(m) for m in msgs], tools=TOOLS) is first
    assert counter[0] == n


def test_a_template_reading_the_clock_renders_every_time(tmp_path):
    """A template that calls `strftime_now` may render the same messages differently tomorrow."""
    tpl = "{{ strftime_now('%Y') }}" + CHATML_TEMPLATE
    with LlamaModel(build_tiny_gguf(tmp_path / "clock.gguf", chat_template=tpl)) as model:
        r = ChatRenderer(model, "jinja")
        assert r.format.volatile
        counter = renders_of(r)
        msgs = [{"role": "user", "content": "hi"}]
        r.render(msgs)
        n = counter[0]
        r.render(msgs)
        assert counter[0] > n


def test_validation_is_not_skipped_for_a_value_of_another_type(qwen2):
    """A kept conversation whose message had `pin: True` must not vouch for one with `pin: 1`
    (equal in Python, refused by validation); errors name the index in the whole conversation."""
    r = ChatRenderer(qwen2)
    msgs = [{"role": "user", "content": "a", "pin": True}, {"role": "assistant", "content": "b"}]
    r.render(msgs)
    with pytest.raises(MessageError, match=r"messages\[0\]\.pin"):
        r.render([{"role": "user", "content": "a", "pin": 1}, *msgs[1:]])
    with pytest.raises(MessageError, match=r"messages\[3\]\.role"):
        r.render([*msgs, {"role": "user", "content": "c"}, {"role": "robot", "content": "d"}])


def test_an_old_message_edited_by_the_client_is_detected(qwen2):
    """The memo compares the old messages' bytes, not per-message hashes (issue 32): an edit anywhere in the
    history, by one character, by the type of a nested value (`1` to `1.0`) or in place in the caller's own
    objects after the call, gives the whole render of the edited conversation, never the kept one."""
    inc, whole = ChatRenderer(qwen2), ChatRenderer(qwen2, memo_tokens=0)
    msgs = conversation(random.Random(11), 30)
    msgs[3] = {"role": "user", "content": [{"type": "text", "text": "part one"}]}
    msgs[4] = {"role": "assistant", "content": "",
               "tool_calls": [{"id": "c9", "function": {"name": "f", "arguments": {"x": 1}}}]}
    msgs[5] = {"role": "tool", "tool_call_id": "c9", "content": "done"}
    extra = [{"role": "assistant", "content": "next"}, {"role": "user", "content": "go on"}]

    def edited(k: int, change) -> list[dict]:
        out = copy.deepcopy(msgs) + extra
        change(out[k])
        return out

    edits = [
        edited(1, lambda m: m.update(content=m["content"] + ".")),
        edited(4, lambda m: m["tool_calls"][0]["function"]["arguments"].update(x=1.0)),
        edited(4, lambda m: m["tool_calls"][0]["function"]["arguments"].update(x=True)),
        edited(0, lambda m: m.update(role="user")),
    ]
    for conv in edits:
        inc.render(msgs)
        assert inc.render(conv) == whole.render(conv)
    inc.render(msgs)
    msgs[3]["content"][0]["text"] = "part two"  # the caller's own object, changed after the call
    assert inc.render(msgs + extra) == whole.render(msgs + extra)


def test_equal_messages_built_differently_match_the_kept_render(qwen2):
    """Messages parsed from JSON, copied, or holding the caller's own shared strings are the same
    bytes (`marshal` format 2 writes no back-references by identity), so each call reuses the kept
    render; `Message` values among the dicts are compared by their keys and reused too."""
    r = ChatRenderer(qwen2)
    counter = renders_of(r)
    text = "shared " * 3
    msgs = [{"role": "system", "content": text}] + conversation(random.Random(5), 20)
    msgs[6] = {"role": "user", "content": text}
    r.render(msgs)
    for same in (json.loads(json.dumps(msgs)), copy.deepcopy(msgs), [dict(m) for m in msgs]):
        counter[0] = 0
        r.render(same)
        assert counter[0] == 0
    assert Sent(msgs).body == Sent(json.loads(json.dumps(msgs))).body
    mixed = [*msgs[:-1], *normalize_messages(msgs[-1:])]
    whole = ChatRenderer(qwen2, memo_tokens=0)
    assert r.render(mixed) == whole.render(mixed)
    counter[0] = 0
    grown = [*mixed, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
    assert r.render(grown) == whole.render(grown)
    assert 0 < counter[0] <= 12


def test_the_prompt_value_is_immutable(qwen2):
    prompt = ChatRenderer(qwen2).render([{"role": "user", "content": "hi"}])
    assert isinstance(prompt, RenderedPrompt)
    with pytest.raises(dataclasses.FrozenInstanceError):
        prompt.tokens = []  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        prompt.spans = []  # type: ignore[misc]


def test_a_prompt_extending_a_kept_one_makes_its_token_list_when_read(qwen2):
    """Issue 32: each call copied the kept token list into the new prompt value (11,500 ints at 400
    messages). It now joins the kept arrays only; `tokens` is made from `ids` when read, and the value
    still compares, copies and pickles as one with a token list."""
    r, whole = ChatRenderer(qwen2), ChatRenderer(qwen2, memo_tokens=0)
    msgs = conversation(random.Random(2), 12)
    r.render(msgs[:10])
    grown = r.render(msgs)
    assert grown._tokens is None and len(grown) == len(grown.ids)
    assert grown == whole.render(msgs) and grown.tokens == whole.render(msgs).tokens
    for other in (copy.deepcopy(grown), pickle.loads(pickle.dumps(grown))):
        assert other == grown and other.tokens == grown.tokens and not other.ids.flags.writeable


def test_the_memo_keeps_at_most_its_token_budget(qwen2):
    r = ChatRenderer(qwen2, memo_tokens=200)
    for i in range(20):
        r.render([{"role": "user", "content": f"conversation {i} " * 5}])
    assert 0 < len(r.memo) < 20
    assert r.memo._tokens <= 200
    r.memo.clear()
    assert len(r.memo) == 0 and isinstance(r.memo, RenderMemo)


@pytest.mark.parametrize("source,local", [
    (QWEN2_TEMPLATE, True),
    (CHATML_TEMPLATE, True),
    ("{% for m in messages %}{% if loop.index0 % 2 == 0 %}U{% endif %}{{ m.content }}{% endfor %}", True),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{{ messages|length }}", False),
    ("{% for m in messages %}{{ loop.index }}{{ m.content }}{% endfor %}", False),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{{ messages[-1].role }}", False),
    ("{% set ns = namespace(a=0) %}{% for m in messages %}{% set ns.a = ns.a + 1 %}{{ ns.a }}{% endfor %}", False),
    ("{% for m in messages if m.role != 'system' %}{{ m.content }}{% endfor %}", False),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% for m in messages %}{% endfor %}", False),
    ("{% for m in messages %}{{ messages[loop.index0 - 2].content }}{% endfor %}", False),
    ("{% for m in messages %}{{ loop.revindex }}{% endfor %}", False),
])
def test_locality_is_read_from_the_template(source, local):
    """Only a template that writes each message from its neighbours, the first message and its
    position's parity may be rendered from a window (`agentmem.engine.jinja_locality`)."""
    assert is_local(jinja2.Environment(), source) is local


def test_find_line_then_chat_renders_the_prompt_once(tiny_model_path):
    """An anonymous call looks its line up on the prompt and runs it: the call reuses the lookup's render."""
    with MemoryPool(model=tiny_model_path, n_ctx=2048, n_threads=1) as pool:
        counter = renders_of(pool.renderer)
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]
        line = pool.find_line(msgs)
        n = counter[0]
        try:
            pool.chat(line.agent_id, msgs, max_tokens=1)
        finally:
            pool.release_line(line.agent_id)
        assert counter[0] == n


@pytest.mark.parametrize("tail", [256, 1, 2])
def test_line_marks_from_the_arrays_match_the_spans(monkeypatch, tail):
    """`line_marks` reads the ledger's arrays instead of building every span (a lookup re-indexes its
    agent on every call), from the end back in growing windows (issue 32: the whole ledger was read on
    every lookup); it answers what the span walk answered, on random histories, whatever the window."""
    from agentmem.pool import lines

    monkeypatch.setattr(lines, "_TAIL", tail)
    from agentmem.engine.chat_format import Span
    from agentmem.memory.ledger import Ledger
    from agentmem.pool.lines import LINE_REGIONS, line_marks

    def by_spans(led):
        spans = led.spans
        for j in range(len(spans) - 1, -1, -1):
            sp = spans[j]
            if sp.message >= 0 and sp.region in LINE_REGIONS:
                after = spans[j + 1] if j + 1 < len(spans) else None
                return sp.end, after.end if after is not None and after.message == -1 else sp.end
        return None

    rng = random.Random(5)
    for _ in range(300):
        led, pos, spans = Ledger(), 0, []
        for k in range(rng.randint(0, 6)):
            n = rng.randint(1, 4)
            region = rng.choice(["system", "user", "assistant", "tool_call", "tool_result", "text"])
            spans.append(Span(pos, pos + n, region, rng.choice([-1, k]), rng.random() < 0.2))
            pos += n
        led.extend(list(range(pos)), spans)
        assert line_marks(led) == by_spans(led)


def test_ledger_tags_from_spans_match_the_span_walk():
    """`Ledger.extend` skips the spans before its tokens and `retag` fills contiguous spans in one
    numpy pass (they walked every span of the history on every call); the tags are the same."""
    from agentmem.engine.chat_format import REGIONS, Span
    from agentmem.memory.ledger import Ledger

    def walked(n_hist, spans, n):
        reg, msg = ["text"] * n_hist, [-1] * n_hist
        for s in spans:
            for t in range(s.start, min(s.end, n)):
                reg[t], msg[t] = s.region, s.message
        return reg, msg

    rng = random.Random(11)
    for _ in range(200):
        spans, pos = [], rng.choice([0, 1])
        for k in range(rng.randint(1, 8)):
            n = rng.randint(1, 5)
            spans.append(Span(pos, pos + n, rng.choice(REGIONS), rng.choice([-1, k])))
            pos += n + (1 if rng.random() < 0.15 else 0)  # a gap now and then
        cut = rng.randint(0, pos)
        led = Ledger()
        led.extend(list(range(cut)), spans)
        led.extend(list(range(cut, pos)), spans)
        assert ([REGIONS[c] for c in led.regions], led.messages.tolist()) == walked(pos, spans, pos)
        n = rng.randint(0, pos)
        led.retag(n, spans)
        reg, msg = walked(pos, spans, n)
        assert [REGIONS[c] for c in led.regions[:n]] == reg[:n] and led.messages[:n].tolist() == msg[:n]
