"""The renders a model's recent conversations got, kept so the next call renders only what is new.

A call sends the agent's whole history; all of it but the last messages was rendered,
validated and tokenized by the call before (and, for a request without an agent id, by
the line lookup just before the call). `RenderMemo` keeps recent renders as `Kept`
records — the validated messages, the prompt value (`RenderedPrompt`), where each
message's tokens begin, and the format's own state — keyed by a chain of message keys
(`raw_key`: a message as the caller sent it, before validation), so
`agentmem.engine.renderer.ChatRenderer.render`:

* validates only the messages after the longest kept conversation the new one extends;
* has the format render from there (`ChatFormat.render_tail`: the built-in formats from
  the last kept message on; a jinja template only after checking that what it makes of the
  whole conversation still starts with the kept text, `agentmem.engine.jinja_format`);
* tokenizes only the new segments, and copies the kept tokens and spans before them.

The same request rendered again (the server renders it for the line lookup, the prompt
limit and the call) is one dictionary hit, unless the format is `volatile` (a template
that reads the clock is rendered every time).

Keys are Python hashes of a message's fields (its strings hashed with the process's
randomized hash), and a conversation's key hashes those of its messages: equal keys mean
equal messages, up to a 64-bit collision. A jinja render never rests on them alone (its text is compared).
The memo holds at most `max_tokens` prompt tokens over all its records (least recently
used dropped first); a render that extends a kept one replaces it.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Sequence

from agentmem.engine.chat_format import Message, RenderedPrompt

__all__ = ["Kept", "RenderMemo", "message_hashes", "prefix_key", "raw_key"]

_SCALARS = (str, bool, int, float, type(None))


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


def message_hashes(messages: Sequence[Any]) -> list[int]:
    """The hash of each message's `raw_key`, up to the first message without one."""
    out: list[int] = []
    for m in messages:
        if type(m) is dict:  # the common case, with every value hashable: its items and their types
            try:
                out.append(hash((tuple(m.items()), tuple(map(type, m.values())))))
                continue
            except TypeError:
                pass
        k = raw_key(m)
        if k is None:
            break
        out.append(hash(k))
    return out


def prefix_key(seed: Hashable, hashes: Sequence[int], n: int) -> int:
    """The key of the first `n` messages (their `message_hashes`) under `seed`."""
    return hash((seed, n, tuple(hashes[:n])))


@dataclass(frozen=True, slots=True)
class Kept:
    """One kept render.

    Attributes:
        seed: what the keys started from (the format and the tools as sent).
        key: `prefix_key` of all the messages as sent.
        last: the hash of the last of them (`message_hashes`).
        messages: those messages validated (`normalize_messages`), before any tools block.
        prompt: the prompt value they rendered to.
        firsts: for each rendered message `k`, `(token offset, span index)` where the spans of
            messages `k, k + 1, ...` begin in `prompt`.
        state: the format's state for `ChatFormat.render_tail`.
    """

    seed: Hashable
    key: int
    last: int
    messages: tuple[Message, ...]
    prompt: RenderedPrompt
    firsts: tuple[tuple[int, int], ...]
    state: Any


class RenderMemo:
    """Kept renders by conversation key, least recently used dropped past `max_tokens` tokens (thread-safe).

    Args:
        max_tokens: prompt tokens kept over all records.
    """

    def __init__(self, *, max_tokens: int = 1 << 20) -> None:
        self.max_tokens = max_tokens
        self._kept: OrderedDict[int, Kept] = OrderedDict()
        self._ends: dict[tuple[int, int], int] = {}  # (messages, last message's hash) -> records ending so
        self._tokens = 0
        self._lock = threading.Lock()

    def longest(self, seed: Hashable, hashes: Sequence[int]) -> Kept | None:
        """The kept render of the longest conversation the messages of `hashes` start with (None: none).

        One set lookup per candidate length; the prefix's key (hashing its messages' hashes)
        only where a kept conversation of that length ends with the same message.
        """
        with self._lock:
            for n in range(len(hashes), 0, -1):
                if (n, hashes[n - 1]) not in self._ends:
                    continue
                hit = self._kept.get(prefix_key(seed, hashes, n))
                if hit is not None and hit.seed == seed and len(hit.messages) == n:
                    self._kept.move_to_end(hit.key)
                    return hit
        return None

    def keep(self, kept: Kept) -> None:
        """Remember `kept` (least recently used records go past `max_tokens`)."""
        if not kept.messages or len(kept.prompt.tokens) > self.max_tokens:
            return
        with self._lock:
            self._drop(self._kept.pop(kept.key, None))
            self._kept[kept.key] = kept
            end = (len(kept.messages), kept.last)
            self._ends[end] = self._ends.get(end, 0) + 1
            self._tokens += len(kept.prompt.tokens)
            while self._tokens > self.max_tokens:
                self._drop(self._kept.popitem(last=False)[1])

    def _drop(self, kept: Kept | None) -> None:
        if kept is None:
            return
        self._tokens -= len(kept.prompt.tokens)
        end = (len(kept.messages), kept.last)
        left = self._ends[end] - 1
        if left:
            self._ends[end] = left
        else:
            del self._ends[end]

    def discard(self, kept: Kept) -> None:
        """Forget `kept` (a render a longer one of its conversation supersedes)."""
        with self._lock:
            if self._kept.get(kept.key) is kept:
                self._drop(self._kept.pop(kept.key))

    def clear(self) -> None:
        """Forget every kept render."""
        with self._lock:
            self._kept.clear()
            self._ends.clear()
            self._tokens = 0

    def __len__(self) -> int:
        return len(self._kept)
