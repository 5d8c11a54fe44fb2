"""Request bodies read off the event loop: JSON decoding and validation in a worker thread.

FastAPI decodes and validates a body parameter on the event loop, before the route runs:
a 3.6 MB body of 120,000 tiny messages costs about 2 s there (one pydantic model, and its
text checks, per message), and while it runs no other tenant's request, not even `/health`,
is answered (#33 F1). The routes that take a conversation instead declare

```python
async def chat(req: ChatCompletionRequest = Depends(json_body(ChatCompletionRequest, "messages")), ...): ...
```

and `json_body` first admits the request (the key's `max_concurrent`: a 429 before the body
is even decoded; the lease is `request.state.lease`, which the route hands to `serving.respond`),
then decodes and validates it in a worker thread, one body at a time per key, so one
tenant's large bodies neither block the loop nor take every worker thread. A list of
messages or input items longer than `max_input_items` is a 413 naming the field, checked
right after decoding, before a model is validated per item (the bytes are already bounded
by `max_body_bytes`). Errors are
the ones FastAPI raises (`RequestValidationError`, answered as a 400 naming the field), and
`document_bodies` puts the bodies back in `/openapi.json`, so the schema still says what
each route takes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

from agentmem.server.auth import Principal
from agentmem.server.deps import principal
from agentmem.server.http_errors import ApiError
from agentmem.server.idempotency import Replayed, Replays

__all__ = ["body_schema", "document_bodies", "json_body"]

_M = TypeVar("_M", bound=BaseModel)

_REF = "#/components/schemas/{model}"


def _parse(model: type[_M], raw: bytes, field: str, limit: int) -> _M:
    """`raw` decoded and validated as `model` (blocking); FastAPI's errors for a missing or bad body,
    a 413 naming `field` when that list has more than `limit` items."""
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                       "msg": f"JSON decode error: {getattr(exc, 'msg', exc)}", "input": {}}]) from None
    items = data.get(field) if isinstance(data, dict) else None
    if isinstance(items, list) and len(items) > limit:
        raise ApiError(413, f"{field} has {len(items)} items; this server accepts at most {limit} (--max-input-items)",
                       code="request_too_large", param=field)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


def _turn(request: Request, who: Principal) -> asyncio.Lock:
    """The lock that lets one body of `who` be decoded at a time (the app's, made on first use)."""
    turns: dict[str, asyncio.Lock] | None = getattr(request.app.state, "body_turns", None)
    if turns is None:
        turns = request.app.state.body_turns = {}
    return turns.setdefault(who.name, asyncio.Lock())


def _retry(request: Request, lease: Any, who: Principal, raw: bytes) -> None:
    """A request with an id (`Idempotency-Key`): its saved answer (`Replayed`), or it is marked running until
    its lease ends, and `serving.respond` keeps its answer (`agentmem.server.idempotency`)."""
    rid = Replays.request_id(request)
    if rid is None:
        return
    replays: Replays = request.app.state.replays
    key = (who.name, request.url.path, rid)
    saved = replays.begin(key, raw)
    if saved is not None:
        raise Replayed(saved)
    request.state.replay = key
    lease.then(lambda: replays.end(key))


def json_body(model: type[_M], field: str) -> Callable[..., Awaitable[_M]]:
    """A FastAPI dependency: admit the request, then its JSON body as `model`, decoded in a worker thread.

    Args:
        model: the body's model.
        field: its list of messages or items, bounded by `max_input_items`.
    """

    async def read(request: Request, who: Principal = Depends(principal)) -> _M:
        eng = request.app.state.engine
        lease = eng.admit(who)  # 429 (503 while closing) before any work
        request.state.lease = lease
        try:
            raw = await request.body()
            _retry(request, lease, who, raw)
            async with _turn(request, who):
                return await asyncio.to_thread(_parse, model, raw, field, eng.settings.max_input_items)
        except BaseException:
            lease.release()
            raise

    read.__name__ = f"json_body_{model.__name__}"
    return read


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A route's `openapi_extra`: its JSON body is `model` (see `document_bodies`)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": _REF.format(model=model.__name__)}}}}}


def document_bodies(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Add `models` (and the models they use) to the app's OpenAPI components, for `body_schema`'s refs."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = plain()
        _, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in defs.get("$defs", {}).items():
            schemas.setdefault(name, schema)
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
