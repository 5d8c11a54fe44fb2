"""The one tool-call protocol every front-end runs: plan → run → read → retry → write back.

`plan.py` holds `CallPlan`, one call ready for the pool and how its reply is read.
`planning.py` builds a chat call's plan from tools, a tool choice, a JSON reply or a grammar.
`reply.py` reads a reply (`read_reply` → `Reply`: content, calls, a retry, the text to write back).
`gate.py` decides which streamed text may be shown yet (`StreamGate`).
`steps.py` names what the protocol asks of the pool (`Generate`, `HoldsKV`).
`strategy.py` generates and reads a reply (`LazyCall`: a free tool turn in one decode under a lazy
grammar; `FreeThenForced`: free, then once forced): where a new decode way plugs in.
`protocol.py` is the protocol itself (`call_steps` → `CallOutcome`), written once as steps.
`runner.py` drives it on a pool in a thread or on an event loop (`CallRunner`).
`turns.py` serializes one agent's calls for threads and coroutines alike (`AgentTurns`, `turns_for`).

The server, `agentmem_langchain`, `agentmem_autogen` and `agentmem_maf` keep only their
adaptation: their request and message types in, their reply types and events out. The
thread → asyncio bridge under the runner is `agentmem.pool.bridge`.
"""

from __future__ import annotations

from agentmem.calls.gate import StreamGate
from agentmem.calls.plan import CallPlan, Mode
from agentmem.calls.planning import forced_plan, json_plan, plan_chat, show_tools
from agentmem.calls.protocol import CallOutcome, call_steps
from agentmem.calls.reply import Reply, read_reply
from agentmem.calls.runner import CallEvent, CallRunner
from agentmem.calls.steps import Generate, HoldsKV
from agentmem.calls.strategy import STRATEGIES, Decoded, DecodeStrategy, FreeThenForced, LazyCall, get_strategy
from agentmem.calls.turns import AgentTurns, turns_for

__all__ = [
    "STRATEGIES",
    "AgentTurns",
    "CallEvent",
    "CallOutcome",
    "CallPlan",
    "CallRunner",
    "DecodeStrategy",
    "Decoded",
    "FreeThenForced",
    "Generate",
    "HoldsKV",
    "LazyCall",
    "Mode",
    "Reply",
    "StreamGate",
    "call_steps",
    "forced_plan",
    "get_strategy",
    "json_plan",
    "plan_chat",
    "read_reply",
    "show_tools",
    "turns_for",
]
