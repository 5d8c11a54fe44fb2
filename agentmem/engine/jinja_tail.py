"""Rendering a jinja template from the last kept message on, checked against the whole conversation.

A chat template is code: what it writes for an earlier message may change when messages
are added (Qwen2.5 closes a tool turn only after the last tool result; Qwen3 drops the
reasoning of assistant turns before the last user query; a system prompt may name the
date). So a kept render (`JinjaState`, the last call's text, content spans and region
ends) is reused only after `render_from` has checked it against the template's render
of the whole new conversation:

1. the new render starts with the kept text up to the end of the last kept message but
   one (`P`): every earlier region is unchanged, character for character;
2. no region end of those messages read past `P` (`End.horizon`): each was decided by
   characters now checked;
3. the end of the message at `P` is the same in the new text (it was decided by the
   first character after it, which may have changed);
4. the new messages' contents are located with markers (`Markers`) in a second render,
   which must strip back to the same text.

Then only the messages from the last kept one on are split into regions (one or two small
renders each), and the renderer tokenizes only their segments. Checks 1 and 4 need the
template's text of the new conversation: `_from_whole` renders it whole (twice: plain, then
with markers), which costs time in proportion to the history; for a *local* template
(`agentmem.engine.jinja_locality`: each message written from its neighbours, the first message
and its position's parity) `_from_window` renders a window instead — the first message and the
last few — and checks the window's text for the kept messages in it against the kept text, so
a call costs the same at 50 messages and at 400. Any failed check, a kept render that held
control strings in its contents or tools, or a template that rewrites content renders the
conversation whole (`JinjaFormat._segments`): a template whose output for earlier messages
changes is detected, never trusted.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from agentmem.engine.chat_format import Controls, Message, TailRender, continues_turn
from agentmem.engine.jinja_text import Markers, refuse_controls_outside_content, tool_controls
from agentmem.errors import MessageError

__all__ = ["End", "JinjaState", "PrefixEnd", "TailFormat", "common_prefix", "render_from"]

End = tuple[int, int, "str | None", int]
"""Where a message's region ends: `(end, content_end, tail, horizon)`; `content_end` -1 and `tail`
None when the end came from rendering the prefix; `horizon`: characters of the render read to decide it."""


@dataclass(frozen=True, slots=True)
class JinjaState:
    """A kept jinja render: its text and, per message, where its region ends and what decided that.

    Attributes:
        text: the render (cut after a continued final assistant message).
        spans: `(start, end, message)` content spans of `text` (message -2: a string of the tools).
        ends: per message, its `End`.
        prevs: per message, where the segments so far end (the start of the next message's).
        horizon: per message, the farthest character any region end up to it read.
        unsplit: the render cannot seed the next one (control strings in content, or a template
            that rewrites content): render whole.
        bare: empty contents were rendered without markers (a template testing `if content`):
            the contents of a render from here are located the same way, as a whole render would.
    """

    text: str
    spans: tuple[tuple[int, int, int], ...]
    ends: tuple[End, ...]
    prevs: tuple[int, ...]
    horizon: tuple[int, ...]
    unsplit: bool
    bare: bool

    @property
    def n(self) -> int:
        """Messages rendered."""
        return len(self.ends)

    def kept_spans(self, at: int) -> int:
        """How many content spans end by `at` (the ones a render from there keeps)."""
        return bisect.bisect_right(self.spans, at, key=lambda s: s[1])

    @staticmethod
    def extended(
        base: JinjaState | None, start: int, text: str, spans: list[tuple[int, int, int]], ends: list[End],
        prevs: list[int], unsplit: bool, bare: bool,
    ) -> JinjaState:
        """The state of a render that kept `base`'s messages before `start` and computed `ends` from there."""
        horizon = list(base.horizon[:start]) if base is not None else []
        h = horizon[-1] if horizon else 0
        for e in ends:
            h = max(h, e[3])
            horizon.append(h)
        kept_ends = base.ends[:start] if base is not None else ()
        return JinjaState(text, tuple(spans), (*kept_ends, *ends), tuple(prevs), tuple(horizon), unsplit, bare)


PrefixEnd = Callable[[int], "tuple[int, int] | None"]
"""Where message `k`'s region ends and the horizon of that answer, for a message whose content was
not located (from a render of its prefix); None when it cannot be said."""

class TailFormat(Protocol):
    """What a render from a kept one needs of `agentmem.engine.jinja_format.JinjaFormat`."""

    local: bool
    _tools: Any  # the tools shown to this render (a context variable)

    def _prepared(self, messages: Sequence[Message]) -> list[Message]: ...

    def _render(self, msgs: Sequence[Message], gen: bool, bos: str, eos: str,
                contents: Sequence[str] | None = None) -> str: ...

    def _tail(self, messages: Sequence[Message], k: int, bos: str, eos: str, marks: Markers) -> str | None: ...

    def finish(self, messages: Sequence[Message], calls: Any, cont: bool, full: str, spans: list[tuple[int, int, int]],
               marks: Markers, bos: str, eos: str, base: JinjaState | None, *, start: int = 0,
               part: PrefixEnd | None = None) -> TailRender | None: ...


_LOOKBACK = 8  # messages before the last kept one a render from the kept one may start at


def render_from(
    fmt: TailFormat, messages: Sequence[Message], kept: int, state: Any, bos: str, eos: str, controls: Controls | None,
) -> TailRender | None:
    """Segments from (about) message `kept - 1` on, after the checks of the module docstring; None: render whole.

    It starts at the last kept message, or earlier when the message before that has no located
    content (its end came from a prefix render, which check 3 cannot repeat). Runs inside
    `JinjaFormat.render_tail` (its deadline and tools set).
    """
    n = len(messages)
    if not isinstance(state, JinjaState) or state.unsplit or kept < 2 or state.n != kept or kept > n:
        return None
    start = kept - 1
    while start > 1 and state.ends[start - 1][2] is None and kept - start < _LOOKBACK:
        start -= 1
    at, anchor, tail, _ = state.ends[start - 1]
    p = state.prevs[start - 1]
    if tail is None or (start >= 2 and state.horizon[start - 2] > p):
        return None
    i = state.kept_spans(p)
    if i < len(state.spans) and state.spans[i][0] < p:
        return None  # a kept content span runs past P
    shown = fmt._tools.get()
    if controls is not None:
        refuse_controls_outside_content(messages, controls, start=start)
        if any(controls(messages[k].content) for k in range(start, n)) or tool_controls(shown, controls):
            return None  # the whole render's checks apply (and refuse what they refuse)
    calls = {k: bool(messages[k].tool_calls) for k in range(start, n)}
    cont = continues_turn(messages)
    got = _from_window(fmt, messages, start, state, bos, eos, cont, shown) if fmt.local and start >= 4 else None
    if got is None:
        got = _from_whole(fmt, messages, start, state, bos, eos, cont, shown)
        if got is None:
            return None
    full, found, prepared, marks, part = got
    if anchor + common_prefix(tail, full[anchor : anchor + len(tail)]) != at:
        return None  # the last kept message before `start` ends elsewhere now
    spans = [*state.spans[:i], *found]
    return fmt.finish(prepared, calls, cont, full, spans, marks, bos, eos, state, start=start, part=part)


Found = tuple[str, list[tuple[int, int, int]], list[Message], Markers, "PrefixEnd | None"]
"""The new conversation's text, its content spans from message `start` on, the messages as the template
got them, the markers that located the spans, and how an unlocated message's region end is found."""


def _from_whole(
    fmt: TailFormat, messages: Sequence[Message], start: int, state: JinjaState, bos: str, eos: str, cont: bool,
    shown: Any,
) -> Found | None:
    """Checks 1 and 4 on two renders of the whole conversation (plain, then markers on the new contents)."""
    n = len(messages)
    p = state.prevs[start - 1]
    prepared = fmt._prepared(messages)
    full = fmt._render(prepared, not cont, bos, eos)
    if not full.startswith(state.text[:p]):
        return None  # the template writes an earlier message differently now
    marks = Markers(prepared, shown)
    contents = [m.content for m in prepared]
    bare = state.bare  # as the whole render chose (it wrapped the kept empty contents too)
    wrapped = contents[:start] + [
        marks.wrap(k, contents[k]) if (contents[k] or not bare) else "" for k in range(start, n)
    ]
    found = marks.strip(fmt._render(prepared, not cont, bos, eos, wrapped))
    if found is None or found[0] != full or any(s0 < p for s0, _, _ in found[1]):
        return None
    return full, found[1], prepared, marks, None


def _from_window(
    fmt: TailFormat, messages: Sequence[Message], start: int, state: JinjaState, bos: str, eos: str, cont: bool,
    shown: Any,
) -> Found | None:
    """Checks 1 and 4 on two renders of a window, for a local template (`agentmem.engine.jinja_locality`).

    The window is the first message and the messages from an odd index `j` (a few before `start`)
    on. A local template writes the same text for the messages after `j` there as in the whole
    conversation; the window's text must start with the kept text up to the end of the first
    message's content (the template's head), and hold the kept text of messages `j + 1 .. start - 1`
    right after message `j`'s region (found as `JinjaFormat._ends` finds it). The whole text is
    then the kept text up to `P` and the window's text after those messages; a new message whose
    content is not located ends where a render of the window up to it stops agreeing.
    """
    n = len(messages)
    j = start - 2 if start % 2 else start - 3
    while j >= 1 and (state.ends[j][2] is None or state.ends[j][0] != state.prevs[j]):
        j -= 2
    head = state.ends[0][1]
    if j < 1 or start - j > _LOOKBACK or head < 0:
        return None
    end_j = state.ends[j][0]
    prepared = list(messages)
    for k in (0, *range(j - 1, n)):
        prepared[k] = fmt._prepared([messages[k]])[0]
    window = [prepared[0], *prepared[j:]]
    text = fmt._render(window, not cont, bos, eos)
    if not text.startswith(state.text[:head]):
        return None
    marks = Markers([prepared[j - 1], *window], shown)
    bare = state.bare
    wrapped = [window[0].content] + [
        marks.wrap(k, m.content) if (m.content or not bare) else "" for k, m in zip(range(j, n), window[1:])
    ]
    found = marks.strip(fmt._render(window, not cont, bos, eos, wrapped))
    if found is None or found[0] != text:
        return None
    close = {k: s1 for _, s1, k in found[1]}
    tail = fmt._tail(prepared, j, bos, eos, marks) if j in close else None
    if tail is None:
        return None
    c = close[j]
    e = c + common_prefix(tail, text[c : c + len(tail)])
    p = state.prevs[start - 1]
    between = state.text[end_j:p]  # the kept text of messages j + 1 .. start - 1
    if text[e : e + len(between)] != between:
        return None
    cut = e + len(between)
    d = p - cut
    if any(s0 < cut for s0, _, k in found[1] if k >= start):
        return None
    spans = [(s0 + d, s1 + d, k) for s0, s1, k in found[1] if k >= start]

    def part(k: int) -> tuple[int, int] | None:
        try:
            upto = fmt._render([window[0], *prepared[j : k + 1]], False, bos, eos)
        except MessageError:
            return None
        at = common_prefix(upto, text)
        return None if at < cut else (at + d, min(len(upto), at + 1) + d)

    return state.text[:p] + text[cut:], spans, prepared, marks, part


def common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of `a` and `b` (string compares in C, no per-character loop)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
