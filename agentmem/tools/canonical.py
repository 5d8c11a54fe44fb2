"""Free tool calls made canonical as they are generated: is the reply a bare call object?

A model trained on a template that wraps calls (Qwen2.5's `<tool_call>\\n{...}\\n</tool_call>`)
often writes a free call (tool choice `auto`) as the bare object `{"name": ..., "arguments":
{...}}`. The lenient parser (`ToolFormat.find`) reads it as a call, and the client sends it
back in the next request, where the template renders it *with* its opening: the agent's KV
then holds other tokens than the next prompt from the reply's first token on, and the whole
call is prefilled again.

`BareCallWatch` decides, from a reply's first characters, whether the reply opens as a bare
call to one of the offered tools (`{"name": "<tool>"`, whitespace between the JSON tokens
allowed). The pool (`agentmem.pool.canon`) holds those first tokens back while the answer
is open; when it is yes, it replaces them in the KV with the format's `bare_opening`
followed by the same tokens, so the KV holds the call as the template writes it back and the
model (trained on that form) goes on to close it. A reply that opens otherwise, JSON that
names no offered tool included, is left as the model wrote it.

Example:
    >>> from agentmem.tools.formats import get_tool_format
    >>> w = bare_call_watch(get_tool_format("hermes"), ("lookup", "send"))
    >>> w.opening, w.decide('{"na'), w.decide('{"name": "lookup"'), w.decide('{"answer"')
    ('<tool_call>\\n', None, True, False)
"""

from __future__ import annotations

import functools
from typing import Sequence

from agentmem.errors import ConfigError

from .formats import ToolFormat

__all__ = ["BareCallWatch", "bare_call_watch", "watch_for"]


def _squeeze(text: str) -> str:
    """`text` without the whitespace outside JSON strings (a call's head is short: this is cheap)."""
    out: list[str] = []
    in_str = escaped = False
    for ch in text:
        if in_str:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            out.append(ch)
        elif not ch.isspace():
            out.append(ch)
    return "".join(out)


class BareCallWatch:
    """Whether a reply opens as a bare call to one of `heads`' tools (see the module docstring).

    Args:
        opening: the text to insert before the call (`ToolFormat.bare_opening`).
        heads: how a call to each tool starts without the opening (`ToolFormat.bare_heads`).

    Attributes:
        opening: as given.
    """

    __slots__ = ("opening", "_heads", "_fmt", "_names")

    def __init__(self, *, opening: str, heads: Sequence[str], fmt: ToolFormat | None = None,
                 names: Sequence[str] = ()) -> None:
        self.opening = opening
        self._heads = tuple(_squeeze(h) for h in heads)
        self._fmt = fmt
        self._names = frozenset(names)

    @property
    def markers(self) -> tuple[str, ...]:
        """The format's marker texts (`ToolFormat.markers`), tokenized as markup, not as text."""
        return self._fmt.markers if self._fmt is not None else ()

    def written_back(self, text: str) -> str | None:
        """The template's text of a finished reply that is calls to the offered tools; `None` otherwise.

        A model may end a call without its closing (Qwen2.5-Coder-0.5B ends
        `<tool_call>\\n{...}` without `\\n</tool_call>`); the pool then completes the KV to
        this text, as the next prompt renders the call.

        >>> from agentmem.tools.formats import get_tool_format
        >>> w = bare_call_watch(get_tool_format("hermes"), ("f",))
        >>> w.written_back('<tool_call>\\n{"name": "f", "arguments": {"x": 1}}')
        '<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>'
        >>> w.written_back('<tool_call>\\n{"name": "g", "arguments": {}}') is None
        True
        """
        if self._fmt is None or not text.lstrip().startswith(self._fmt.opener):
            return None
        calls = self._fmt.parse(text)
        if not calls or any(not c.ok or c.name not in self._names for c in calls):
            return None
        return self._fmt.render_call([(c.name, c.arguments) for c in calls])

    def decide(self, lead: str) -> bool | None:
        """Whether a reply that starts with `lead` is a bare call (True), is not (False), or may be (None).

        >>> w = BareCallWatch(opening="<tool_call>\\n", heads=['{"name": "f"'])
        >>> w.decide("  "), w.decide('\\n{ "name" :"f", '), w.decide('{"name": "fg"'), w.decide("Hi")
        (None, True, False, False)
        """
        s = _squeeze(lead)
        if not s:
            return None
        undecided = False
        for h in self._heads:
            if s.startswith(h):
                return True
            undecided = undecided or h.startswith(s)
        return None if undecided else False

    def __repr__(self) -> str:
        return f"BareCallWatch(opening={self.opening!r}, heads={list(self._heads)!r})"


@functools.lru_cache(maxsize=256)
def bare_call_watch(fmt: ToolFormat, names: tuple[str, ...]) -> BareCallWatch | None:
    """The watch for free calls to `names` in `fmt` (built once per format and tool set).

    Returns:
        `None` when `fmt` has no opening a model may leave out (`ToolFormat.bare_opening`:
        the envelope, Llama 3, whose bare object is the call) or `names` is empty.
    """
    if not fmt.bare_opening or not names:
        return None
    return BareCallWatch(opening=fmt.bare_opening, heads=fmt.bare_heads(names), fmt=fmt, names=names)


def watch_for(fmt: ToolFormat, names: Sequence[str], enabled: bool = True) -> BareCallWatch | None:
    """The watch of a free call offering the tools `names` (`MemoryPool.chat`'s `canonical_calls`), or `None`.

    Args:
        fmt: the model's tool format (only a `native` one: the template renders calls back).
        names: the offered tools' names (none: no watch).
        enabled: `canonical_calls` as passed.

    Raises:
        ConfigError: `enabled` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise ConfigError(f"canonical_calls must be a bool, got {type(enabled).__name__}")
    if not (enabled and names and fmt.native):
        return None
    return bare_call_watch(fmt, tuple(names))
