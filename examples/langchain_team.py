"""A three-agent LangChain team on one local model, with per-agent KV memory.

planner → researcher (calls a ``search`` tool) → writer, for several rounds. Each
agent keeps its own growing conversation (a long team brief, every round's
messages). With ``ChatAgentMem`` every agent's KV state survives the switches to
the other agents — live in a llama.cpp sequence or parked in RAM — so a turn
decodes only its new messages. Each turn prints how the agent's memory was found
(``kv``), how many prompt tokens came from kept KV (``cache_read``) and the time
to the first token.

Run (default model, about 20 s on 2 CPU cores)::

    python examples/langchain_team.py --threads 1

The same team on langchain-community's ``ChatLlamaCpp`` (one shared llama.cpp
context that keeps only the last prompt): ``examples/langchain_team_baseline.py``.
Measured comparison: ``examples/langchain_README.md``.

Note: the default model (Gemma 3 270M) is a small *base* model — its prose is
not the point here; the timings and the cache columns are. Any GGUF chat model
can be passed with ``--model``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

TEAM_BRIEF = (
    "You are part of a three-agent writing team: a planner, a researcher and a writer. "
    "The team produces short, accurate briefings for a science magazine. The planner breaks "
    "each topic into two concrete questions. The researcher answers them from the search tool "
    "and reports facts only, with numbers where possible. The writer turns the notes into one "
    "clear paragraph for a general audience, without jargon, in a friendly but precise tone. "
    "Every agent keeps its answers short, stays on the topic of the round, never invents "
    "sources, and says so when the notes do not answer a question. Each round is a new topic."
)

ROLES = {
    "planner": "Your role: planner. Reply with two numbered questions for the researcher.",
    "researcher": "Your role: researcher. Use the search tool, then report the facts you found.",
    "writer": "Your role: writer. Write one paragraph from the research notes.",
}

TOPICS = ["tidal power", "urban beekeeping", "solar sails", "deep-sea vents"]

FACTS = {
    "tidal power": "Tidal power plants turn the rise and fall of the sea into electricity. "
    "The Sihwa Lake station in South Korea (254 MW) is the largest; La Rance in France has run since 1966.",
    "urban beekeeping": "City bees often do well because parks and gardens flower for months. "
    "Paris has over 700 hives on rooftops, including on the Opera Garnier.",
    "solar sails": "A solar sail is pushed by sunlight itself. Japan's IKAROS (2010) was the first to fly "
    "between planets; its sail was 20 m across and thinner than a hair.",
    "deep-sea vents": "Hydrothermal vents release water above 350 °C from the sea floor. "
    "Whole ecosystems live there on chemosynthesis instead of sunlight, first seen in 1977.",
}


@tool
def search(query: str) -> str:
    """Search the team's reference notes for a topic."""
    q = query.lower()
    for topic, text in FACTS.items():
        if any(word in q for word in topic.split()):
            return text
    return "No notes found for that query."


@dataclass
class Turn:
    """What one model call cost."""

    round: int
    agent: str
    step: str
    ttft_ms: float
    total_ms: float
    prompt_tokens: int
    cache_read: int
    kv: str


class Backend(Protocol):
    """How the team talks to a model: the agentmem and the baseline scripts differ only here."""

    name: str

    def reply(self, agent: str, messages: list[BaseMessage], *, step: str, max_tokens: int) -> tuple[AIMessage, dict[str, Any]]:
        """Text reply (streamed); metrics: ttft_ms, prompt_tokens, cache_read, kv."""
        ...

    def call_tool(self, agent: str, messages: list[BaseMessage], *, max_tokens: int) -> tuple[AIMessage, dict[str, Any]]:
        """Forced ``search`` call; same metrics."""
        ...


