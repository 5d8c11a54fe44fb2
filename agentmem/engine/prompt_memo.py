"""The renders a model's recent conversations got, kept so the next call renders only what is new.

A call sends the agent's whole history; all of it but the last messages was rendered,
validated and tokenized by the call before (and, for a request without an agent id, by
the line lookup just before the call). `RenderMemo` keeps recent renders as `Kept`
records — the validated messages, the prompt value (`RenderedPrompt`), where each
message's tokens begin, and the format's own state — with the bytes of the messages as
the caller sent them (`Sent`), so `agentmem.engine.renderer.ChatRenderer.render`:

* validates only the messages after the longest kept conversation the new one extends;
* has the format render from there (`ChatFormat.render_tail`: the built-in formats from
  the last kept message on; a jinja template only after checking that what it makes of the
  whole conversation still starts with the kept text, `agentmem.engine.jinja_format`);
* tokenizes only the new segments, and copies the kept tokens and spans before them.

The same request rendered again (the server renders it for the line lookup, the prompt
limit and the call) is one lookup, unless the format is `volatile` (a template that reads
the clock is rendered every time).

**What a call pays for its old messages.** The request carries them, so they are looked at
on every call, but only in C: the whole conversation is serialized once with `marshal`
(format 2: every value with its exact type, `True`, `1` and `1.0` apart, no references
between objects, so equal messages give equal bytes whoever built them), and a kept
conversation matches when its bytes begin the new ones (`bytes.startswith`, one memory
compare). No per-message Python work and no hash of the history: a kept record is found by
its length and the bytes of its last message, then compared whole. A message edited
anywhere in the history, by one character or by the type of one value, fails the compare
and the conversation is validated and rendered from the start. Messages that `marshal`
cannot write (a `Message`, a mapping that is not a `dict`, a value of another type) are
compared by their `raw_key` instead, built per message in Python, as before.

The memo holds at most `max_tokens` prompt tokens over all its records (least recently
used dropped first); a render that extends a kept one replaces it.
"""

from __future__ import annotations

import json
import marshal
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

from agentmem.engine.chat_format import Message, RenderedPrompt

__all__ = ["Kept", "RenderMemo", "Sent", "raw_key"]

_SCALARS = (str, bool, int, float, type(None))
_FORMAT = 2  # marshal's format 2: no back-references (format 3 on writes them for objects shared by identity)
_HEAD = len(marshal.dumps([], _FORMAT))  # a list's type code and length, before its items


def raw_key(message: Any) -> Hashable | None:
    """A hashable key for one message as the caller sent it, or None when it has none.

    Two messages with equal keys validate to the same `Message` (or fail the same way): the
    key holds every field with its type, lists and dicts as their JSON text.
    """
    if isinstance(message, Message):
        calls = tuple((c.id, c.name, c.arguments_json()) for c in message.tool_calls)
        return ("M", message.role, message.content, message.name, calls, message.tool_call_id, message.pin)
    if not isinstance(message, Mapping):
        return None
    out: list[Hashable] = []
    for k, v in message.items():
        if isinstance(v, _SCALARS):
            out.append((k, type(v).__name__, v))
            continue
        try:
            out.append((k, type(v).__name__, json.dumps(v, ensure_ascii=False, allow_nan=False)))
        except (TypeError, ValueError):
            return None
    return tuple(out)


def _marshals(value: Any) -> bool:
    """Whether `marshal` writes `value` (only builtin types, no subclasses, not too deep)."""
    try:
        marshal.dumps(value, _FORMAT)
    except (ValueError, TypeError):
        return False
    return True


class Sent:
    """A conversation as the caller sent it, as bytes that compare equal only for equal messages.

    Attributes:
        n: how many of its messages can be compared (the rest, from the first that cannot, never
            match a kept conversation; a render keeps its conversation only when `n` is all of them).
        body: the bytes of those `n` messages (`marshal` format 2, without the list's header),
            each message's bytes self-delimiting, so a kept conversation is a prefix of a new one
            exactly when its body begins the new body.
        last: the bytes of the last of those messages (`end(n)`), taken with `body`.
    """

    __slots__ = ("n", "body", "last", "_messages")

    def __init__(self, messages: Sequence[Any]) -> None:
        units: list[Any] = list(messages)
        try:
            if not set(map(type, units)) <= {dict}:
                raise TypeError("not all dicts")
            blob = marshal.dumps(units, _FORMAT)  # one pass in C over every field of every message
        except (ValueError, TypeError):  # a message marshal cannot write: that one by its `raw_key`
            units = self._units(units)
            blob = marshal.dumps(units, _FORMAT)
        self._messages = units
        self.n = len(units)
        self.body = blob[_HEAD:]
        self.last = marshal.dumps(units[-1], _FORMAT) if units else b""

    @staticmethod
    def _units(messages: Sequence[Any]) -> list[Any]:
        """Each message as itself (a `dict` marshal writes) or as its `raw_key`, up to the first with neither.

        A dict is written as a dict and a key as a tuple, so the two never compare equal.
        """
        out: list[Any] = []
        for m in messages:
            unit = m if type(m) is dict and _marshals(m) else raw_key(m)
            if unit is None or not _marshals(unit):
                break
            out.append(unit)
        return out

    def end(self, n: int) -> bytes:
        """The bytes of message `n - 1` (the last of the first `n`): what a kept record of `n` is found by."""
        if n == self.n:
            return self.last
        return marshal.dumps(self._messages[n - 1], _FORMAT)


