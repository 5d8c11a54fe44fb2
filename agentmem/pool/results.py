"""What one call returns: token counts, timings, the result, and the streaming iterator.

`Usage`, `Timings` and `ChatResult` describe a finished call; `ChatStream`
yields its text pieces and holds the `ChatResult` once the stream ends;
`drive_async` (from `agentmem.pool.bridge`, the one thread → asyncio bridge) runs one in
a worker thread for the async API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from agentmem.pool.bridge import drive_async

__all__ = ["ChatResult", "ChatStream", "Timings", "Usage", "drive_async"]


@dataclass(slots=True)
class Usage:
    """Token counts of one call.

    `cached_tokens` counts prompt tokens whose KV was reused (kept live or
    restored) instead of decoded in this call.
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class Timings:
    """Seconds spent in one call (`ttft_s` runs from the call to the first token).

    `evict_s` is the time spent choosing and removing evicted blocks.
    """

    ttft_s: float = 0.0
    restore_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0
    evict_s: float = 0.0


@dataclass(slots=True)
class ChatResult:
    """What one `chat`/`complete` call produced.

    Attributes:
        text: generated text (stop strings removed).
        finish_reason: `"stop"` (end of turn or a stop string) or `"length"`.
        kv: how the agent's KV was found: `"reused"` (live sequence),
            `"restored"` (parked state loaded), `"shared"` (a prefix taken
            from another agent or a declared share) or `"prefilled"` (nothing kept).
    """

    agent_id: str
    text: str
    finish_reason: str
    usage: Usage
    timings: Timings
    kv: str
    tokens: list[int] = field(default_factory=list)


class ChatStream(Iterator[str]):
    """Iterator over text pieces of a streaming call; `result` is set at the end.

    `cancel()` (any thread) stops the call at its next prefill chunk or decode step: the
    thread iterating gets `CallCancelledError`. `close()` (the iterating thread, or while
    nobody iterates) stops it and frees the agent.
    """

    def __init__(self, gen: Iterator[str | ChatResult], *, cancel: Any = None) -> None:
        self._gen = gen
        self._cancel = cancel  # an `agentmem.pool.lifetime.Cancel`, or None (not cancellable)
        self.result: ChatResult | None = None

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> str:
        while True:
            item = next(self._gen)
            if isinstance(item, ChatResult):
                self.result = item
                continue
            return item

    def drain(self) -> ChatResult:
        """Consume the rest of the stream and return its `ChatResult`."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        """Stop generating (frees the agent for other calls)."""
        self._gen.close()  # type: ignore[attr-defined]

    def cancel(self) -> None:
        """Ask the call to stop at its next prefill chunk or decode step (thread-safe, idempotent)."""
        if self._cancel is not None:
            self._cancel.set("cancelled")
