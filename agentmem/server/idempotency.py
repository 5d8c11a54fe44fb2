"""Idempotent retries: a request that sends `Idempotency-Key` (or `X-Request-Id`) gets its saved answer again.

A client whose connection dropped after the server answered retries the same request. Without
this, the retry of a call without an agent id is a new turn: the prompt only repeats the line's
last prompt, so it **branches** into a new conversation (#33 M1: nothing lost, an extra agent).
With a request id the server keeps the answer (non-streaming calls; 10 minutes, the last 1024
per server) and a retry with the same id and the same body gets it back, with
`Idempotent-Replayed: true`, without running the model or creating an agent:

| retry with the same id | answer |
|---|---|
| same body, the first one answered | the saved answer (200, `Idempotent-Replayed: true`) |
| same body, the first one still running | 409 `idempotency_in_progress` (retry later) |
| another body | 409 `idempotency_key_reused` |

Ids are per key (another key's id is another id). A streamed answer is not kept (its retry runs
again), and the saved answers live in memory: after a restart a retry runs again; a conversation
it branches is forgotten by the lifecycle (`agentmem.server.lifecycle`) like any other.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from agentmem.server.http_errors import ApiError

__all__ = ["HEADERS", "Replayed", "Replays", "Saved"]

HEADERS = ("idempotency-key", "x-request-id")
"""The request headers that name a request for its retries (the first one sent counts)."""

_MAX_ID = 256


@dataclass(frozen=True, slots=True)
class Saved:
    """A kept answer: its body, its agent, and the digest of the request body it answered."""

    body: dict[str, Any]
    agent_id: str
    digest: bytes
    at: float


class Replayed(Exception):
    """Raised before any work when a retry's answer is saved; the app answers `response()`."""

    def __init__(self, saved: Saved) -> None:
        super().__init__("replayed")
        self.saved = saved

    def response(self) -> JSONResponse:
        """The saved answer, marked `Idempotent-Replayed: true`, with its `X-Agent-Id`."""
        return JSONResponse(self.saved.body, headers={"Idempotent-Replayed": "true",
                                                      "X-Agent-Id": self.saved.agent_id})


class Replays:
    """The answers kept for retries (see the module docstring).

    Args:
        max_entries: answers kept at most (the oldest go first).
        ttl_s: how long an answer is kept.
    """

    def __init__(self, *, max_entries: int = 1024, ttl_s: float = 600.0) -> None:
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._saved: OrderedDict[tuple[str, str, str], Saved] = OrderedDict()
        self._running: dict[tuple[str, str, str], bytes] = {}

    @staticmethod
    def request_id(request: Request) -> str | None:
        """The request's id (`Idempotency-Key`, else `X-Request-Id`); 400 when it is over 256 characters."""
        for name in HEADERS:
            value = request.headers.get(name)
            if value:
                if len(value) > _MAX_ID:
                    raise ApiError(400, f"the {name} header must be at most {_MAX_ID} characters",
                                   code="invalid_request", param=name)
                return value
        return None

    def begin(self, key: tuple[str, str, str], raw: bytes) -> Saved | None:
        """The saved answer of `key` for body `raw`, or None after marking `key` running (409s: see above)."""
        now = time.monotonic()
        while self._saved and next(iter(self._saved.values())).at < now - self.ttl_s:
            self._saved.popitem(last=False)
        digest = hashlib.sha256(raw).digest()
        saved = self._saved.get(key)
        if saved is not None:
            if saved.digest != digest:
                raise ApiError(409, "this idempotency key was sent with another request body",
                               code="idempotency_key_reused", param=HEADERS[0])
            return saved
        running = self._running.get(key)
        if running is not None:
            if running != digest:
                raise ApiError(409, "this idempotency key was sent with another request body",
                               code="idempotency_key_reused", param=HEADERS[0])
            raise ApiError(409, "a request with this idempotency key is still running; retry later",
                           code="idempotency_in_progress", param=HEADERS[0])
        self._running[key] = digest
        return None

    def end(self, key: tuple[str, str, str]) -> None:
        """The request of `key` ended (answered, failed or streamed): it is no longer running."""
        self._running.pop(key, None)

    def save(self, key: tuple[str, str, str], body: dict[str, Any], agent_id: str) -> None:
        """Keep the answer of the running request `key` for its retries."""
        digest = self._running.get(key)
        if digest is None:
            return
        self._saved[key] = Saved(body, agent_id, digest, time.monotonic())
        self._saved.move_to_end(key)
        while len(self._saved) > self.max_entries:
            self._saved.popitem(last=False)
