"""The workloads of `vs_llama_server.py`: both servers up at once, driven request by request in turn.

The machine is shared, so the two servers are never measured one after the other: a
`Pair` holds both running, and every step calls one agent on one server, then the same
agent on the other (which goes first alternates, ABBA), with `settle_s` of quiet after
each call so background work of one server (agentmem's prefetch, llama-server's cache
update) does not land in the other's call. Each server keeps its own chat histories (its
replies differ), built from the same seeded messages. The load averages are recorded at
the start and end of every phase.

A *switch* is a call of an agent after other agents ran; a *re-prefill* is a call that
decoded more than `reprefill_tokens` prompt tokens (the rest was cached).
"""

from __future__ import annotations

import logging
import math
import random
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from benchmarks._report import load
from benchmarks._serving import CallResult, ServerProc, pct, stream_chat

__all__ = ["Pair", "Server", "histories", "run_brief", "run_budget", "run_restart", "run_switch"]

logger = logging.getLogger(__name__)

WORDS = ("river stone lantern market orchard signal harbor ledger garden copper thunder meadow compass violin "
         "bakery glacier pencil canyon tunnel beacon window silver forest engine planet basket mirror rocket "
         "island candle button ladder marble feather pocket saddle timber velvet wagon anchor").split()
History = dict[str, list[dict[str, str]]]


class Server:
    """One server under test: its process, how to name an agent in a request, what it reports about memory."""

    def __init__(self, name: str, proc: ServerProc, *, agent_header: bool, extra_body: dict[str, Any]) -> None:
        self.name, self.proc = name, proc
        self.agent_header, self.extra_body = agent_header, extra_body

    def call(self, client: httpx.Client, agent: str, messages: list[dict[str, str]], max_tokens: int) -> CallResult:
        body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **self.extra_body}
        headers = {"X-Agent-Id": agent} if self.agent_header else {}
        return stream_chat(client, f"{self.proc.base_url}/v1/chat/completions", body, headers)

    def memory(self, client: httpx.Client) -> dict[str, Any]:
        """RSS now, and the KV the server says it keeps: agentmem's tier gauges, llama-server's prompt-cache log line."""
        out: dict[str, Any] = {"rss_mib": round(self.proc.rss_now() / 2**20, 1)}
        if self.agent_header:
            text = client.get(f"{self.proc.base_url}/metrics", timeout=60).text
            for m in re.finditer(r'^agentmem_tier_(agents|bytes)\{tier="(\w+)"\} (\S+)$', text, re.M):
                out[f"{m[2]}_{m[1]}"] = float(m[3]) if m[1] == "bytes" else int(float(m[3]))
            for key in ("agentmem_shared_ram_bytes", "agentmem_shared_prefix_tokens_total"):
                m = re.search(rf"^{key} (\S+)$", text, re.M)
                if m:
                    out[key.removeprefix("agentmem_")] = float(m[1])
            for m in re.finditer(r'^agentmem_restores_total\{tier="(\w+)"\} (\S+)$', text, re.M):
                out[f"restores_{m[1]}"] = int(float(m[2]))
        else:
            states = re.findall(r"cache state: (\d+) prompts, ([\d.]+) MiB", self.proc.log.read_text(errors="replace"))
            if states:
                out["cache_prompts"], out["cache_mib"] = int(states[-1][0]), float(states[-1][1])
        return out


@dataclass
class Pair:
    """Two servers running at once, called in turn (see the module docstring)."""

    servers: list[Server]
    client: httpx.Client
    max_tokens: int
    deadline: float
    settle_s: float = 0.25
    steps: int = 0
    phases: list[dict[str, Any]] = field(default_factory=list)
    on_phase: Callable[[dict[str, Any]], None] | None = None  # called after every phase (partial results)

    def turn(self, hist: dict[str, History], agent: str, question: str) -> dict[str, CallResult] | None:
        """Call `agent` on both servers with its history plus `question`; None once past the deadline."""
        if time.monotonic() > self.deadline:
            return None
        order = self.servers if self.steps % 4 in (0, 3) else self.servers[::-1]
        self.steps += 1
        out = {}
        for srv in order:
            msgs = hist[srv.name][agent] + [{"role": "user", "content": question}]
            res = srv.call(self.client, agent, msgs, self.max_tokens)
            if res.status == 200 and not res.error:
                hist[srv.name][agent] = msgs + [{"role": "assistant", "content": res.text}]
            out[srv.name] = res
            time.sleep(self.settle_s)
        return out

    def phase(self, name: str, hist: dict[str, History], agents: list[str], question: str,
              reprefill_tokens: int, summary: Callable[[list[CallResult]], dict[str, Any]] | None = None,
              ) -> dict[str, Any]:
        """One call of every agent on both servers; per-server stats, load and wall time of the phase."""
        load0, t0 = load(), time.monotonic()
        results: dict[str, list[CallResult]] = {s.name: [] for s in self.servers}
        for i, agent in enumerate(agents):
            got = self.turn(hist, agent, question.format(agent=agent))
            if got is None:
                logger.warning("%s: time limit reached after %d of %d agents", name, i, len(agents))
                break
            for k, r in got.items():
                results[k].append(r)
            if (i + 1) % 8 == 0 or i + 1 == len(agents):
                logger.info("%s: %d/%d agents; last TTFT %s; load %s", name, i + 1, len(agents),
                            ", ".join(f"{k} {r.ttft_s:.3f} s" for k, r in got.items()), load())
        out = {"phase": name, "load_start": load0, "load_end": load(), "wall_s": round(time.monotonic() - t0, 1),
               **{k: (summary(rs) if summary else stats(rs, reprefill_tokens)) for k, rs in results.items()}}
        self.phases.append(out)
        if self.on_phase is not None:
            self.on_phase(out)
        return out