@dataclass(frozen=True, slots=True, eq=False)
class Kept:
    """One kept render.

    Attributes:
        seed: what the lookups start from (the format and the tools as sent).
        body: `Sent.body` of all the messages as sent.
        end: `Sent.end` of the last of them.
        messages: those messages validated (`normalize_messages`), before any tools block.
        prompt: the prompt value they rendered to.
        firsts: for each rendered message `k`, `(token offset, span index)` where the spans of
            messages `k, k + 1, ...` begin in `prompt`.
        state: the format's state for `ChatFormat.render_tail`.
    """

    seed: Hashable
    body: bytes
    end: bytes
    messages: tuple[Message, ...]
    prompt: RenderedPrompt
    firsts: tuple[tuple[int, int], ...]
    state: Any

    @property
    def where(self) -> tuple[Hashable, int, bytes]:
        """The bucket this record is found in: its seed, its length and its last message's bytes."""
        return self.seed, len(self.messages), self.end


class RenderMemo:
    """Kept renders, found by length and last message, least recently used dropped past `max_tokens` tokens.

    Thread-safe.

    Args:
        max_tokens: prompt tokens kept over all records.
    """

    def __init__(self, *, max_tokens: int = 1 << 20) -> None:
        self.max_tokens = max_tokens
        self._kept: OrderedDict[int, Kept] = OrderedDict()  # id(record) -> record, least recently used first
        self._where: dict[tuple[Hashable, int, bytes], list[Kept]] = {}
        self._lengths: dict[int, int] = {}  # messages -> records of that length
        self._tokens = 0
        self._lock = threading.Lock()

    def longest(self, seed: Hashable, sent: Sent) -> Kept | None:
        """The kept render of the longest conversation `sent` starts with (None: none).

        For each length a kept record has, from `sent.n` down: the records of that length
        ending with `sent`'s message there, each compared whole (its bytes begin `sent`'s).
        """
        with self._lock:
            # walk whichever is shorter: the lengths kept, or the conversation's own (per-call work
            # bounded by the memo, not by the history)
            if len(self._lengths) < sent.n:
                lengths: Iterable[int] = sorted((n for n in self._lengths if n <= sent.n), reverse=True)
            else:
                lengths = range(sent.n, 0, -1)
            for n in lengths:
                if n not in self._lengths:
                    continue
                for hit in self._where.get((seed, n, sent.end(n)), ()):
                    if sent.body.startswith(hit.body):
                        self._kept.move_to_end(id(hit))
                        return hit
        return None

    def keep(self, kept: Kept) -> None:
        """Remember `kept` in place of a record of the same conversation (least recently used go past `max_tokens`)."""
        if not kept.messages or len(kept.prompt) > self.max_tokens:
            return
        with self._lock:
            for old in self._where.get(kept.where, ()):
                if old.body == kept.body:
                    self._drop(old)
                    break
            self._kept[id(kept)] = kept
            self._where.setdefault(kept.where, []).append(kept)
            n = len(kept.messages)
            self._lengths[n] = self._lengths.get(n, 0) + 1
            self._tokens += len(kept.prompt)
            while self._tokens > self.max_tokens:
                self._drop(next(iter(self._kept.values())))

    def _drop(self, kept: Kept) -> None:
        del self._kept[id(kept)]
        self._tokens -= len(kept.prompt)
        bucket = [k for k in self._where[kept.where] if k is not kept]
        if bucket:
            self._where[kept.where] = bucket
        else:
            del self._where[kept.where]
        n = len(kept.messages)
        left = self._lengths[n] - 1
        if left:
            self._lengths[n] = left
        else:
            del self._lengths[n]

    def discard(self, kept: Kept) -> None:
        """Forget `kept` (a render a longer one of its conversation supersedes)."""
        with self._lock:
            if self._kept.get(id(kept)) is kept:
                self._drop(kept)

    def clear(self) -> None:
        """Forget every kept render."""
        with self._lock:
            self._kept.clear()
            self._where.clear()
            self._lengths.clear()
            self._tokens = 0

    def __len__(self) -> int:
        return len(self._kept)
