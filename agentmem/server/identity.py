"""Which agent a request is for, and whether its key may use that agent.

The agent id comes, in this order, from the `X-Agent-Id` header, the request's `user`
field (what OpenAI clients send per end user; LangChain, AutoGen and CrewAI pass it
through), or the `agent_id` extension field (`extra_body={"agent_id": ...}`). With none
of them, by the server's `anonymous` policy: `lines` (the default) finds the conversation
the request's history continues (`MemoryPool.find_line`, scoped to the key's prefix; the
route does it, `resolve_agent_id` returns None), `per-key` gives the key's anonymous
agent, `{prefix}anonymous-{key name}` (`@admin/{key name}/anonymous` for an admin key, `anonymous`
without keys), `reject` a 400. With
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
from agentmem.server.auth import ADMIN_SPACE, Principal
from agentmem.server.http_errors import ApiError

__all__ = ["AGENT_HEADER", "END_USER_HEADER", "agent_header", "authorize", "end_user", "resolve_agent_id"]

AGENT_HEADER = "X-Agent-Id"
END_USER_HEADER = "X-End-User"
_MAX_END_USER = 256


def _header(headers: Any, header: str) -> str | None:
    key = header.lower().encode("ascii")
    for name, value in headers.raw:
        if name.lower() == key:
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ApiError(400, f"the {header} header must be UTF-8 text", code="invalid_request",
                               param=header) from exc
    return None


def agent_header(headers: Any) -> str | None:
    """The first `X-Agent-Id` of a request's headers (Starlette `Headers`), decoded as UTF-8.

    Raises:
        ApiError: 400 when its bytes are not UTF-8 (`param` names the header).
    """
    return _header(headers, AGENT_HEADER)


def end_user(headers: Any, field: str | None, *, name: str = "user") -> str | None:
    """The end user of a request on a server with `--end-users`: the `X-End-User` header, else the body's
    end-user field (`name`: OpenAI's `user`, Anthropic's `metadata.user_id`); `None` when neither is sent.

    Raises:
        ApiError: 400 when it is longer than 256 characters (`param` names where it came from).
    """
    value, where = _header(headers, END_USER_HEADER), END_USER_HEADER
    if not value:
        value, where = field, name
    if not value:
        return None
    if len(value) > _MAX_END_USER:
        raise ApiError(400, f"{where} must be at most {_MAX_END_USER} characters", code="invalid_request", param=where)
    return value


def authorize(principal: Principal, agent_id: str, *, field: str = "agent_id") -> str:
    """`agent_id` if `principal` may use it; a 403 `ApiError` otherwise (same body for every such id)."""
    if not principal.allows(agent_id):
        raise ApiError(403, f"this API key may not use agent {agent_id!r}", code="forbidden", param=field)
    return agent_id


def resolve_agent_id(
    principal: Principal, *, header: str | None, user: str | None, extension: str | None, anonymous: str,
    model: str | None = None, space: str | None = None,
) -> str | None:
    """The agent a request names (validated and authorized); None: none named and the policy is `lines`.

    Args:
        principal: who sent the request.
        header: the `X-Agent-Id` header, if any, as text (`agent_header`).
        user: the body's `user` field, if any.
        extension: the body's `agent_id` field, if any.
        anonymous: the server's fallback policy (`lines`, `reject` or `per-key`).
        model: several models: the request's model, which a `per-key` agent id ends with.
        space: the request's end-user space (`auth.end_user_space`, `--end-users`): a `per-key`
            agent is one per end user, `{space}anonymous`.

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
        if space is not None:
            agent_id = f"{space}anonymous"
        elif principal.name == "local":
            agent_id = "anonymous"
        elif principal.admin:  # under the admin space, where no scoped key reaches (#33 F5)
            agent_id = f"{ADMIN_SPACE}{principal.name}/anonymous"
        else:
            agent_id = f"{principal.prefix}anonymous-{principal.name}"
        return agent_id if model is None else f"{agent_id}@{model}"
    raise ApiError(
        400,
        f"no agent named: send the header {AGENT_HEADER}, the 'user' field or the 'agent_id' field "
        "(or start the server with --anonymous lines or per-key)",
        code="missing_agent_id",
        param="user",
    )
