"""Which agent a request is for, and whether its key may use that agent.

The agent id comes, in this order, from the `X-Agent-Id` header, the request's `user`
field (what OpenAI clients send per end user; LangChain, AutoGen and CrewAI pass it
through), or the `agent_id` extension field (`extra_body={"agent_id": ...}`). With none
of them, by the server's `anonymous` policy: `lines` (the default) finds the conversation
the request's history continues (`MemoryPool.find_line`, scoped to the key's prefix; the
route does it, `resolve_agent_id` returns None), `per-key` gives the key's anonymous
agent, `{prefix}anonymous-{key name}` (`anonymous` without keys), `reject` a 400. With
several models the per-key agent is one per model: `...anonymous-{key name}@{model}`
(an agent's KV belongs to one model). Lines are per model too: each model's pool keeps
its own (`registry`).

The header's bytes are read as UTF-8 (`agent_header`), as JSON bodies are, so
`X-Agent-Id: team-b/café` and `"user": "team-b/café"` are one agent; bytes that are not
UTF-8 get a 400 naming the header. (HTTP servers hand headers over as latin-1, which
turned the header's `é` into `Ã©`: #23 finding 9.)

Scope: a key scoped to a prefix may use only agent ids under it. A forbidden id gets a
403 whose body depends on the id alone, never on whether the agent exists, so a tenant
cannot probe another tenant's agents.
"""

from __future__ import annotations

from typing import Any

import agentmem.validation as check
from agentmem.errors import ConfigError
from agentmem.server.auth import Principal
from agentmem.server.http_errors import ApiError

__all__ = ["AGENT_HEADER", "agent_header", "authorize", "resolve_agent_id"]

AGENT_HEADER = "X-Agent-Id"
_HEADER_KEY = AGENT_HEADER.lower().encode("ascii")


def agent_header(headers: Any) -> str | None:
    """The first `X-Agent-Id` of a request's headers (Starlette `Headers`), decoded as UTF-8.

    Raises:
        ApiError: 400 when its bytes are not UTF-8 (`param` names the header).
    """
    for name, value in headers.raw:
        if name.lower() == _HEADER_KEY:
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ApiError(400, f"the {AGENT_HEADER} header must be UTF-8 text", code="invalid_request",
                               param=AGENT_HEADER) from exc
    return None


def authorize(principal: Principal, agent_id: str, *, field: str = "agent_id") -> str:
    """`agent_id` if `principal` may use it; a 403 `ApiError` otherwise (same body for every such id)."""
    if not principal.allows(agent_id):
        raise ApiError(403, f"this API key may not use agent {agent_id!r}", code="forbidden", param=field)
    return agent_id


def resolve_agent_id(
    principal: Principal, *, header: str | None, user: str | None, extension: str | None, anonymous: str,
    model: str | None = None,
) -> str | None:
    """The agent a request names (validated and authorized); None: none named and the policy is `lines`.

    Args:
        principal: who sent the request.
        header: the `X-Agent-Id` header, if any, as text (`agent_header`).
        user: the body's `user` field, if any.
        extension: the body's `agent_id` field, if any.
        anonymous: the server's fallback policy (`lines`, `reject` or `per-key`).
        model: several models: the request's model, which a `per-key` agent id ends with.

    Raises:
        ApiError: 400 when no agent is named and the policy is `reject`, or the id is
            invalid; 403 when the key may not use it.
    """
    for value, field in ((header, AGENT_HEADER), (user, "user"), (extension, "agent_id")):
        if value is not None and value != "":
            try:
                agent_id = check.agent_id(value, field=field)
            except ConfigError as exc:
                raise ApiError(400, str(exc), code="invalid_request", param=field) from exc
            return authorize(principal, agent_id, field=field)
    if anonymous == "lines":
        return None
    if anonymous == "per-key":
        agent_id = "anonymous" if principal.name == "local" else f"{principal.prefix}anonymous-{principal.name}"
        return agent_id if model is None else f"{agent_id}@{model}"
    raise ApiError(
        400,
        f"no agent named: send the header {AGENT_HEADER}, the 'user' field or the 'agent_id' field "
        "(or start the server with --anonymous lines or per-key)",
        code="missing_agent_id",
        param="user",
    )
