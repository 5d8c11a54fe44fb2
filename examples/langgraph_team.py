"""A LangGraph supervisor team on one local model, where every graph node is its own agent.

A supervisor hands each task to three workers in turn — a researcher (who calls a
``search`` tool through LangGraph's ``ToolNode``), a coder and a writer — and every
node calls **one shared** ``ChatAgentMem`` object. No agent id is written anywhere:
``ChatAgentMem`` takes it from LangGraph's run config (``"{thread_id}/{node}"``), so
each node keeps its own KV memory, and ``model.follow(app)`` lets the pool see the
graph's edges (who runs next) and hold the researcher's sequence while its tool runs.

All nodes share the team's message list, each with its own system prompt in front,
as LangGraph supervisor apps do. With ``ChatAgentMem`` a node's turn decodes only the
messages added since its last turn: its KV survives the other nodes' turns, live in a
llama.cpp sequence or parked in RAM (``--resident`` sequences for four agents).

Run from a fresh clone (the bundled instruct model, about a minute on 2 CPU cores)::

    pip install -e '.[langchain,model]' langgraph
    python examples/langgraph_team.py --threads 2

Each model call prints its node, its agent, where its KV was found (``kv``), how many
prompt tokens came from kept KV and its time to first token. The same graph and
prompts on langchain-community's ``ChatLlamaCpp``: ``examples/langgraph_team_baseline.py``;
the measured comparison is in ``examples/langchain_README.md``.

Routing is scripted (researcher, coder, writer, then done) so that both backends take
the same path through the graph; the supervisor writes each worker's instruction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Callable, Protocol, TypedDict

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

MODEL = "qwen2.5-coder-0.5b-instruct"
WORKERS = ("researcher", "coder", "writer")

TEAM_BRIEF = (
    "You are one member of a small software team that answers questions from users of a "
    "data library. The supervisor reads the request and hands it to the workers in turn. "
    "The researcher looks facts up with the search tool and reports them briefly. The coder "
    "writes one short Python snippet that uses the facts. The writer answers the user in two "
    "plain sentences. Everyone keeps replies short, stays on the current request and never "
    "invents facts that the notes do not contain."
)
ROLES = {
    "supervisor": "You are the supervisor. When told who works next, write that worker one short instruction.",
    "researcher": "You are the researcher. Call the search tool, then report the facts it returned.",
    "coder": "You are the coder. Reply with one short Python snippet, no explanation.",
    "writer": "You are the writer. Reply to the user in two sentences.",
}
TASKS = [
    "How do I read a CSV file in chunks?",
    "How can I speed up a groupby on a large table?",
    "What is the safest way to store timestamps?",
]
FACTS = {
    "csv": "read_csv(path, chunksize=N) returns an iterator of DataFrames with N rows each.",
    "groupby": "Categorical group keys and sort=False make groupby faster on large tables.",
    "timestamp": "Store timestamps in UTC with an explicit time zone; convert to local time only for display.",
}


@tool
def search(query: str) -> str:
    """Search the library documentation."""
    q = query.lower()
    hits = [text for key, text in FACTS.items() if key in q]
    return " ".join(hits) or "No documentation found for that query."


class TeamState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    done: list[str]


@dataclass
class Call:
    """What one model call of one node cost."""

    task: int
    node: str
    agent: str
    kv: str
    cache_read: int
    prompt_tokens: int
    ttft_ms: float
    total_ms: float


class Backend(Protocol):
    """The model every node shares; the agentmem and the baseline scripts differ only here."""

    name: str
    model: Any

    def attach(self, app: Any) -> None:
        """Called once with the compiled graph."""
        ...

    def begin(self) -> None:
        """A model call starts."""
        ...

    def metrics(self, message: BaseMessage) -> dict[str, Any]:
        """`agent`, `kv`, `cache_read`, `prompt_tokens` of the call that produced `message`."""
        ...

    def close(self) -> None: ...


class CallRecorder(BaseCallbackHandler):
    """Times every model call of the graph (start, first streamed token, end)."""

    def __init__(self, backend: Backend, printer: Callable[[str], None]) -> None:
        self.backend, self.printer = backend, printer
        self.calls: list[Call] = []
        self.task = 0
        self._t0 = self._first = 0.0
        self._node = ""

    def on_chat_model_start(self, serialized: Any, messages: Any, *, metadata: dict[str, Any] | None = None, **kw: Any) -> None:
        self._node = str((metadata or {}).get("langgraph_node", "?"))
        self._t0, self._first = time.perf_counter(), 0.0
        self.backend.begin()

    def on_llm_new_token(self, token: str, **kw: Any) -> None:
        if not self._first and token:
            self._first = time.perf_counter()

    def on_llm_end(self, response: Any, **kw: Any) -> None:
        end = time.perf_counter()
        message = response.generations[0][0].message
        m = self.backend.metrics(message)
        first = self._first or end  # a forced tool call is not streamed: its TTFT is its total time
        call = Call(self.task, self._node, m["agent"], m["kv"], m["cache_read"], m["prompt_tokens"],
                    1e3 * (first - self._t0), 1e3 * (end - self._t0))
        self.calls.append(call)
        self.printer(f"{call.task:>4} {call.node:<10} {call.agent:<16} {call.kv:<9} "
                     f"{call.cache_read:>5}/{call.prompt_tokens:<5} {call.ttft_ms:8.0f} {call.total_ms:8.0f}")


def _text_reply(model: Any, messages: list[BaseMessage], max_tokens: int) -> AIMessage:
    """A streamed text reply (streaming is what gives a time to first token)."""
    full: Any = None
    for chunk in model.stream(messages, max_tokens=max_tokens):
        full = chunk if full is None else full + chunk
    return AIMessage(full.text if full is not None else "")


#: The forced call of the researcher, in the form both ChatAgentMem and ChatLlamaCpp honour
#: (ChatLlamaCpp's `bind_tools` ignores a tool name given as a plain string).
FORCE_SEARCH = {"type": "function", "function": {"name": "search"}}


def build_graph(model: Any, *, max_tokens: int = 40, no_tool: Any = "none") -> Any:
    """The supervisor graph; every node calls `model` (one object, no agent ids).

    `no_tool` is the `tool_choice` that keeps the tool described but not called
    (`"none"`; ChatLlamaCpp takes `None` for that).
    """

    def view(role: str, s: TeamState) -> list[BaseMessage]:
        return [SystemMessage(f"{TEAM_BRIEF}\n\n{ROLES[role]}"), *s["messages"]]

    def supervisor(s: TeamState) -> dict[str, Any]:
        nxt = next((w for w in WORKERS if w not in s["done"]), None)
        if nxt is None:
            return {"done": [*s["done"], "finish"]}
        prompt = [*view("supervisor", s), HumanMessage(f"Next: the {nxt}. Write the instruction.")]
        reply = _text_reply(model, prompt, max_tokens)
        return {"messages": [HumanMessage(f"Next: the {nxt}. Write the instruction."), reply]}

    def route(s: TeamState) -> str:
        return next((w for w in WORKERS if w not in s["done"]), END)

    def researcher(s: TeamState) -> dict[str, Any]:
        bound = model.bind_tools([search], tool_choice=FORCE_SEARCH)
        if s["messages"] and s["messages"][-1].type == "tool":  # the tool answered: report the facts
            reply = _text_reply(model.bind_tools([search], tool_choice=no_tool), view("researcher", s), max_tokens)
            return {"messages": [reply], "done": [*s["done"], "researcher"]}
        call = bound.invoke(view("researcher", s), max_tokens=max_tokens)
        if call.tool_calls:  # → the ToolNode, then back here
            return {"messages": [call]}
        return {"messages": [call], "done": [*s["done"], "researcher"]}  # a call cut off by max_tokens

    def worker(role: str) -> Callable[[TeamState], dict[str, Any]]:
        def run(s: TeamState) -> dict[str, Any]:
            return {"messages": [_text_reply(model, view(role, s), max_tokens)], "done": [*s["done"], role]}

        return run

    g = StateGraph(TeamState)
    g.add_node("supervisor", supervisor)
    g.add_node("researcher", researcher)
    g.add_node("tools", ToolNode([search]))
    g.add_node("coder", worker("coder"))
    g.add_node("writer", worker("writer"))
    g.add_edge(START, "supervisor")
    g.add_conditional_edges("supervisor", route, [*WORKERS, END])
    g.add_conditional_edges("researcher", lambda s: "tools" if getattr(s["messages"][-1], "tool_calls", None) else "supervisor",
                            ["tools", "supervisor"])
    g.add_edge("tools", "researcher")
    g.add_edge("coder", "supervisor")
    g.add_edge("writer", "supervisor")
    return g.compile(checkpointer=InMemorySaver())


@dataclass
class Team:
    """Runs the tasks through the graph on one thread and sums up the calls."""

    backend: Backend
    tasks: int = 2
    max_tokens: int = 40
    printer: Callable[[str], None] = print
    wall_s: float = 0.0
    recorder: CallRecorder = field(init=False)

    def run(self, thread: str = "team-1") -> list[Call]:
        app = build_graph(self.backend.model, max_tokens=self.max_tokens, no_tool=getattr(self.backend, "no_tool", "none"))
        self.backend.attach(app)
        self.recorder = CallRecorder(self.backend, self.printer)
        self.printer(f"{'task':>4} {'node':<10} {'agent':<16} {'kv':<9} {'cached/prompt':<11} {'ttft ms':>8} {'total ms':>8}")
        config = {"configurable": {"thread_id": thread}, "callbacks": [self.recorder], "recursion_limit": 50}
        t0 = time.perf_counter()
        for i, task in enumerate(TASKS[: self.tasks], start=1):
            self.recorder.task = i
            app.invoke({"messages": [HumanMessage(task)], "done": []}, config)
        self.wall_s = time.perf_counter() - t0
        return self.recorder.calls

    def summary(self) -> dict[str, Any]:
        calls = self.recorder.calls
        ttft = sorted(c.ttft_ms for c in calls)
        later = [c.ttft_ms for c in calls if c.task > 1]
        return {
            "backend": self.backend.name,
            "calls": len(calls),
            "wall_s": round(self.wall_s, 2),
            "prompt_tokens": sum(c.prompt_tokens for c in calls),
            "cache_read": sum(c.cache_read for c in calls),
            "prefilled_tokens": sum(c.prompt_tokens - c.cache_read for c in calls),
            "ttft_p50_ms": round(statistics.median(ttft), 1),
            "ttft_max_ms": round(ttft[-1], 1),
            "ttft_mean_ms_after_task_1": round(statistics.fmean(later), 1) if later else None,
            "agents": sorted({c.agent for c in calls}),
        }


class AgentMemBackend:
    """One `ChatAgentMem` (no agent id) on a pool with fewer live sequences than agents."""

    name = "agentmem ChatAgentMem"

    def __init__(self, *, model: str, threads: int, resident: int, hints: bool = True, max_tokens: int = 40,
                 pool_options: dict[str, Any] | None = None) -> None:
        from agentmem import MemoryPool
        from agentmem_langchain import ChatAgentMem

        # hints=False: none sent, and the pool ignores its own (the hold after a tool call);
        # pool_options: more `MemoryPool` settings (a RAM budget, an archive)
        self.pool = MemoryPool(model, n_ctx=8192, resident_agents=resident, n_threads=threads, hints=hints,
                               **(pool_options or {}))
        self.model = ChatAgentMem(pool=self.pool, workflow_hints=hints, max_tokens=max_tokens)
        self.hints = hints

    def attach(self, app: Any) -> None:
        if self.hints:
            self.model.follow(app)

    def begin(self) -> None:
        pass

    def metrics(self, message: BaseMessage) -> dict[str, Any]:
        usage, meta = message.usage_metadata or {}, message.response_metadata
        return {"agent": meta["agent_id"], "kv": meta["kv"], "cache_read": usage["input_token_details"]["cache_read"],
                "prompt_tokens": usage["input_tokens"]}

    def pool_line(self) -> str:
        st = self.pool.stats()
        t, h = st["totals"], st.get("hints", {})
        return (f"pool: restores={t['restores']} parks={t['parks']} prefill_tokens={t['prefill_tokens']} "
                f"cached_tokens={t['cached_tokens']} hint_hit_rate={h.get('hit_rate', 'n/a')} holds={h.get('holds', 'n/a')}")

    def close(self) -> None:
        self.pool.close()


def main(argv: list[str] | None = None, backend_factory: Callable[[argparse.Namespace], Any] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL, help=f"GGUF path or bundled model name (default: {MODEL})")
    parser.add_argument("--tasks", type=int, default=2, choices=range(1, len(TASKS) + 1))
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0 = AGENTMEM_THREADS or cores less the load)")
    parser.add_argument("--resident", type=int, default=2, help="live sequences for the four agents (the others are parked in RAM)")
    parser.add_argument("--no-hints", action="store_true", help="send no workflow hints to the pool")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    from agentmem import resolve_model_path
    from agentmem.engine.threads import default_threads

    args.threads = args.threads or default_threads()  # resolved here: both backends run with the same count
    args.model = str(resolve_model_path(args.model))
    backend = backend_factory(args) if backend_factory else AgentMemBackend(
        model=args.model, threads=args.threads, resident=args.resident, hints=not args.no_hints, max_tokens=args.max_tokens)
    try:
        team = Team(backend, tasks=args.tasks, max_tokens=args.max_tokens)
        print(f"# {backend.name} — {args.tasks} tasks, max_tokens={args.max_tokens}, threads={args.threads}")
        team.run()
        summary = team.summary()
        if isinstance(backend, AgentMemBackend):
            print(backend.pool_line())
        print(json.dumps(summary) if args.json else "\n".join(f"{k}: {v}" for k, v in summary.items()))
        summary["calls_detail"] = [asdict(c) for c in team.recorder.calls]
        return summary
    finally:
        backend.close()


if __name__ == "__main__":
    main()
