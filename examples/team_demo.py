"""A team of agents taking turns on one local model, each switch served from kept KV.

Four agents (planner, researcher, coder, reviewer) discuss a small task for a few
rounds. Each has its own system prompt and its own growing conversation; only
two live llama.cpp sequences exist, so most switches park one agent's KV in RAM
and restore another's. Every turn prints the agent, TTFT, and whether its KV was
reused (live), restored (parked → live) or prefilled (computed from scratch).

At the end, the same history is re-prefilled from scratch once, to show what a
switch costs without agentmem.

    python examples/team_demo.py [--rounds 3] [--resident 2] [--max-tokens 40] [--threads 1]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from agentmem import MemoryPool

TASK = "Build a command-line tool that counts the words in a text file and prints the ten most common ones."

AGENTS = {
    "planner": "You are the planner of a small software team. You break the task into short, concrete steps.",
    "researcher": "You are the researcher of a small software team. You point out libraries, pitfalls and edge cases.",
    "coder": "You are the coder of a small software team. You describe the code you would write, briefly.",
    "reviewer": "You are the reviewer of a small software team. You check the work and name one risk.",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--resident", type=int, default=2, help="live sequences (fewer than agents → park/restore)")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--park-codec", default="f16", help="f16, q8_0, q4_0 or q8_0/q4_0")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0 = AGENTMEM_THREADS or cores less the load)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    t0 = time.perf_counter()
    pool = MemoryPool(n_ctx=8192, resident_agents=args.resident, park_codec=args.park_codec, n_threads=args.threads)
    print(f"loaded {pool.model_path.name} in {time.perf_counter() - t0:.1f}s — "
          f"{len(AGENTS)} agents, {args.resident} live sequences, parked states as {args.park_codec}\n")

    histories = {a: [{"role": "system", "content": f"{p} The team's task: {TASK}"}] for a, p in AGENTS.items()}
    transcript: list[tuple[str, str]] = []
    header = f"{'round':>5}  {'agent':<10} {'kv':<9} {'TTFT':>8} {'restore':>8} {'prompt':>6} {'cached':>6}  reply"
    print(header)
    print("-" * len(header))
    with pool:
        for rnd in range(1, args.rounds + 1):
            for agent in AGENTS:
                # each agent sees what the others said since its last turn
                news = "\n".join(f"{who}: {text}" for who, text in transcript[-(len(AGENTS) - 1):]) or "(nothing yet)"
                histories[agent].append({"role": "user", "content": f"Round {rnd}. The team said:\n{news}\nYour turn, in one or two sentences."})
                r = pool.chat(agent, histories[agent], max_tokens=args.max_tokens, temperature=0.0)
                reply = " ".join(r.text.split()) or "(no reply)"
                histories[agent].append({"role": "assistant", "content": r.text})
                transcript.append((agent, reply))
                print(
                    f"{rnd:>5}  {agent:<10} {r.kv:<9} {1e3 * r.timings.ttft_s:>6.0f}ms {1e3 * r.timings.restore_s:>6.1f}ms "
                    f"{r.usage.prompt_tokens:>6} {r.usage.cached_tokens:>6}  {reply[:60]}"
                )
                sys.stdout.flush()

        st = pool.stats()
        print("\nwhere each agent's KV lives now:")
        for aid, a in st["agents"].items():
            print(f"  {aid:<10} {a['tier']:<5} {a['tokens']:>5} tokens  {a['bytes'] / 1e6:6.1f} MB  codec={a['codec']}")
        t = st["totals"]
        print(f"totals: {t['calls']} calls, {t['restores']} restores, {t['parks']} parks, "
              f"{t['cached_tokens']} prompt tokens reused, {t['prefill_tokens']} decoded")

        # what a switch would cost without kept KV: re-prefill the longest history from scratch
        longest = max(histories, key=lambda a: len(pool.tokens(a)))
        pool.forget(longest)
        r = pool.chat(longest, histories[longest] + [{"role": "user", "content": "Done?"}], max_tokens=1)
        print(f"\nwithout kept KV, a switch to {longest} re-prefills {r.usage.prompt_tokens} tokens: "
              f"TTFT {1e3 * r.timings.ttft_s:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
