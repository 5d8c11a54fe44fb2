"""The agents API: llama-server's `/slots`, but by agent.

| request | does |
|---|---|
| `GET /agents` | the agents the key may see: tier, tokens, bytes, codec, counters |
| `GET /agents/{id}` | one agent, with its regions |
| `DELETE /agents/{id}` | forget it (sequence, parked states, archive rows) |
| `POST /agents/{id}?action=park` | `{"tier": "warm"}` (or `"cold"`): park it now |
| `POST /agents/{id}?action=pin` | `{"message_index": 2, "pinned": true}`: never evict that message |
| `POST /agents/{id}?action=budget` | `{"tokens": 2048, "eviction": "region_decay"}` |
| `POST /agents/{id}?action=priority` | `{"priority": "foreground"}` or an int weight |
| `POST /agents/{id}?action=handoff` | `{"to": "other", "upto": 512}`: start `other` as this agent's context |
| `POST /agents/{id}?action=recall` | `{"query": "...", "k": 5}`: search its evicted text |
| `POST /agents/{id}?action=hold` | `{"ttl_s": 30}` (or `null`: from its reload cost): keep it resident, e.g. while its tool runs |
| `POST /agents/{id}?action=unhold` | end the hold |
| `POST /agents?action=expect` | `{"order": ["coder", ["researcher", "writer"]], "soon": true}`: who runs next (`MemoryPool.expect`) |
| `POST /agents?action=checkpoint` | write every agent to the archive (admin keys) |

Agent ids may contain `/` (`tenant-a/planner`). A scoped key sees and touches only ids
under its prefix: anything else is a 403 whose body depends only on the id. No route
returns KV bytes; `bytes` is a count. An action on an unknown agent is a 404 naming only
that id: only a call (or a handoff's destination, counted in the key's `max_agents`)
creates an agent.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ValidationError

from agentmem.server.auth import Principal
from agentmem.server.deps import engine, principal
from agentmem.server.engine import Engine
from agentmem.server.http_errors import ApiError
from agentmem.server.schemas import (
    BudgetRequest,
    ExpectRequest,
    HandoffRequest,
    HoldRequest,
    ParkRequest,
    PinRequest,
    PriorityRequest,
    RecallRequest,
)

__all__ = ["AGENT_ACTIONS", "router"]

router = APIRouter(prefix="/agents")

AGENT_ACTIONS = ("park", "pin", "budget", "priority", "handoff", "recall", "hold", "unhold")
"""What `POST /agents/{id}?action=...` can do."""

M = TypeVar("M", bound=BaseModel)


async def _body(request: Request, model: type[M]) -> M:
    raw = await request.body()
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first.get("loc", ())) or None
        raise ApiError(400, f"{field or 'body'}: {first.get('msg')}", code="invalid_request", param=field) from exc


@router.get("")
async def list_agents(who: Principal = Depends(principal), eng: Engine = Depends(engine)) -> dict[str, Any]:
    """The agents this key may see."""
    return {"object": "list", "data": await eng.list_agents(who)}


@router.post("")
async def pool_action(request: Request, action: str = Query(...), who: Principal = Depends(principal),
                      eng: Engine = Depends(engine)) -> dict[str, Any]:
    """`?action=checkpoint`: write every agent to the archive (admin keys only); `?action=expect`: who runs next."""
    if action == "expect":
        exp = await _body(request, ExpectRequest)
        await eng.expect(who, exp.order, exp.soon)
        return {"ok": True, "order": exp.order}
    if action != "checkpoint":
        raise ApiError(400, f"action must be 'checkpoint' or 'expect', got {action!r}", code="invalid_request",
                       param="action")
    await eng.checkpoint(who)
    return {"ok": True}


@router.get("/{agent_id:path}")
async def show_agent(agent_id: str, who: Principal = Depends(principal), eng: Engine = Depends(engine)) -> dict[str, Any]:
    """One agent."""
    return await eng.show_agent(who, agent_id)


@router.delete("/{agent_id:path}")
async def forget_agent(agent_id: str, who: Principal = Depends(principal), eng: Engine = Depends(engine)) -> dict[str, Any]:
    """Forget an agent."""
    await eng.forget(who, agent_id)
    return {"id": agent_id, "deleted": True}


@router.post("/{agent_id:path}")
async def agent_action(agent_id: str, request: Request, action: str = Query(...), who: Principal = Depends(principal),
                       eng: Engine = Depends(engine)) -> Any:
    """One of `AGENT_ACTIONS` on an agent; the JSON body holds its parameters."""
    if action == "park":
        park = await _body(request, ParkRequest)
        return await eng.park(who, agent_id, park.tier)
    if action == "pin":
        pin = await _body(request, PinRequest)
        return {"id": agent_id, "tokens": await eng.pin(who, agent_id, pin.message_index, pin.pinned)}
    if action == "budget":
        budget = await _body(request, BudgetRequest)
        await eng.set_budget(who, agent_id, budget.tokens, budget.eviction)
        return {"id": agent_id, "budget": budget.tokens, "eviction": budget.eviction}
    if action == "priority":
        prio = await _body(request, PriorityRequest)
        await eng.set_priority(who, agent_id, prio.priority)
        return {"id": agent_id, "priority": prio.priority}
    if action == "handoff":
        hand = await _body(request, HandoffRequest)
        return await eng.handoff(who, agent_id, hand.to, hand.upto)
    if action == "recall":
        rec = await _body(request, RecallRequest)
        return {"object": "list", "data": await eng.recall(who, agent_id, rec.query, rec.k)}
    if action == "hold":
        hold = await _body(request, HoldRequest)
        await eng.hold(who, agent_id, hold.ttl_s)
        return {"id": agent_id, "held": True, "ttl_s": hold.ttl_s}
    if action == "unhold":
        await eng.unhold(who, agent_id)
        return {"id": agent_id, "held": False}
    raise ApiError(400, f"action must be one of {', '.join(AGENT_ACTIONS)}, got {action!r}", code="invalid_request",
                   param="action")
