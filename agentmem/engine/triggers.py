"""The triggers of a lazy grammar: checked once, then matched against a reply as it grows.

A lazy grammar (`SamplingParams.grammar_triggers` / `grammar_trigger_tokens`) constrains
a reply only from the point where a trigger fires. The matching follows llama.cpp's lazy
grammars (`llama_sampler_init_grammar_lazy_patterns`, `llama_grammar_trigger_pattern::find`):

* the patterns are tried in order against the *whole* text generated so far; a pattern
  that starts with `^` and ends with `$` must match all of it, any other is searched;
* the grammar's input starts at the first capture group that matched non-empty text, or
  at the match's start when none did, and runs to the end of the text;
* a trigger token fires when it is sampled; the grammar's input starts with its text.

It is done here in Python rather than by llama.cpp's own lazy sampler because that one
is not safe behind ctypes: an invalid pattern (`std::regex_error`) and a trigger whose
text the grammar rejects (`Unexpected empty grammar stack`) throw C++ exceptions through
the C API, which abort the process; and it does not say whether it fired.

`check_triggers` bounds hostile patterns: count, size, syntax, no quantified group that
holds a quantifier or an alternation (the shapes that backtrack exponentially), and at most
two unbounded quantifiers (`*`, `+`, `{n,}`: each one more multiplies the worst case of a
search by the text's length). The patterns agentmem builds itself are escaped literals
(`agentmem.tools.lazy.Trigger`); a raw pattern is code from the caller, not request data.
"""

from __future__ import annotations

import codecs
import re
from typing import Any, Sequence

from agentmem.errors import ConfigError, GrammarLimitError
from agentmem.validation import bounded_int, text

__all__ = [
    "MAX_TRIGGERS", "MAX_TRIGGER_CHARS", "MAX_TRIGGER_TOKENS", "TriggerWatch", "check_trigger_tokens", "check_triggers",
    "find_trigger",
]

MAX_TRIGGERS = 16
"""Patterns (and, separately, trigger tokens) one grammar may have."""
MAX_TRIGGER_CHARS = 512
"""Characters one pattern may have."""
MAX_TRIGGER_TOKENS = 64
"""Trigger token ids one grammar may have."""
MAX_UNBOUNDED = 2
"""Unbounded quantifiers (`*`, `+`, `{n,}`) one pattern may have."""


def _as_tuple(value: Any, *, field: str) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, (tuple, list)):
        raise ConfigError(f"{field} must be a list, got {type(value).__name__}")
    return tuple(value)


_QUANT = re.compile(r"[*+?]|\{\d")
_UNBOUNDED = re.compile(r"[*+]|\{\d+,\}")


def _after_class(pattern: str, i: int) -> int:
    """The index after the character class that opens at `pattern[i]` (`[`)."""
    j = i + 1
    if pattern.startswith("^", j):
        j += 1
    if pattern.startswith("]", j):  # a leading `]` is a member
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _unbounded(pattern: str) -> int:
    """How many unbounded quantifiers `pattern` has (outside classes and escapes)."""
    n, i = 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _after_class(pattern, i)
            continue
        m = _UNBOUNDED.match(pattern, i)
        if m:
            n += 1
            i = m.end()
            continue
        i += 1
    return n


def _backtracks(pattern: str) -> bool:
    """Whether `pattern` has a quantified group holding a quantifier or an alternation (`(a+)+`, `(a|b)*`)."""
    stack: list[bool] = [False]  # per open group: holds a quantifier or `|`
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _after_class(pattern, i)
            continue
        if c == "(":
            stack.append(False)
            i += 2 if pattern.startswith("(?", i) else 1  # `(?:` is no quantifier
            continue
        if c == ")" and len(stack) > 1:
            inner = stack.pop()
            if _QUANT.match(pattern, i + 1):
                if inner:
                    return True
                stack[-1] = True
            elif inner:
                stack[-1] = True
            i += 1
            continue
        if c == "|" or _QUANT.match(pattern, i):
            stack[-1] = True
        i += 1
    return False