@dataclass
class Team:
    backend: Backend
    rounds: int = 3
    max_tokens: int = 48
    turns: list[Turn] = field(default_factory=list)
    histories: dict[str, list[BaseMessage]] = field(default_factory=dict)
    printer: Callable[[str], None] = print

    def __post_init__(self) -> None:
        for agent, role in ROLES.items():
            self.histories[agent] = [SystemMessage(f"{TEAM_BRIEF}\n\n{role}")]

    def _record(self, rnd: int, agent: str, step: str, t0: float, metrics: dict[str, Any]) -> None:
        turn = Turn(rnd, agent, step, metrics["ttft_ms"], 1e3 * (time.perf_counter() - t0), metrics["prompt_tokens"], metrics["cache_read"], metrics["kv"])
        self.turns.append(turn)
        self.printer(
            f"{turn.round:>5} {turn.agent:<10} {turn.step:<8} {turn.ttft_ms:9.0f} {turn.total_ms:9.0f} "
            f"{turn.cache_read:>6}/{turn.prompt_tokens:<6} {turn.kv}"
        )

    def _say(self, rnd: int, agent: str, step: str, text: str) -> str:
        h = self.histories[agent]
        h.append(HumanMessage(text))
        t0 = time.perf_counter()
        ai, metrics = self.backend.reply(agent, h, step=step, max_tokens=self.max_tokens)
        h.append(AIMessage(ai.text))
        self._record(rnd, agent, step, t0, metrics)
        return ai.text.strip()

    def run(self) -> None:
        self.printer(f"{'round':>5} {'agent':<10} {'step':<8} {'ttft ms':>9} {'total ms':>9} {'cached/prompt':<13} kv")
        for rnd, topic in enumerate(TOPICS[: self.rounds], start=1):
            plan = self._say(rnd, "planner", "plan", f"Round {rnd}. Topic: {topic}. Plan the research.")

            h = self.histories["researcher"]
            h.append(HumanMessage(f"Round {rnd}. Topic: {topic}. The planner asks:\n{plan}"))
            t0 = time.perf_counter()
            call, metrics = self.backend.call_tool("researcher", h, max_tokens=self.max_tokens)
            self._record(rnd, "researcher", "tool", t0, metrics)
            tc = call.tool_calls[0] if call.tool_calls else {"name": "search", "args": {"query": topic}, "id": "fallback"}
            result = search.invoke({"query": f"{topic} {tc['args'].get('query', '')}"})
            h += [
                AIMessage("", tool_calls=[{"name": "search", "args": tc["args"], "id": tc["id"]}]),
                ToolMessage(result, tool_call_id=tc["id"], name="search"),
            ]
            t0 = time.perf_counter()
            notes, metrics = self.backend.reply("researcher", h, step="notes", max_tokens=self.max_tokens)
            h.append(AIMessage(notes.text))
            self._record(rnd, "researcher", "notes", t0, metrics)

            self._say(rnd, "writer", "write", f"Round {rnd}. Topic: {topic}. Research notes:\n{result}\n{notes.text.strip()}")

    def summary(self) -> dict[str, Any]:
        # TTFT over streamed text turns only: a forced tool call is not streamed by ChatLlamaCpp.
        text = [t for t in self.turns if t.step != "tool"]
        later = [t for t in text if t.round > 1]
        return {
            "backend": self.backend.name,
            "turns": len(self.turns),
            "total_s": round(sum(t.total_ms for t in self.turns) / 1e3, 2),
            "tool_turns_total_s": round(sum(t.total_ms for t in self.turns if t.step == "tool") / 1e3, 2),
            "mean_ttft_ms": round(sum(t.ttft_ms for t in text) / len(text), 1),
            "mean_ttft_ms_after_round_1": round(sum(t.ttft_ms for t in later) / max(1, len(later)), 1),
            "prompt_tokens": sum(t.prompt_tokens for t in self.turns),
            "cache_read": sum(t.cache_read for t in self.turns),
        }


class AgentMemBackend:
    """Every agent is a ``ChatAgentMem`` on one shared ``MemoryPool``."""

    name = "agentmem ChatAgentMem"

    def __init__(self, *, model: str | None, threads: int, resident: int) -> None:
        from agentmem import MemoryPool
        from agentmem_langchain import ChatAgentMem

        self.pool = MemoryPool(model, n_ctx=8192, resident_agents=resident, n_threads=threads)
        self.models = {agent: ChatAgentMem(pool=self.pool, agent_id=agent) for agent in ROLES}

    def _metrics(self, msg: Any, ttft_ms: float | None = None) -> dict[str, Any]:
        usage = msg.usage_metadata
        meta = msg.response_metadata
        return {
            "ttft_ms": ttft_ms if ttft_ms is not None else 1e3 * meta["timings"]["ttft_s"],
            "prompt_tokens": usage["input_tokens"],
            "cache_read": usage["input_token_details"]["cache_read"],
            "kv": meta["kv"],
        }

    def reply(self, agent: str, messages: list[BaseMessage], *, step: str, max_tokens: int) -> tuple[AIMessage, dict[str, Any]]:
        model: Any = self.models[agent]
        if agent == "researcher":  # the tools stay described (same prompt prefix) but are not called
            model = model.bind_tools([search], tool_choice="none")
        t0 = time.perf_counter()
        ttft = None
        full = None
        for chunk in model.stream(messages, max_tokens=max_tokens):
            if ttft is None and chunk.content:
                ttft = 1e3 * (time.perf_counter() - t0)
            full = chunk if full is None else full + chunk
        assert full is not None
        return AIMessage(full.text), self._metrics(full, ttft)

    def call_tool(self, agent: str, messages: list[BaseMessage], *, max_tokens: int) -> tuple[AIMessage, dict[str, Any]]:
        msg = self.models[agent].bind_tools([search], tool_choice="search").invoke(messages, max_tokens=max_tokens)
        return msg, self._metrics(msg)

    def close(self) -> None:
        self.pool.close()


def main(argv: list[str] | None = None, backend_factory: Callable[[argparse.Namespace], Any] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF path (default: the bundled Gemma 3 270M)")
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, len(TOPICS) + 1))
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--threads", type=int, default=0, help="llama.cpp threads (0 = AGENTMEM_THREADS or cores less the load)"
    )
    parser.add_argument("--resident", type=int, default=2, help="agents with a live sequence (others are parked in RAM)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    # resolved here, so agentmem and the ChatLlamaCpp baseline run with the same count
    from agentmem.engine.threads import default_threads

    args.threads = args.threads or default_threads()
    if backend_factory is None:
        from agentmem import resolve_model_path

        args.model = str(resolve_model_path(args.model))
        backend = AgentMemBackend(model=args.model, threads=args.threads, resident=args.resident)
    else:
        backend = backend_factory(args)
    try:
        team = Team(backend, rounds=args.rounds, max_tokens=args.max_tokens)
        print(f"# {backend.name} — {args.rounds} rounds, max_tokens={args.max_tokens}, threads={args.threads}")
        team.run()
        summary = team.summary()
        print(json.dumps(summary) if args.json else "\n".join(f"{k}: {v}" for k, v in summary.items()))
        if isinstance(backend, AgentMemBackend):
            totals = backend.pool.stats()["totals"]
            print(f"pool: restores={totals['restores']} parks={totals['parks']} prefill_tokens={totals['prefill_tokens']} cached_tokens={totals['cached_tokens']}")
        return summary
    finally:
        backend.close()


if __name__ == "__main__":
    main()