def histories(n: int, tokens: int, seed: int, *, names: list[str]) -> dict[str, History]:
    """`n` agents, each a system message of ~`tokens` tokens of seeded words (about 1.05 tokens a word), per server."""
    rng = random.Random(seed)
    base = {}
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(int(tokens / 1.05)))
        base[f"bench/agent-{i:03d}"] = [{"role": "system", "content": f"You are agent {i}. Your notes: {words}"}]
    return {name: {a: list(h) for a, h in base.items()} for name in names}


def stats(rs: list[CallResult], reprefill: int) -> dict[str, Any]:
    """Calls, errors, TTFT p50/p99, mean prompt and decoded tokens, re-prefills."""
    ok = [r for r in rs if r.status == 200 and not r.error]
    prefilled = [r.prompt_tokens - r.cached_tokens for r in ok]
    ttft = [r.ttft_s for r in ok]
    return {"calls": len(rs), "errors": len(rs) - len(ok),
            "ttft_p50_s": round(pct(ttft, 50), 4), "ttft_p99_s": round(pct(ttft, 99), 4),
            "ttft_first_s": round(ttft[0], 4) if ttft else math.nan,
            "ttft_rest_p50_s": round(pct(ttft[1:], 50), 4),
            "prompt_tokens_mean": round(sum(r.prompt_tokens for r in ok) / max(1, len(ok))),
            "prefilled_mean": round(sum(prefilled) / max(1, len(ok)), 1),
            "reprefills": sum(1 for p in prefilled if p > reprefill),
            "sample_error": next((r.error for r in rs if r.error), "")}


def run_switch(pair: Pair, *, agents: int, tokens: int, rounds: int, reprefill: int) -> list[dict[str, Any]]:
    """A few agents round-robin: first calls, then `rounds` rounds of switches."""
    hist = histories(agents, tokens, seed=1, names=[s.name for s in pair.servers])
    ids = list(hist[pair.servers[0].name])
    out = [pair.phase("switch, first calls", hist, ids, "Question 0: which word comes first in your notes?", reprefill)]
    for r in range(1, rounds + 1):
        out.append(pair.phase(f"switch, round {r}", hist, ids, f"Question {r}: which word comes first in your notes?",
                              reprefill))
    return out


def run_budget(pair: Pair, *, agents: int, tokens: int, rounds: int, reprefill: int) -> tuple[dict[str, History], list[dict[str, Any]]]:
    """Many agents on a fixed RAM budget: first calls, then `rounds` round-robin rounds of switches."""
    hist = histories(agents, tokens, seed=2, names=[s.name for s in pair.servers])
    ids = list(hist[pair.servers[0].name])
    out = [pair.phase("budget, first calls", hist, ids, "Question 0: which word comes first in your notes?", reprefill)]
    for r in range(1, rounds + 1):
        out.append(pair.phase(f"budget switches, round {r}", hist, ids,
                              f"Question {r}: which word comes first in your notes?", reprefill))
        out[-1]["memory"] = {s.name: s.memory(pair.client) for s in pair.servers}
    return hist, out


def run_restart(pair: Pair, hist: dict[str, History], *, reprefill: int) -> dict[str, Any]:
    """SIGTERM both servers, start them again (agentmem on the same archive), call every agent once."""
    times: dict[str, Any] = {}
    for srv in pair.servers:
        t0 = time.monotonic()
        times[f"{srv.name}_exit_status"] = srv.proc.stop(signal.SIGTERM)
        times[f"{srv.name}_stop_s"] = round(time.monotonic() - t0, 2)
    for srv in pair.servers:
        times[f"{srv.name}_start_s"] = round(srv.proc.start(), 2)
    logger.info("restarted: %s", times)
    ids = list(hist[pair.servers[0].name])
    out = pair.phase("after restart", hist, ids, "Question 99: which word comes first in your notes?", reprefill)
    out.update(times)
    out["memory"] = {s.name: s.memory(pair.client) for s in pair.servers}
    return out


def run_brief(pair: Pair, *, agents: int, tokens: int, reprefill: int) -> dict[str, Any]:
    """`agents` fresh agents whose prompts start with the same ~`tokens`-token brief: first calls and memory.

    Each agent's messages are the brief (system message; Gemma's template puts it at the
    start of the first user turn) and its own question after it, as a client that shares
    nothing explicitly sends them: agentmem finds the common prefix in another agent's KV
    (automatic prefix sharing, `min_share_tokens`), llama-server in a slot's cached prompt.
    """
    rng = random.Random(3)
    brief = "Shared brief for the whole team. " + " ".join(rng.choice(WORDS) for _ in range(int(tokens / 1.05)))
    names = [s.name for s in pair.servers]
    ids = [f"brief/agent-{i:02d}" for i in range(agents)]
    hist = {n: {a: [{"role": "system", "content": brief}] for a in ids} for n in names}
    before = {s.name: s.memory(pair.client) for s in pair.servers}
    out = pair.phase("shared brief, first calls", hist, ids,
                     "You are {agent}. Which word comes first in the brief?", reprefill)
    out["memory_before"] = before
    out["memory"] = {s.name: s.memory(pair.client) for s in pair.servers}
    return out
