"""Lazy call grammars: free text until the model opens a call, then the call's grammar.

With tools offered freely (`tool_choice: "auto"`) a reply may be text or a call. A forced
grammar would make every reply a call; no grammar lets a small model write a malformed
call (which then costs a second, forced decode). A *lazy* grammar does both in one
decode, as llama.cpp's lazy grammars do: the model writes freely until a **trigger**
matches the reply so far, and from the trigger's start on the grammar constrains every
token, so a call that was opened is a valid call of an offered tool.

* `Trigger` — a literal opening (`<tool_call>`, `{"name": "`), either at the start of the
  reply (after whitespace) or anywhere in it; `pattern` is the regular expression the
  sampler matches against the generated text (its first group marks where the grammar's
  input starts).
* `LazyGrammar` — the GBNF grammar, its triggers and the token ids that trigger it;
  `MemoryPool.chat(..., grammar=lazy)` and `SamplingParams.make(grammar=lazy)` take it.
* `lazy_call_grammar(fmt, tools)` — the lazy grammar of a free call turn in a tool format,
  built from the same call grammar a forced call decodes under (`ToolFormat.grammar`),
  plus the bare call object a model may write without the format's opening.
* `LazyCallGate` — a `CallGate` for streams: releases text as soon as no trigger can fire
  any more (text that opens with `{` but not as `{"name": "` goes out after a few
  characters, not at the end of the reply), and holds the call from its trigger on.

Example:
    >>> from agentmem.tools.formats import TOOL_FORMATS
    >>> tools = [{"name": "f", "parameters": {"type": "object", "properties": {}}}]
    >>> lazy = lazy_call_grammar(TOOL_FORMATS["hermes"], tools)
    >>> [(t.text, t.at_start) for t in lazy.triggers]
    [('<tool_call>', False), ('{"name": "', True)]
    >>> gate = LazyCallGate(lazy)
    >>> gate.push("{"), gate.push('"ans'), gate.decided
    ('', '{"ans', 'text')
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from agentmem.errors import ConfigError

from .formats import ToolFormat
from .grammar import _format, _literal, _parse
from .parse import CallGate

__all__ = ["BARE_CALL_OPEN", "LazyCallGate", "LazyGrammar", "Trigger", "lazy_call_grammar"]

BARE_CALL_OPEN = '{"name": "'
"""How a bare call object starts, as the grammars and `render_call` space it."""


@dataclass(frozen=True, slots=True)
class Trigger:
    """A literal text whose appearance in a reply starts the grammar.

    Attributes:
        text: the literal; the grammar's input starts with it.
        at_start: only at the start of the reply (after leading whitespace); `False`
            means anywhere (the text before it is the reply's content).
    """

    text: str
    at_start: bool = False

    @property
    def pattern(self) -> str:
        """The regular expression of this trigger (Python `re`; group 1 is the grammar's input start)."""
        body = "(" + re.escape(self.text) + ")"
        return r"^\s*" + body if self.at_start else body

    def find(self, text: str) -> int | None:
        """Where this trigger starts in `text` (the grammar's input start), or `None`."""
        if self.at_start:
            lead = len(text) - len(text.lstrip())
            return lead if text.startswith(self.text, lead) else None
        j = text.find(self.text)
        return None if j == -1 else j

    def may_fire(self, text: str) -> bool:
        """Whether more text could still make this trigger fire (it has not yet)."""
        if not self.at_start:
            return True
        s = text.lstrip()
        return self.text.startswith(s)

    def hold(self, text: str) -> int:
        """How many characters at the end of `text` may be the start of this trigger (held back)."""
        if self.at_start:
            return len(text) if self.may_fire(text) else 0
        for k in range(min(len(self.text) - 1, len(text)), 0, -1):
            if self.text.startswith(text[-k:]):
                return k
        return 0


@dataclass(frozen=True, slots=True)
class LazyGrammar:
    """A grammar that constrains a reply only from a trigger on (`SamplingParams.make(grammar=...)`).

    Attributes:
        grammar: GBNF, rule `root`, matching the reply from a trigger's start.
        triggers: the literal triggers.
        trigger_tokens: token ids that trigger the grammar when sampled (a format's
            single-token openers, such as Qwen2.5's `<tool_call>`), from that token on.
    """

    grammar: str
    triggers: tuple[Trigger, ...]
    trigger_tokens: tuple[int, ...] = ()

    @property
    def patterns(self) -> tuple[str, ...]:
        """The triggers as regular expressions (`SamplingParams.grammar_triggers`)."""
        return tuple(t.pattern for t in self.triggers)

    def find(self, text: str) -> int | None:
        """Where the first trigger (in order) that fires on `text` starts, or `None`."""
        for t in self.triggers:
            j = t.find(text)
            if j is not None:
                return j
        return None


# --------------------------------------------------------------------------- per format
def _bare_rule(rules: Mapping[str, str], n_tools: int) -> str:
    """The bare call object `{"name": "<tool>", "<args>": {...}}` over the format's `t<i>-call` rules."""
    alts = [f"t{i}-call" for i in range(n_tools)]
    missing = [a for a in alts if a not in rules]
    assert not missing, f"{missing=}, rules={sorted(rules)}"
    one = alts[0] if len(alts) == 1 else "( " + " | ".join(alts) + " )"
    return f"{_literal(BARE_CALL_OPEN)} {one} {_literal('}')}"


def _openings(fmt: ToolFormat) -> list[tuple[Trigger, str]]:
    """Each trigger of `fmt` with the root alternative it opens (`tc-root`: the format's call, `bare`)."""
    bare = Trigger(BARE_CALL_OPEN, at_start=True)
    if fmt.opener.startswith(BARE_CALL_OPEN[:7]):  # Llama 3: the call *is* the bare object, maybe after its tag
        tags = [m for m in fmt.markers if m not in BARE_CALL_OPEN]
        return [*((Trigger(m), f"{fmt._lit(m)} tc-root") for m in tags), (bare, "tc-root")]
    return [(Trigger(fmt.opener), "tc-root"), (bare, "bare")]


def _lazy(fmt: ToolFormat, tools: list[dict[str, Any]], parallel: bool) -> LazyGrammar:
    full = _parse(fmt.grammar(tools, parallel=parallel))
    rules = {("tc-root" if k == "root" else k): v for k, v in full.items()}
    openings = _openings(fmt)
    alts: list[str] = []
    for _trigger, alt in openings:
        if alt not in alts:
            alts.append(alt)
    if "bare" in alts:
        rules["bare"] = _bare_rule(rules, len(tools))
    tokens = tuple(fmt.tokens[t.text] for t, _ in openings if t.text in fmt.tokens)
    return LazyGrammar(_format({"root": " | ".join(alts), **rules}), tuple(t for t, _ in openings), tokens)


@functools.lru_cache(maxsize=256)
def _cached(fmt: ToolFormat, tools_json: str, parallel: bool) -> LazyGrammar:
    return _lazy(fmt, json.loads(tools_json), parallel)


def lazy_call_grammar(
    fmt: ToolFormat, tools: Sequence[Mapping[str, Any]], *, parallel: bool = False
) -> LazyGrammar:
    """The lazy grammar of a free tool turn in `fmt` over `tools` (cached per tool set).

    The grammar is the format's forced-call grammar (`ToolFormat.grammar`: the call exactly
    as the template writes it back) or, after the `{"name": "` of a reply that opens as a
    bare call object, one such object. Its triggers: the format's opening anywhere in the
    reply (`<tool_call>`, `[TOOL_CALLS]`, `{"tool_calls"`, Llama 3's `<|python_tag|>`), and
    `{"name": "` at the reply's start. A format bound to a vocabulary (`with_tokens`) also
    triggers on its opener's token id.

    Args:
        fmt: the model's tool-call syntax (`MemoryPool.tool_format`).
        tools: `{"name", "parameters"}` of the offered tools.
        parallel: allow several calls after the format's opening (a bare object is one call).

    Raises:
        ConfigError: no tools, a tool without a name, or a schema the converter cannot express.
    """
    tools = [dict(t) for t in tools]
    if not tools:
        raise ConfigError("a lazy call grammar needs at least one tool (tools is empty)")
    try:
        key = json.dumps(tools, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"tools must be JSON-serialisable: {exc}") from None
    return _cached(fmt, key, parallel and fmt.parallel)


# --------------------------------------------------------------------------- streaming
class LazyCallGate(CallGate):
    """Which streamed text of a free tool turn may be shown now, decided by the lazy grammar's triggers.

    Text goes out as soon as no trigger can fire on it: a reply that opens with `{` but
    not as `{"name": "` is released once it differs (after a few characters), and only the
    last characters that may still open a call anywhere (`<tool_c…`) are held. From a
    trigger's start on (the same text the sampler's grammar starts constraining at) the
    reply is a call: it is held, and `shown` is the content before it.

    Attributes:
        decided: `None` (the start is held), `"text"` (streaming; a call may still open
            later where the format allows one after text) or `"tool"` (a call opened).
        held: the text not shown (the call, from its trigger, once `decided == "tool"`).
        shown: all text shown so far.
        call_start: where the call starts in the reply's text, or `None`.
    """

    def __init__(self, lazy: LazyGrammar) -> None:
        super().__init__(lazy, "auto")
        self.lazy = lazy
        self.text = ""
        self.shown = ""
        self.call_start: int | None = None

    def push(self, piece: str) -> str:
        """Text to show for the generated `piece` (possibly `""`)."""
        self.text += piece
        if self.decided == "tool":
            self.held += piece
            return ""
        at = self.lazy.find(self.text)
        if at is not None:
            self.decided, self.call_start = "tool", at
            return self._release(at)
        if not any(t.at_start and t.may_fire(self.text) for t in self.lazy.triggers):
            self.decided = "text"
        keep = max((t.hold(self.text) for t in self.lazy.triggers if t.may_fire(self.text)), default=0)
        return self._release(len(self.text) - keep)

    def _release(self, upto: int) -> str:
        out = self.text[len(self.shown) : upto]
        self.shown += out
        self.held = self.text[len(self.shown) :]
        return out

    def finish(self, is_call: bool) -> str:
        """The held text to show at the end: none when the reply was read as a call, else all of it."""
        if is_call:
            return ""
        return self._release(len(self.text))
