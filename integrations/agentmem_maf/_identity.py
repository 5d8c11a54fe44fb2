"""Whose KV a call uses: the agent id rule of `AgentMemChatClient` and `AgentMemContextProvider`, in one place.

The first of these that is set names the pool agent of a call:

1. the client's own `agent_id` (`AgentMemChatClient(pool, agent_id="pm")`);
2. the `name` of the MAF `Agent` built on the client (`Agent(client=..., name="pm")`:
   MAF tells a client its agent's name when the agent is created; the first name given
   is kept, so give each agent its own client);
3. the id of the `AgentSession` the caller passed (`agent.run(..., session=s)`: one KV
   per conversation; `agent.create_session(session_id="pm")` names it);
4. `FALLBACK_AGENT_ID` (a nameless agent run without a session).

A session the framework created for one run (no `session=` given) does not name an
agent: its id is new on every run, so its KV could never be reused.
"""

from __future__ import annotations

from typing import Any, Mapping

import agentmem.validation as check

__all__ = ["FALLBACK_AGENT_ID", "resolve_agent_id", "session_of"]

FALLBACK_AGENT_ID = "maf"
"""The KV slot of a call nothing else names."""
_SESSION_IS_CALLERS = "_approval_session_is_authoritative"  # agent_framework._tools: False = created for this run


def session_of(client_kwargs: Mapping[str, Any]) -> Any:
    """The caller's `AgentSession` of a call's `client_kwargs` (`None`: none, or one made for this run)."""
    if client_kwargs.get(_SESSION_IS_CALLERS, True) is False:
        return None
    return client_kwargs.get("session")


def resolve_agent_id(named: str | None, session: Any) -> str:
    """The pool agent of one call (the rule in this module's docstring).

    Args:
        named: the client's `agent_id`, else its agent's name (rules 1 and 2), or `None`.
        session: the caller's `AgentSession` of the run, or `None`.

    Raises:
        agentmem.ConfigError: a malformed session id (named `session.session_id`).
    """
    if named is not None:
        return named
    if session is None:
        return FALLBACK_AGENT_ID
    return check.agent_id(getattr(session, "session_id", None), field="session.session_id")
