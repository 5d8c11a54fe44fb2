"""The LangChain apps `benchmarks/apps.py` measures: the LangGraph team, a tool-heavy `create_agent`, summarization.

* `team` — `examples/langgraph_team.py` (a supervisor and three workers, one tool), one
  thread, `--resident` live sequences for its four agents.
* `tools` — `langchain.agents.create_agent` with three tools, `--users` users at once
  (one thread each, so one agent each) on fewer live sequences; every question calls two
  tools, each taking `--tool-latency-s`, then answers. Which tool is called when is fixed
  (a `wrap_model_call` middleware sets `tool_choice`), so every variant takes the same path.
* `summary` — one agent's long history through `SummarizationMiddleware` (a fixed-text
  summarizer: no model call) vs the same history on a pool with `agent_budget_tokens`:
  the prompt tokens read from kept KV on the call after the summary.

Each variant is a `Variant` (how the model and the pool are built); each run returns
the calls (`Call`: agent, cached/prompt tokens, TTFT, total) and the pool's stats. The
server variants (`benchmarks/_apps_servers.py`) run the same `run_team` / `run_tools` with
a `ChatOpenAI` per agent (`run_tools(model_for=...)`: one app per user).
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import langgraph_team as team_app  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402
from langchain_core.tools import StructuredTool, tool  # noqa: E402
from langgraph_team import Call, CallRecorder  # noqa: E402


@dataclass
class Variant:
    """One way of running the apps: agentmem with or without hints, all resident, or ChatLlamaCpp."""

    name: str
    kind: str  # "agentmem" | "llamacpp"
    hints: bool = True
    all_resident: bool = False


VARIANTS = {
    "hints": Variant("agentmem, hints", "agentmem", hints=True),
    "nohints": Variant("agentmem, no hints", "agentmem", hints=False),
    "resident": Variant("agentmem, all resident", "agentmem", hints=True, all_resident=True),
    "llamacpp": Variant("ChatLlamaCpp", "llamacpp"),
}


def _agentmem_backend(v: Variant, *, model: str, threads: int, resident: int, n_agents: int, max_tokens: int,
                      warm_mib: float = 0.0) -> Any:
    # no hints: none sent (`workflow_hints=False`) and the pool's own hold after a tool call
    # off too (`PoolConfig.hints=False`): the pool as it was before hints, learned predictor only.
    # warm_mib: RAM for parked states (no archive: a state over it is dropped and re-prefilled);
    # the all-resident variant parks nothing and has none
    opts = {"warm_budget_bytes": int(warm_mib * 2**20)} if warm_mib and not v.all_resident else {}
    return team_app.AgentMemBackend(model=model, threads=threads, resident=n_agents if v.all_resident else resident,
                                    hints=v.hints, max_tokens=max_tokens, pool_options=opts)


def make_backend(v: Variant, *, model: str, threads: int, resident: int, n_agents: int, max_tokens: int,
                 warm_mib: float = 0.0) -> Any:
    if v.kind == "agentmem":
        return _agentmem_backend(v, model=model, threads=threads, resident=resident, n_agents=n_agents,
                                 max_tokens=max_tokens, warm_mib=warm_mib)
    from langgraph_team_baseline import ChatLlamaCppBackend

    return LockedLlamaCpp(ChatLlamaCppBackend(model=model, threads=threads, max_tokens=max_tokens))


class LockedLlamaCpp:
    """The ChatLlamaCpp backend with one call at a time (one llama.cpp context is not thread-safe).

    `begin`/`metrics` are bracketed by the lock, so the reuse read from its `eval`
    belongs to the call that is timed.
    """

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.model, self.no_tool = inner, inner.name, inner.model, inner.no_tool
        self._local = threading.local()
        self.lock = threading.RLock()
        real_stream, real_generate = self.model._stream, self.model._generate

        def stream(*a: Any, **k: Any) -> Any:
            with self.lock:
                self.inner.begin()
                yield from real_stream(*a, **k)
                self._local.first = self.inner._first  # read by `metrics` in this thread, after the lock

        def generate(*a: Any, **k: Any) -> Any:
            with self.lock:
                self.inner.begin()
                out = real_generate(*a, **k)
                self._local.first = self.inner._first
                return out

        object.__setattr__(self.model, "_stream", stream)
        object.__setattr__(self.model, "_generate", generate)

    def attach(self, app: Any) -> None:
        pass

    def begin(self) -> None:
        pass

    def metrics(self, message: Any) -> dict[str, Any]:
        with self.lock:
            self.inner._first = getattr(self._local, "first", None)
            return self.inner.metrics(message)

    def close(self) -> None:
        self.inner.close()


# ------------------------------------------------------------------ team
def run_team(backend: Any, *, tasks: int, max_tokens: int) -> tuple[list[Call], float]:
    t = team_app.Team(backend, tasks=tasks, max_tokens=max_tokens, printer=lambda s: None)
    t.run()
    return t.recorder.calls, t.wall_s


# ------------------------------------------------------------------ tool-heavy single agent
ORDERS = {"A17": "shipped on Monday, arriving Thursday", "B42": "waiting for stock", "C08": "delivered"}


@tool
def order_status(order_id: str) -> str:
    """The status of an order, by its id (like A17)."""
    return ORDERS.get(order_id.strip().upper(), "no such order")


@tool
def shipping_quote(weight_kg: int, country: str) -> str:
    """The shipping price of a parcel."""
    return f"{5 + 2 * max(1, weight_kg)} EUR to {country}, 3-5 days"


@tool
def return_policy(category: str) -> str:
    """The return policy of a product category."""
    return f"{category}: returns within 30 days, unused, with the receipt"


TOOLS = [order_status, shipping_quote, return_policy]
QUESTIONS = [
    ("Where is my order A17, and what would shipping 3 kg to France cost?", ["order_status", "shipping_quote"]),
    ("Can I return shoes? Also, what is the status of order B42?", ["return_policy", "order_status"]),
    ("What does shipping 1 kg to Spain cost, and can I return a lamp?", ["shipping_quote", "return_policy"]),
]
SUPPORT_PROMPT = (
    "You are the support agent of an online shop. Use the tools to look facts up: order_status for "
    "orders, shipping_quote for prices, return_policy for returns. Answer in at most two sentences, "
    "using only what the tools returned."
)


def _tool_agent(model: Any, *, answer_choice: Any, latency_s: float) -> Any:
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langgraph.checkpoint.memory import InMemorySaver

    @wrap_model_call
    def scripted_tools(request: Any, handler: Callable[[Any], Any]) -> Any:
        # the question's plan: its tools in order, then the answer
        asked = [m for m in request.messages if m.type == "human"][-1].content
        plan = next(p for q, p in QUESTIONS if q == asked)
        since = request.messages[[i for i, m in enumerate(request.messages) if m.type == "human"][-1]:]
        done = sum(1 for m in since if m.type == "tool")
        # a forced call as a dict: the form ChatLlamaCpp's bind_tools honours
        choice = {"type": "function", "function": {"name": plan[done]}} if done < len(plan) else answer_choice
        return handler(request.override(tool_choice=choice))

    def slow(t: Any) -> Any:
        def run(**kw: Any) -> str:
            time.sleep(latency_s)  # a tool's own latency (an API call, a query)
            return t.invoke(kw)

        return StructuredTool.from_function(run, name=t.name, description=t.description, args_schema=t.args_schema)

    return create_agent(model, [slow(t) for t in TOOLS], system_prompt=SUPPORT_PROMPT,
                        middleware=[scripted_tools], checkpointer=InMemorySaver())


def run_tools(backend: Any, *, users: int, questions: int, latency_s: float, answer_choice: Any,
              max_tokens: int, model_for: Callable[[str], Any] | None = None,
              distinct: bool = False) -> tuple[list[Call], float]:
    """`users` threads at once, each asking `questions` questions of its own agent.

    `distinct`: user `u` starts at question `u` (the list rotated), so users at the same
    step ask different questions; by default every user asks the same ones in order.

    `model_for(agent)`: each user's own model object and app (a server client per
    agent); without it every user shares `backend.model` and one app.
    """
    # the models carry `max_tokens` themselves (create_agent binds tools on the model object)
    shared = None if model_for else _tool_agent(backend.model, answer_choice=answer_choice, latency_s=latency_s)
    if shared is not None and backend.name.startswith("agentmem"):
        backend.attach(shared)
    calls: list[Call] = []
    lock = threading.Lock()

    def user(u: int) -> None:
        app = shared or _tool_agent(model_for(f"user-{u}"), answer_choice=answer_choice, latency_s=latency_s)
        rec = CallRecorder(backend, lambda s: None)
        order = QUESTIONS[u % len(QUESTIONS):] + QUESTIONS[:u % len(QUESTIONS)] if distinct else QUESTIONS
        for qi, (q, _plan) in enumerate(order[:questions], start=1):
            rec.task = qi
            cfg = {"configurable": {"thread_id": f"user-{u}"}, "callbacks": [rec], "recursion_limit": 20}
            for _ in app.stream({"messages": [HumanMessage(q)]}, cfg, stream_mode="messages"):
                pass  # streaming mode: the model node streams, which gives each call a TTFT
        with lock:
            calls.extend(rec.calls)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(users) as ex:
        list(ex.map(user, range(users)))
    return calls, time.perf_counter() - t0


# ------------------------------------------------------------------ summarization vs budget
def run_summary(*, model: str, threads: int, turns: int, keep: int) -> dict[str, Any]:
    """Cached prompt tokens on the call after a summary, vs the same history under a token budget."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware
    from langgraph.checkpoint.memory import InMemorySaver

    from agentmem import MemoryPool
    from agentmem_langchain import ChatAgentMem

    words = "river stone lantern market orchard signal harbor ledger garden copper".split()
    facts = [f"Note {i}: the {words[i % 10]} code is {1000 + 37 * i}." for i in range(turns)]
    out: dict[str, Any] = {}

    def drive(m: Any, middleware: list[Any]) -> list[dict[str, Any]]:
        app = create_agent(m, [], system_prompt="You keep notes for the user.", middleware=middleware,
                           checkpointer=InMemorySaver())
        rows = []
        cfg = {"configurable": {"thread_id": "notes"}}
        for f in facts:
            res = app.invoke({"messages": [HumanMessage(f)]}, cfg)
            ai = [x for x in res["messages"] if isinstance(x, AIMessage)][-1]
            u = ai.usage_metadata or {}
            rows.append({"prompt": u.get("input_tokens", 0), "cached": u.get("input_token_details", {}).get("cache_read", 0),
                         "messages": len(res["messages"])})
        return rows

    with MemoryPool(model, n_ctx=4096, resident_agents=2, n_threads=threads) as pool:
        m = ChatAgentMem(pool=pool, max_tokens=8)
        first = drive(m, [])
        budget = max(64, first[-1]["prompt"] // 2)  # the budget keeps about half the final history
    with MemoryPool(model, n_ctx=4096, resident_agents=2, n_threads=threads) as pool:
        m = ChatAgentMem(pool=pool, max_tokens=8)
        trig = 3 * keep  # messages: each turn adds two
        summ = SummarizationMiddleware(m, trigger=("messages", trig), keep=("messages", keep),
                                       summarizer=lambda msgs: f"The user gave {len(msgs)} notes.")
        out["summarization"] = drive(m, [summ])
    with MemoryPool(model, n_ctx=4096, resident_agents=2, n_threads=threads, agent_budget_tokens=budget) as pool:
        out["budget"] = drive(ChatAgentMem(pool=pool, max_tokens=8), [])
        out["budget_tokens"] = budget
    out["no_limit"] = first
    return out
