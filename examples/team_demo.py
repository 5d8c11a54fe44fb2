"""A team of agents discussing a task on one local model, each switch served from kept KV.

Four agents (planner, researcher, coder, reviewer) take turns on a small software
task for two rounds (`--rounds`). Each has its own system prompt and its own growing
conversation; only two live llama.cpp sequences exist, so most switches park one
agent's KV in RAM and restore another's.

Each turn prints the agent's reply and how its KV was found (reused: still live;
restored: parked -> live; prefilled: computed from scratch). At the end one real
re-prefill of the longest history measures this machine's prefill rate, and the
table shows per turn the restore time, the tokens reused and decoded, and the
seconds the switch saved: the re-prefill of the reused history, which a single
shared context (llama-cpp-python's `Llama`, LangChain's `ChatLlamaCpp`, AutoGen's
llama.cpp client) pays on every switch, at that measured rate. TTFT is shown too;
it is mostly the decode of the new turn, which every setup pays.

    python examples/team_demo.py [--model qwen2.5-coder-0.5b-instruct] [--rounds 2] [--max-tokens 32] [--threads N]
    python examples/team_demo.py --n-gpu-layers -1    # every layer on the GPU (a CUDA/Metal build; docs/gpu.md)
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
import time
from dataclasses import dataclass

from agentmem import MemoryPool

TASK = ("Build a command-line tool `wordfreq` that reads a text file and prints its ten most common "
        "words with their counts.")
BRIEF = "Reply in one short sentence, no code."

# role: (system prompt, first-round question, question in later rounds)
AGENTS = {
    "planner": (
        "You are the planner of a small software team building a Python tool. You decide the next concrete steps.",
        "Name the first two implementation steps.",
        "Update the plan with what the team said.",
    ),
    "researcher": (
        "You are the researcher of a small software team building a Python tool. "
        "You know the standard library and the edge cases.",
        "Which standard-library module should we use, and which edge case must we handle?",
        "Answer the reviewer's risk.",
    ),
    "coder": (
        "You are the coder of a small software team building a Python tool. You decide the functions and their signatures.",
        "Name the functions you will write, with their signatures.",
        "Say how your functions handle the points the team raised.",
    ),
    "reviewer": (
        "You are the reviewer of a small software team building a Python tool. You look for risks.",
        "Name one risk in this plan and a test that would catch it.",
        "Is the plan ready? Name what is still missing.",
    ),
}


def turn_prompt(rnd: int, agent: str, transcript: list[tuple[str, str]]) -> str:
    """The user turn an agent gets: what the others said since its last turn, then its question."""
    _, first, later = AGENTS[agent]
    news = "\n".join(f"- {who} said: {text}" for who, text in transcript[-(len(AGENTS) - 1):])
    return (f"Since your last turn:\n{news}\n" if news else "") + (first if rnd == 1 else later)


@dataclass
class Turn:
    """One call of the discussion, as the table shows it."""

    rnd: int
    agent: str
    kv: str
    restore_s: float
    reused: int
    decoded: int
    ttft_s: float


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct",
                    help="a bundled model name (qwen2.5-coder-0.5b-instruct, gemma-3-270m) or a GGUF path")
    ap.add_argument("--rounds", type=int, default=2, help="turns of every agent (3+ for a longer discussion)")
    ap.add_argument("--resident", type=int, default=2, help="live sequences (fewer than agents -> park/restore)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per reply at most (bounds the run time)")
    ap.add_argument("--park-codec", default="f16", help="f16, q8_0, q4_0 or q8_0/q4_0")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0 = AGENTMEM_THREADS or cores less the load)")
    ap.add_argument("--n-gpu-layers", type=int, default=None, metavar="N",
                    help="layers offloaded on a CUDA/Metal build (-1 = all, 0 = CPU; default AGENTMEM_N_GPU_LAYERS, else 0)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    t_start = time.perf_counter()
    with MemoryPool(args.model, n_ctx=8192, resident_agents=args.resident, park_codec=args.park_codec,
                    n_threads=args.threads, n_gpu_layers=args.n_gpu_layers) as pool:
        print(f"loaded {pool.model_path.name} in {time.perf_counter() - t_start:.1f}s — {len(AGENTS)} agents, "
              f"{args.resident} live sequences, parked states as {args.park_codec}\n")
        histories = {a: [{"role": "system", "content": f"{system} The team's task: {TASK} {BRIEF}"}]
                     for a, (system, _, _) in AGENTS.items()}
        transcript: list[tuple[str, str]] = []
        turns: list[Turn] = []
        for rnd in range(1, args.rounds + 1):
            for agent in AGENTS:
                histories[agent].append({"role": "user", "content": turn_prompt(rnd, agent, transcript)})
                r = pool.chat(agent, histories[agent], max_tokens=args.max_tokens, temperature=0.0)
                histories[agent].append({"role": "assistant", "content": r.text})
                reply = " ".join(r.text.split()) or "(no reply)"
                transcript.append((agent, reply))
                turns.append(Turn(rnd, agent, r.kv, r.timings.restore_s, r.usage.cached_tokens,
                                  r.usage.prompt_tokens - r.usage.cached_tokens, r.timings.ttft_s))
                print(textwrap.fill(f"[{rnd}] {agent} ({r.kv}): {reply}", 100, subsequent_indent="    "))
                sys.stdout.flush()

        # One real re-prefill of the longest history gives this machine's prefill rate: the price a
        # shared context (llama-cpp-python's Llama, ChatLlamaCpp, AutoGen's llama.cpp client) pays
        # for an agent's history on every switch.
        longest = max(AGENTS, key=lambda a: len(pool.tokens(a)))
        pool.forget(longest)
        r = pool.chat(longest, histories[longest], max_tokens=1)
        prefilled = r.usage.prompt_tokens - r.usage.cached_tokens  # the whole history: nothing is kept or shared
        rate = prefilled / r.timings.prefill_s
        print(f"\nre-prefilling {longest}'s whole history ({prefilled} tokens) from scratch took "
              f"{r.timings.prefill_s:.2f} s: {rate:.0f} tokens/s on this machine\n")

        header = f"{'round':>5}  {'agent':<10} {'kv':<9} {'restore':>8} {'reused':>6} {'decoded':>7} {'saved':>7} {'TTFT':>7}"
        print(header)
        print("-" * len(header))
        for t in turns:
            print(f"{t.rnd:>5}  {t.agent:<10} {t.kv:<9} {1e3 * t.restore_s:>6.1f}ms {t.reused:>6} {t.decoded:>7} "
                  f"{t.reused / rate:>6.2f}s {t.ttft_s:>6.2f}s")
        restores = [t.restore_s for t in turns if t.kv == "restored"]
        reused = sum(t.reused for t in turns)
        print(f"\n{len(restores)} restores took {1e3 * sum(restores):.0f} ms in all; {reused} history tokens were "
              f"reused instead of re-prefilled: {reused / rate:.1f} s saved at {rate:.0f} tokens/s")
        print("where each agent's KV lives now:")
        for aid, a in pool.stats()["agents"].items():
            print(f"  {aid:<10} {a['tier']:<5} {a['tokens']:>5} tokens  {a['bytes'] / 1e6:6.1f} MB  codec={a['codec']}")
    print(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
