"""Routers whose errors take another API's shape (Anthropic's, Ollama's) instead of OpenAI's.

The app's handlers answer every error in OpenAI's shape. A router built with
`shaped_route(render)` catches what its routes raise — a bad body, a missing key, an
agentmem error, a fault — turns it into an `ApiError` the same way (same status, same
message naming the field) and answers `render(err)` instead.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request

from agentmem.server.http_errors import ApiError, from_exception
from agentmem.server.idempotency import Replayed

__all__ = ["as_api_error", "shaped_route"]


def as_api_error(exc: Exception) -> ApiError:
    """The `ApiError` the app's handlers would answer for `exc` (a bad body: 400 naming the field).

    A body FastAPI cannot read (bytes that are not UTF-8 JSON) is its `HTTPException` 400.
    """
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
        return ApiError(400, f"{field or 'body'}: {first.get('msg', 'invalid request')}", code="invalid_request",
                        param=field)
    if isinstance(exc, HTTPException):  # a body that is not JSON at all, as the app's handler answers it
        return ApiError(exc.status_code, str(exc.detail), code="invalid_request" if exc.status_code == 400 else "http_error")
    return from_exception(exc)


def shaped_route(render: Callable[[ApiError], Any]) -> type[APIRoute]:
    """An `APIRoute` class whose errors are answered `render(err)` (JSON) with the error's status."""

    class ShapedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
            handler = super().get_route_handler()

            async def shaped(request: Request) -> Response:
                try:
                    return await handler(request)
                except Replayed as replay:  # a retry's saved answer (not an error)
                    return replay.response()
                except Exception as exc:  # every error of these routes, in their API's shape
                    err = as_api_error(exc)
                    return JSONResponse(render(err), status_code=err.status, headers=err.headers)

            return shaped

    return ShapedRoute