def check_triggers(patterns: Any, *, field: str = "grammar_triggers") -> tuple[str, ...]:
    """`patterns` as a tuple of checked regular expressions.

    Raises:
        ConfigError: not a list of non-empty strings, or a pattern that does not compile.
        GrammarLimitError: too many patterns, one too long, or one that may backtrack
            exponentially (names `field[i]`).
    """
    out = _as_tuple(patterns, field=field)
    if len(out) > MAX_TRIGGERS:
        raise GrammarLimitError(f"{field}: at most {MAX_TRIGGERS} patterns, got {len(out)}", field=field)
    for j, p in enumerate(out):
        where = f"{field}[{j}]"
        if not isinstance(p, str) or not p:
            raise ConfigError(f"{where} must be a non-empty string, got {p!r:.80}")
        text(p, field=where, error=ConfigError)
        if len(p) > MAX_TRIGGER_CHARS:
            raise GrammarLimitError(f"{where}: at most {MAX_TRIGGER_CHARS} characters, got {len(p)}", field=where)
        try:
            re.compile(p)
        except (re.error, RecursionError, OverflowError) as exc:
            raise ConfigError(f"{where} is not a valid regular expression: {exc}") from None
        if _unbounded(p) > MAX_UNBOUNDED:
            raise GrammarLimitError(
                f"{where}: at most {MAX_UNBOUNDED} unbounded quantifiers ('*', '+', '{{n,}}'), got {_unbounded(p)}",
                field=where)
        if _backtracks(p):
            raise GrammarLimitError(
                f"{where}: a quantified group may not hold a quantifier or '|' (it can backtrack "
                f"exponentially), got {p!r:.80}", field=where)
    return out


def check_trigger_tokens(tokens: Any, *, field: str = "grammar_trigger_tokens") -> tuple[int, ...]:
    """`tokens` as a tuple of token ids (each in `[0, 2**31)`; at most 64).

    Raises:
        ConfigError: not a list of integers in range (names `field[i]`).
        GrammarLimitError: too many ids.
    """
    out = _as_tuple(tokens, field=field)
    if len(out) > MAX_TRIGGER_TOKENS:
        raise GrammarLimitError(f"{field}: at most {MAX_TRIGGER_TOKENS} tokens, got {len(out)}", field=field)
    return tuple(bounded_int(t, field=f"{field}[{j}]", lo=0, hi=2**31 - 1) for j, t in enumerate(out))


def _start(m: re.Match[str]) -> int:
    for g in range(1, (m.re.groups or 0) + 1):
        if m.start(g) != -1 and m.end(g) > m.start(g):
            return m.start(g)
    return m.start()


def find_trigger(patterns: Sequence[re.Pattern[str]], generated: str) -> int | None:
    """Where the grammar's input starts in `generated` by the first pattern that matches, or `None`.

    >>> find_trigger([re.compile(r"^\\s*(\\{)")], '  {"a"'), find_trigger([re.compile("x")], "ab")
    (2, None)
    """
    for rx in patterns:
        p = rx.pattern
        m = rx.fullmatch(generated) if p.startswith("^") and p.endswith("$") and not p.endswith("\\$") else None
        if m is None:
            m = rx.search(generated)
        if m is not None:
            return _start(m)
    return None


class TriggerWatch:
    """Follows a reply's text, token by token, until a trigger fires.

    Args:
        patterns: checked patterns (`check_triggers`).
        tokens: trigger token ids.
    """

    def __init__(self, patterns: Sequence[str], tokens: Sequence[int]) -> None:
        self._rx = [re.compile(p) for p in patterns]
        self._tokens = frozenset(tokens)
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.text = ""

    def observe(self, token: int, piece: bytes) -> int | None:
        """Add a sampled token; where the grammar's input starts in `text` if a trigger fired, else `None`."""
        at = len(self.text)
        self.text += self._dec.decode(piece)
        if token in self._tokens:
            return at
        if not self._rx or not piece:
            return None
        return find_trigger(self._rx, self.text)
