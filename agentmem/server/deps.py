"""FastAPI dependencies shared by the routers: the engine and the caller's principal."""

from __future__ import annotations

from fastapi import Request

from agentmem.server.auth import KeyRing, Principal
from agentmem.server.engine import Engine
from agentmem.server.http_errors import ApiError

__all__ = ["engine", "presented_key", "principal"]


def engine(request: Request) -> Engine:
    """The app's `Engine`."""
    return request.app.state.engine


def presented_key(request: Request) -> str | None:
    """The key a request presents: `Authorization: Bearer KEY` or `X-Api-Key: KEY`."""
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return request.headers.get("x-api-key") or None


def principal(request: Request) -> Principal:
    """The caller; 401 when keys are configured and none (or a wrong one) is presented."""
    keys: KeyRing = request.app.state.keys
    who = keys.authenticate(presented_key(request))
    if who is None:
        raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key")
    return who
