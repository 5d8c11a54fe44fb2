"""Errors as HTTP answers in OpenAI's JSON shape; agentmem's exception tree mapped to 4xx.

Every error body is `{"error": {"message", "type", "param", "code"}}`, what the OpenAI
clients read into their exceptions (`openai.BadRequestError` for 400, ...).

| raised | status | `code` |
|---|---|---|
| `ConfigError`, `MessageError`, `PolicyError`, `ChatTemplateError`, a bad body | 400 | `invalid_request` |
| `ContextOverflowError` | 400 | `context_length_exceeded` |
| no or a wrong API key | 401 | `invalid_api_key` |
| an agent outside the key's prefix | 403 | `forbidden` |
| `UnknownAgentError` (the body names only the id asked for) | 404 | `agent_not_found` |
| `UnknownModelError`: a `model` the server does not serve (`param`: `model`) | 404 | `model_not_found` |
| `ModelMismatchError`: the agent is bound to another model (`param`: `model`) | 400 | `model_mismatch` |
| the agent is generating or pinned (forget, park, handoff) | 409 | `agent_busy` |
| body or prompt too large | 413 | `request_too_large` |
| the key's concurrency limit | 429 | `rate_limit_exceeded` |
| the key's agent or parked-bytes quota (`param`: `max_agents`, `max_parked_bytes`) | 429 | `quota_exceeded` |
| the server is starting or shutting down, `PoolClosedError` | 503 | `unavailable` |
| `ArchiveFullError`: the archive's disk is full (nothing was written; `/health` says `degraded`) | 507 | `insufficient_storage` |
| `ModelBudgetError`: the model cannot load, the others stay in use (`Retry-After`) | 503 | `model_unavailable` |
| `LeaseHeldError`: another replica serves the agent (cluster mode; `Retry-After`) | 503 | `agent_elsewhere` |
| `LeaseLostError`: this replica lost the agent mid-call (cluster mode; `Retry-After`) | 503 | `lease_lost` |
| anything else (a server fault, logged) | 500 | `internal_error` |
"""

from __future__ import annotations

import logging
import math
from typing import Any

from agentmem.errors import (
    AgentBusyError,
    AgentMemError,
    ArchiveFullError,
    ChatTemplateError,
    ConfigError,
    ContextOverflowError,
    LeaseHeldError,
    LeaseLostError,
    MessageError,
    ModelBudgetError,
    ModelMismatchError,
    PolicyError,
    PoolClosedError,
    UnknownAgentError,
    UnknownModelError,
)

__all__ = ["ApiError", "error_body", "from_exception"]

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          409: "conflict_error", 413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error",
          507: "server_error"}


class ApiError(Exception):
    """An HTTP error answer (raised by routes, rendered by the app's handler).

    Args:
        status: the HTTP status.
        message: what the client is told.
        code: the machine-readable `code`.
        param: the request field at fault, if any.
        headers: extra response headers (`Retry-After`).
    """

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return error_body(self.status, self.message, code=self.code, param=self.param)


def error_body(status: int, message: str, *, code: str, param: str | None = None) -> dict[str, Any]:
    """`{"error": {...}}` in OpenAI's shape."""
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def from_exception(exc: BaseException) -> ApiError:
    """The answer for an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, LeaseHeldError):
        retry = str(max(1, math.ceil(exc.expires_in_s)))
        return ApiError(503, f"{exc}; another replica serves this agent, retry in {retry} s", code="agent_elsewhere",
                        headers={"Retry-After": retry})
    if isinstance(exc, LeaseLostError):
        return ApiError(503, f"{exc}; the call's result was not stored, retry it", code="lease_lost",
                        headers={"Retry-After": "1"})
    if isinstance(exc, ArchiveFullError):
        logger.error("archive full: %s", exc)
        return ApiError(507, "the archive's storage is full: the agent's state was not stored (what was stored "
                             "before is intact); retry once space is freed", code="insufficient_storage")
    if isinstance(exc, PoolClosedError):
        return ApiError(503, "the server is shutting down", code="unavailable")
    if isinstance(exc, UnknownAgentError):
        # the pool's message may describe the pool (how many agents it knows): the body says
        # only what the caller asked for, never anything about other tenants' agents
        shown = f"unknown agent {exc.agent_id!r}" if exc.agent_id is not None else "unknown agent"
        return ApiError(404, shown, code="agent_not_found")
    if isinstance(exc, UnknownModelError):
        return ApiError(404, str(exc), code="model_not_found", param="model")
    if isinstance(exc, ModelMismatchError):
        return ApiError(400, str(exc), code="model_mismatch", param="model")
    if isinstance(exc, ModelBudgetError):
        return ApiError(503, str(exc), code="model_unavailable", headers={"Retry-After": "5"})
    if isinstance(exc, (ConfigError, MessageError, PolicyError, ChatTemplateError)):
        return ApiError(400, str(exc), code="invalid_request", param=getattr(exc, "field", None))
    if isinstance(exc, AgentBusyError):
        return ApiError(409, str(exc), code="agent_busy")
    if type(exc) is AgentMemError and "closed" in str(exc):
        return ApiError(503, "the server is shutting down", code="unavailable")
    logger.error("internal error while serving a request", exc_info=exc)
    return ApiError(500, f"internal error ({type(exc).__name__}); see the server log", code="internal_error")
