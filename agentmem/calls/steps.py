"""The two things the protocol asks of the pool, as values (`Generate`, `HoldsKV`).

The protocol (`agentmem.calls.protocol`) is written once, as a generator that yields
these steps and is sent their answers; `agentmem.calls.runner` answers them
synchronously or on an event loop. So the retry and the write-back exist once, not once
per sync/async/streaming method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Union

from agentmem.calls.gate import StreamGate
from agentmem.calls.plan import CallPlan
from agentmem.calls.reply import Reply
from agentmem.pool import ChatResult

__all__ = ["Generate", "HoldsKV", "Step", "Steps"]


@dataclass(frozen=True, slots=True)
class Generate:
    """Run `plan` on the pool to its end; answered with its `ChatResult`.

    `gate`: the streamed pieces go through it to the caller (`None`: nothing is shown).
    """

    plan: CallPlan
    gate: StreamGate | None = None


@dataclass(frozen=True, slots=True)
class HoldsKV:
    """Whether the agent's KV holds `reply.written_back` token for token as the next prompt renders it; answered with a bool."""

    plan: CallPlan
    reply: Reply


Step = Union[Generate, HoldsKV]
Steps = Generator[Step, Any, Any]
"""A protocol (or strategy) generator: yields steps, is sent their answers, returns its value."""
