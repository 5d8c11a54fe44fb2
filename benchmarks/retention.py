"""Retention benchmark: which planted facts an agent still knows after eviction.

Synthetic agent traces (a system prompt with facts, user turns, assistant prose,
decisions written as tool calls, tool results carrying facts, filler) of about
1.5k and 4k tokens are fed to one `agentmem.MemoryPool` turn by turn, as
an agent framework would, with the agent's live-token budget at 25%, 50% and
75% of the trace and each eviction policy; the full cache (no budget) is the
baseline, in the same run, on the same model. Several models (`--model A B`)
are measured one after the other in one sitting, so their figures share the
machine's load.

Every fact is written once as a sentence, "Fact: the key of the vault is
'4821'.", and probed after the whole trace, greedy, 10 tokens; a hit is an
answer containing the value. Two probes (`--probe`): a *cloze* the default 270M
base model can do by copying (a model turn started with "Fact: the key of the
vault is '"), and a *question* for instruction-tuned models (a user turn "What
is the key of the vault? Reply with the value only."); `auto` asks a question
when the GGUF ships a chat template. Facts the model misses even with the full
cache are reported (absolute recall) and excluded from the relative figure
(recall over the facts the full cache recalls).

Also measured: the pool's eviction time against the time of the turn that
triggered it (each turn here is the prefill of the new messages only, no
generation — a conservative denominator), and the policy's ``select`` alone on
1.5k/4k/8k-token views.

Usage:

```
python benchmarks/retention.py                 # both sizes, all budgets (17-45 min on 2 cores)
python benchmarks/retention.py --quick         # 1.5k trace, 50% budget only
python benchmarks/retention.py --model PATH --sizes 1500 4000 --budgets 0.25 0.5 0.75
python benchmarks/retention.py --model GEMMA.gguf QWEN.gguf --budgets 0.5 0.45   # two models, one sitting
python benchmarks/retention.py --simulate 10   # kept facts only, 10 traces per size, no decoding
```

Writes `bench-results/retention.json` (`{"models": [report, ...], "load_before", "load_after"}`)
and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agentmem import MemoryPool  # noqa: E402 - first: llama.cpp's libraries before numpy (engine/native_first.py)
from agentmem.policy.eviction import POLICIES, get_policy  # noqa: E402
from agentmem.policy.view import REGION_CODE, LedgerView  # noqa: E402
from benchmarks._report import add_gpu_layers  # noqa: E402

import numpy as np  # noqa: E402

KINDS = ("system", "tool_result", "decision", "user")
POLICY_ORDER = ("region_decay", "sliding_window", "streaming_llm")

# ----------------------------------------------------------------------------- facts and filler

#: opaque attributes: a value the model could guess from the attribute ("color" -> "red") would blur recall
_ATTRIBUTES = ("code", "key", "tag", "label", "pin", "id", "token", "ref")
#: one entity per fact, so no two facts share a subject's distinctive words
_ENTITIES = (
    "vault", "staging server", "north warehouse", "payment service", "audit", "cargo ship",
    "archive room", "mobile app", "blue team", "backup drive", "chemistry lab", "data pipeline",
    "front gate", "night shift", "test cluster", "print queue", "radio tower", "greenhouse",
    "billing portal", "loading dock", "city library", "ferry route", "museum wing", "orchestra",
    "rooftop garden", "tennis club", "bakery", "observatory", "lighthouse", "submarine",
    "circus tent", "ski lodge", "train depot", "hospital ward", "recording studio", "chess club",
    "fire station", "parking garage", "water tower", "bike shop", "dance school", "fish market",
    "art gallery", "boat house", "candle factory", "zoo", "planetarium", "vineyard",
)
#: values: concrete nouns with no colours among them (the model's favourite guesses)
_WORDS = (
    "tangerine", "obsidian", "marigold", "juniper", "walnut", "lantern", "falcon", "meadow", "quartz",
    "harbor", "cedar", "pepper", "glacier", "thistle", "sparrow", "canyon", "willow", "bramble", "pebble",
    "summit", "maple", "lagoon", "thunder", "nutmeg", "pelican", "anchor", "biscuit", "compass", "dolphin",
    "furnace", "gazebo", "hammock", "igloo", "jigsaw", "kettle", "mango", "noodle", "oyster", "pretzel",
    "raccoon", "saddle", "tulip", "umbrella", "volcano", "wagon", "yogurt", "zeppelin",
)
_PROSE = (
    "Let me think about the best way to approach this.",
    "That makes sense, and I will keep it in mind as we continue.",
    "I have reviewed the previous steps and everything looks consistent so far.",
    "There are a few options here, each with its own trade-offs.",
    "I will proceed carefully and report back with what I find.",
    "Thanks for the update; this helps narrow things down.",
    "It is worth double-checking the assumptions before we move on.",
    "Overall the plan is on track and no blockers are visible right now.",
    "I can summarize the situation once the remaining checks are done.",
    "This part of the task is routine, so it should not take long.",
    "Good question; the short answer is that it depends on the context.",
    "I will note this down and continue with the next item on the list.",
)
_CHAT = (
    "Okay, please continue with the next step.",
    "Sounds good to me, go ahead.",
    "Can you check the status of the remaining items?",
    "Let's keep going, we are making progress.",
    "What do you suggest we do next?",
    "Please look into it and tell me what you find.",
)
_TOOLS = ("search_logs", "query_inventory", "fetch_ticket", "read_config", "check_status")


@dataclass(frozen=True)
class Fact:
    """One planted fact, written once in message ``message`` as :attr:`sentence`.

    The form was chosen on the full cache of the default model (4k-token
    trace, 40 facts): "Fact: the key of the vault is 'tulip'." is recalled
    about twice as often as "The color of the vault is tulip." — the marker
    and the quotes give the copy a sharper cue, and opaque attributes keep the
    model from guessing. Single quotes survive JSON (decisions are tool-call
    arguments) unescaped.
    """

    kind: str
    subject: str  # "the key of the vault"
    value: str
    message: int

    @property
    def sentence(self) -> str:
        return f"Fact: {self.subject} is '{self.value}'."

    @property
    def cloze(self) -> str:
        return f"Fact: {self.subject} is '"

    @property
    def question(self) -> str:
        return f"What is {self.subject}? Reply with the value only."


@dataclass
class Trace:
    """A conversation and the facts planted in it."""

    messages: list[dict[str, Any]]
    facts: list[Fact]
    n_tokens: int = 0
    region_tokens: dict[str, int] = field(default_factory=dict)


class _FactSource:
    """Distinct subjects and values from a seeded RNG."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        ents = list(_ENTITIES)
        rng.shuffle(ents)
        self.pairs = [(_ATTRIBUTES[i % len(_ATTRIBUTES)], e) for i, e in enumerate(ents)]
        words = list(_WORDS)
        rng.shuffle(words)
        self.words = words
        self.numbers: set[str] = set()

    def next(self, kind: str, message: int) -> Fact:
        attr, ent = self.pairs.pop()
        if self.rng.random() < 0.5 and self.words:
            value = self.words.pop()
        else:
            value = str(self.rng.randint(1000, 9999))
            while value in self.numbers:
                value = str(self.rng.randint(1000, 9999))
            self.numbers.add(value)
        return Fact(kind, f"the {attr} of the {ent}", value, message)


def _prose(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_PROSE) for _ in range(n))


def _log_lines(rng: random.Random, n: int) -> list[str]:
    levels = ("INFO", "DEBUG", "WARN")
    words = ("request handled", "cache refreshed", "job queued", "heartbeat ok", "retry scheduled", "batch flushed")
    return [f"[{rng.choice(levels)}] {rng.choice(words)} in {rng.randint(2, 900)} ms" for _ in range(n)]


def default_fact_counts(target_tokens: int) -> dict[str, int]:
    """Facts per kind for a trace length: 8/6/4/4 at 1.5k tokens, 12/12/8/8 at 4k."""
    s = max(1, round(target_tokens / 1000))
    return {"system": 4 + 2 * s, "tool_result": 3 * s, "decision": 2 * s, "user": 2 * s}


def build_trace(target_tokens: int, count_tokens: Any, *, seed: int = 0, facts_per_kind: dict[str, int] | None = None) -> Trace:
    """A synthetic agent trace of about ``target_tokens`` rendered tokens.

    An episode is: a user turn (chat; sometimes "By the way, note this. <fact>"),
    an assistant turn (one to three sentences of prose, a tool call, and sometimes
    a ``record_decision`` tool call whose argument is a fact), the tool's result
    (log lines; sometimes a fact line among them) and an assistant summary (two
    to four sentences of prose). Episodes are generated first, up to the target
    length less room for the facts; then each kind's facts go into episodes
    drawn evenly at random over the whole trace.

    Args:
        target_tokens: rendered length to aim at.
        count_tokens: ``pool.count_tokens`` (rendered length of a message list).
        seed: RNG seed; the same seed gives the same trace.
        facts_per_kind: facts per kind (default :func:`default_fact_counts`).
    """
    rng = random.Random(seed)
    src = _FactSource(rng)
    want = facts_per_kind or default_fact_counts(target_tokens)
    sys_facts = [src.next("system", 0) for _ in range(want["system"])]
    system = (
        "You are Atlas, an operations agent. Work step by step, use tools, and keep these facts in mind:\n"
        + "\n".join(f"- {f.sentence}" for f in sys_facts)
    )
    # 1. skeleton episodes: (user text, assistant prose, tool, query, log lines, summary)
    room = 16 * sum(v for k, v in want.items() if k != "system")
    episodes: list[dict[str, Any]] = []
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
    while count_tokens(msgs) < target_tokens - room or len(episodes) < 2:
        ep = {
            "user": rng.choice(_CHAT),
            "prose": _prose(rng, rng.randint(1, 3)),
            "tool": rng.choice(_TOOLS),
            "query": f"item {rng.randint(10, 99)}",
            "lines": _log_lines(rng, rng.randint(2, 4)),
            "summary": _prose(rng, rng.randint(2, 4)),
        }
        episodes.append(ep)
        msgs += _episode_messages(ep, len(episodes))
    # 2. facts into episodes spread over the trace
    n = len(episodes)
    for kind in ("tool_result", "decision", "user"):
        k = min(want[kind], n)
        for i in sorted(rng.sample(range(n), k)):
            episodes[i].setdefault("facts", {})[kind] = src.next(kind, -1)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    facts: list[Fact] = list(sys_facts)
    for i, ep in enumerate(episodes):
        for kind, f in ep.get("facts", {}).items():
            if kind == "tool_result":
                ep["lines"].insert(rng.randint(0, len(ep["lines"])), f.sentence)
        ep_msgs = _episode_messages(ep, i + 1)
        for kind, f in ep.get("facts", {}).items():
            offset = {"user": 0, "decision": 1, "tool_result": 2}[kind]
            facts.append(Fact(kind, f.subject, f.value, len(messages) + offset))
        messages += ep_msgs
    return Trace(messages, facts, n_tokens=count_tokens(messages))


def _episode_messages(ep: dict[str, Any], i: int) -> list[dict[str, Any]]:
    facts = ep.get("facts", {})
    user = ep["user"] + (f" By the way, note this. {facts['user'].sentence}" if "user" in facts else "")
    calls = []
    if "decision" in facts:
        calls.append({"id": f"d{i}", "name": "record_decision", "arguments": {"decision": facts["decision"].sentence}})
    calls.append({"id": f"c{i}", "name": ep["tool"], "arguments": {"query": ep["query"]}})
    return [
        {"role": "user", "content": user},
        {"role": "assistant", "content": ep["prose"], "tool_calls": calls},
        {"role": "tool", "tool_call_id": f"c{i}", "name": ep["tool"], "content": "\n".join(ep["lines"])},
        {"role": "assistant", "content": ep["summary"]},
    ]


# ----------------------------------------------------------------------------- running


def _turn_ends(messages: list[dict[str, Any]]) -> list[int]:
    """Prefix lengths at which an agent framework would call the model (after user/tool messages)."""
    return [k + 1 for k, m in enumerate(messages) if m["role"] in ("user", "tool")]


PROBES = ("cloze", "question")


def probe_messages(trace: Trace, fact: Fact, probe: str = "cloze") -> list[dict[str, Any]]:
    """The trace, then the probe of one fact.

    `cloze`: a model turn that starts the fact's sentence (the format continues it),
    which a base model can complete by copying. `question`: a user turn asking for
    the value, as an instruction-tuned model is used.
    """
    if probe == "question":
        return trace.messages + [{"role": "user", "content": fact.question}]
    return trace.messages + [{"role": "assistant", "content": fact.cloze}]


def pick_probe(pool: MemoryPool, probe: str) -> str:
    """`auto`: `question` for a model whose GGUF ships a chat template (instruction-tuned), else `cloze`."""
    if probe != "auto":
        return probe
    return "question" if pool.engine().model.chat_template() else "cloze"


def hit(text: str, value: str) -> bool:
    return value.lower() in text.lower()


def kept(fact: Fact, live_text: str) -> bool:
    """The fact's sentence is in the live text, as written or as a template's JSON wrote it.

    A decision is a tool-call argument, and a template's `tojson` (Qwen's) writes the
    quote as `\\u0027`: looking for the plain sentence only would count every such
    decision as evicted.
    """
    s = fact.sentence
    forms = {s, json.dumps(s)[1:-1], s.replace("'", "\\u0027")}
    return any(f in live_text for f in forms)


def run_config(
    pool: MemoryPool, agent: str, trace: Trace, *, budget: int, policy: str | None, probe: str = "cloze"
) -> dict[str, Any]:
    """Feed the trace turn by turn under ``budget`` (0 = full cache), then probe every fact.

    Per fact two things are recorded: ``kept`` — its whole sentence is still in
    the agent's live tokens after the trace (what the policy decided, whatever
    the model) — and ``hit`` — the model completed the cloze with the value.
    """
    if budget:
        pool.set_budget(agent, budget, eviction=policy)
    turns: list[dict[str, float]] = []
    cached = prefilled = 0
    for k in _turn_ends(trace.messages):
        r = pool.chat(agent, trace.messages[:k], max_tokens=0)
        turns.append({"total_s": r.timings.total_s, "evict_s": getattr(r.timings, "evict_s", 0.0)})
        cached += r.usage.cached_tokens
        prefilled += r.usage.prompt_tokens - r.usage.cached_tokens
    # the trace ends with an assistant message; decode it too (the format continues it, so the
    # probes, which close it, reuse all of it)
    r = pool.chat(agent, trace.messages, max_tokens=0)
    turns.append({"total_s": r.timings.total_s, "evict_s": getattr(r.timings, "evict_s", 0.0)})
    st = pool.stats()["agents"][agent]
    live_after_trace = int(st.get("live_tokens", st.get("tokens", 0)))
    live_text = pool.engine().model.detokenize(pool.tokens(agent))
    results = []
    reprefills = 0
    for f in trace.facts:
        r = pool.chat(agent, probe_messages(trace, f, probe), max_tokens=10, temperature=0.0, stop="\n")
        reprefills += r.usage.cached_tokens == 0
        results.append({"kind": f.kind, "subject": f.subject, "value": f.value, "text": r.text,
                        "hit": hit(r.text, f.value), "kept": kept(f, live_text)})
    st = pool.stats()["agents"][agent]
    out = {
        "budget": budget,
        "policy": policy or "full",
        "live_after_trace": live_after_trace,
        "evictions": int(st.get("evictions", 0)),
        "evicted_tokens": int(st.get("evicted_tokens", 0)),
        "evicted_regions": dict(st.get("evicted_regions", {})),
        "prefilled_tokens": prefilled,
        "cached_tokens": cached,
        "probe_reprefills": reprefills,
        "turns": turns,
        "facts": results,
    }
    pool.forget(agent)
    return out


def simulate_kept(pool: MemoryPool, trace: Trace, *, budget: int, policy: str) -> tuple[list[dict[str, Any]], int]:
    """Which facts a policy keeps, without decoding: the pool's eviction loop replayed on token arrays.

    Mirrors :meth:`MemoryPool.chat` turn by turn: prefix match against the
    history, prompt decoded in ``n_batch`` chunks, and before a chunk that would
    pass the budget an eviction down to ``min(eviction_low × budget,
    budget - chunk - 1)`` with the view the pool builds (`LedgerView.from_ledger`,
    the kept prefix re-tagged with each prompt's spans). Validated against the real pool: the same
    live counts and kept facts on the 1.5k trace. Seconds instead of minutes,
    so it can average over many seeds.

    Returns:
        per-fact ``{"kind", "subject", "kept"}`` and the live tokens at the end.
    """
    cfg = pool.config
    pol = get_policy(policy)
    tok: list[int] = []
    reg: list[int] = []
    msg: list[int] = []
    pin: list[bool] = []
    live: list[bool] = []
    for k in [*_turn_ends(trace.messages), len(trace.messages)]:
        n_messages = k
        rp = pool.renderer.render(trace.messages[:k])
        toks = np.asarray(rp.tokens)
        m = min(len(tok), len(toks))
        diff = np.flatnonzero(np.asarray(tok[:m]) != toks[:m])
        cp = min(int(diff[0]) if diff.size else m, len(toks) - 1)
        del tok[cp:], reg[cp:], msg[cp:], pin[cp:], live[cp:]
        regs = np.full(len(toks), REGION_CODE["text"], np.uint8)
        msgs = np.full(len(toks), -1)
        pins = np.zeros(len(toks), bool)
        for sp in rp.spans:
            regs[sp.start : sp.end] = REGION_CODE[sp.region]
            msgs[sp.start : sp.end] = sp.message
            pins[sp.start : sp.end] = sp.pinned
        reg[:cp], msg[:cp] = regs[:cp].tolist(), msgs[:cp].tolist()  # the kept prefix re-tagged, as the pool does
        start = cp
        while start < len(toks):
            end = min(start + cfg.n_batch, len(toks))
            if sum(live) + (end - start) + 1 > budget:
                target = max(0, min(int(budget * cfg.eviction_low), budget - (end - start) - 1))
                lv = np.asarray(live, bool)
                idx = np.flatnonzero(lv)
                view = LedgerView.from_ledger(
                    np.asarray(tok, np.int32), np.asarray(reg, np.uint8), np.asarray(pin, bool),
                    np.asarray(msg, np.int32), lv, n_messages=n_messages,
                )
                for s_, e_ in pol.select(view, target=target, block=cfg.eviction_block):
                    for h in idx[s_:e_]:
                        live[h] = False
            tok += toks[start:end].tolist()
            reg += regs[start:end].tolist()
            msg += msgs[start:end].tolist()
            pin += pins[start:end].tolist()
            live += [True] * (end - start)
            start = end
    lv = np.asarray(live, bool)
    text = pool.engine().model.detokenize(np.asarray(tok)[lv].tolist())
    return [{"kind": f.kind, "subject": f.subject, "kept": kept(f, text)} for f in trace.facts], int(lv.sum())


def simulate_report(pool: MemoryPool, sizes: list[int], budgets: list[float], policies: list[str], seeds: int) -> dict[str, Any]:
    """Kept facts per kind, summed over ``seeds`` traces per size (model-free)."""
    out: dict[str, Any] = {"seeds": seeds, "rows": []}
    for size in sizes:
        traces = [build_trace(size, pool.count_tokens, seed=1000 * s + size) for s in range(seeds)]
        for frac in budgets:
            for name in policies:
                facts: list[dict[str, Any]] = []
                for tr in traces:
                    facts += simulate_kept(pool, tr, budget=int(frac * tr.n_tokens), policy=name)[0]
                out["rows"].append({"size": size, "fraction": frac, "policy": name,
                                    "kept": {k: list(v) for k, v in recall_by_kind(facts, field="kept").items()}})
    return out


def render_simulation(sim: dict[str, Any]) -> str:
    lines = [f"\n#### Kept facts over {sim['seeds']} traces per size (model-free replay)\n",
             "| trace | budget | policy | system | tool_result | decision | user | all |", "|---|---|---|---|---|---|---|---|"]
    for r in sim["rows"]:
        cells = " | ".join(_pct(*r["kept"][k]) for k in (*KINDS, "all"))
        lines.append(f"| ~{r['size']} | {r['fraction']:.0%} | {r['policy']} | {cells} |")
    return "\n".join(lines)


def recall_by_kind(facts: list[dict[str, Any]], only: set[str] | None = None, *, field: str = "hit") -> dict[str, tuple[int, int]]:
    """kind -> (facts with ``field`` true, facts), plus "all"; ``only`` restricts to these subjects."""
    out: dict[str, tuple[int, int]] = {}
    for kind in (*KINDS, "all"):
        sel = [f for f in facts if (kind == "all" or f["kind"] == kind) and (only is None or f["subject"] in only)]
        out[kind] = (sum(bool(f[field]) for f in sel), len(sel))
    return out


def _pct(h: int, n: int) -> str:
    return f"{100 * h / n:.0f}%" if n else "–"


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def select_cost(sizes: tuple[int, ...] = (1536, 4096, 8192), repeats: int = 200) -> dict[str, dict[str, float]]:
    """Median/p99 milliseconds of ``policy.select`` on synthetic views, evicting to 50%."""
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    for n in sizes:
        turn = np.sort(rng.integers(0, n // 50, n)).astype(np.int32)
        view = LedgerView(
            tokens=rng.integers(0, 8000, n).astype(np.int32),
            regions=rng.integers(0, len(REGION_CODE), n).astype(np.uint8),
            pinned=np.zeros(n, bool),
            turn=turn,
            current_turn=int(turn[-1]),
            recent=rng.integers(0, 8000, 40).astype(np.int32),
        )
        for name in POLICY_ORDER:
            p = get_policy(name)
            p.select(view, target=n // 2)
            ts = []
            for _ in range(repeats):
                t = time.perf_counter()
                p.select(view, target=n // 2)
                ts.append(time.perf_counter() - t)
            out[f"{name}@{n}"] = {"median_ms": 1e3 * statistics.median(ts), "p99_ms": 1e3 * _p(ts, 99)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="+", default=[None], metavar="GGUF",
                    help="GGUF path(s), measured one after the other in this run (default: the bundled Gemma 3 270M)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1500, 4000], help="trace lengths in tokens")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.25, 0.5, 0.75], help="budgets as fractions of the trace")
    ap.add_argument("--policies", nargs="+", default=list(POLICY_ORDER), choices=sorted(POLICIES))
    ap.add_argument("--probe", default="auto", choices=["auto", *PROBES],
                    help="how a fact is asked for: cloze (base models), question (instruct models); "
                         "auto = question when the GGUF ships a chat template")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0 = AGENTMEM_THREADS or cores less the load)")
    add_gpu_layers(ap)
    ap.add_argument("--quick", action="store_true", help="1.5k trace at 50%% budget only")
    ap.add_argument("--simulate", type=int, default=0, metavar="SEEDS",
                    help="only the model-free replay of eviction over SEEDS traces per size (seconds)")
    ap.add_argument("--out", default="bench-results/retention.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.budgets = [1500], [0.5]

    t_start = time.perf_counter()
    out = Path(args.out)
    sitting: dict[str, Any] = {"load_before": _load(), "machine": f"{platform.machine()} {platform.system()}", "models": []}
    for model in args.model:
        report = measure_model(model, args, out, sitting) if not args.simulate else simulate_model(model, args, out)
        sitting["models"].append(report)
    if args.simulate:
        return 0
    sitting["load_after"] = _load()
    sitting["wall_s"] = time.perf_counter() - t_start
    _write(out, sitting)
    for report in sitting["models"]:
        print(f"\n### {Path(report['model']).name} (probe: {report['probe']})")
        print(render_tables(report))
    print(f"\nwrote {out} ({sitting['wall_s']:.0f} s; load {sitting['load_before']} -> {sitting['load_after']})")
    return 0


def _load() -> str:
    """The 1/5/15-minute load averages (what `uptime` shows)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _open_pool(model: str | None, args: argparse.Namespace) -> MemoryPool:
    n_ctx = max(args.sizes) + 1024
    return MemoryPool(model, n_ctx=n_ctx, resident_agents=1, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers)


def simulate_model(model: str | None, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """`--simulate`: the model-free replay for one model (its tokenizer and chat format only)."""
    pool = _open_pool(model, args)
    try:
        sim = simulate_report(pool, args.sizes, args.budgets, args.policies, args.simulate)
        sim["model"] = str(pool.model_path)
        sim["chat_format"] = pool.renderer.format.name
    finally:
        pool.close()
    name = out.stem + "-sim" + (f"-{Path(sim['model']).stem}" if len(args.model) > 1 else "")
    _write(out.with_name(name + ".json"), sim)
    print(f"\n### {Path(sim['model']).name} ({sim['chat_format']})")
    print(render_simulation(sim))
    return sim


def measure_model(model: str | None, args: argparse.Namespace, out: Path, sitting: dict[str, Any]) -> dict[str, Any]:
    """Every trace size x budget x policy on one model, the full cache first; partial results written as they come."""
    t_start = time.perf_counter()
    pool = _open_pool(model, args)
    probe = pick_probe(pool, args.probe)
    report: dict[str, Any] = {
        "model": str(getattr(pool, "model_path", model or "default")),
        "chat_format": pool.renderer.format.name,
        "probe": probe,
        "machine": sitting["machine"],
        "config": {k: v for k, v in pool.config.to_dict().items() if k.startswith(("eviction", "n_ctx", "type_"))},
        "traces": [],
    }
    print(f"{report['model']}: chat format {report['chat_format']}, probe {probe}", file=sys.stderr)
    for size in args.sizes:
        trace = build_trace(size, pool.count_tokens, seed=args.seed + size)
        regions: dict[str, int] = {}
        rp = pool.renderer.render(trace.messages)
        for s in rp.spans:
            regions[s.region] = regions.get(s.region, 0) + (s.end - s.start)
        trace.region_tokens = regions
        print(f"trace ~{size}: {trace.n_tokens} tokens, {len(trace.messages)} messages, {len(trace.facts)} facts, regions {regions}", file=sys.stderr)
        entry: dict[str, Any] = {"size": size, "n_tokens": trace.n_tokens, "messages": len(trace.messages),
                                 "region_tokens": regions, "facts": [asdict(f) for f in trace.facts], "runs": []}
        full = run_config(pool, f"full-{size}", trace, budget=0, policy=None, probe=probe)
        entry["runs"].append(full)
        known = {f["subject"] for f in full["facts"] if f["hit"]}
        print(f"  full cache: {len(known)}/{len(trace.facts)} facts recalled", file=sys.stderr)
        for frac in args.budgets:
            budget = int(frac * trace.n_tokens)
            for name in args.policies:
                t = time.perf_counter()
                run = run_config(pool, f"{name}-{size}-{frac}", trace, budget=budget, policy=name, probe=probe)
                run["fraction"] = frac
                entry["runs"].append(run)
                rk = recall_by_kind(run["facts"])
                kk = recall_by_kind(run["facts"], field="kept")
                print(f"  {name:>14} @ {frac:.0%}: kept {_pct(*kk['all'])}, recalled {_pct(*rk['all'])}, "
                      f"live {run['live_after_trace']}, {run['evictions']} evictions, "
                      f"{run['probe_reprefills']} probe re-prefills ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
                partial = {**report, "traces": [*report["traces"], entry]}
                _write(out, {**sitting, "models": [*sitting["models"], partial], "partial": True})
        report["traces"].append(entry)
    pool.close()
    report["select_cost"] = select_cost()
    report["wall_s"] = time.perf_counter() - t_start
    return report


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))


def render_tables(report: dict[str, Any]) -> str:
    """The Markdown tables of a report (also pasted into docs/eviction.md)."""
    lines = []
    for tr in report["traces"]:
        full = next(r for r in tr["runs"] if r["policy"] == "full")
        known = {f["subject"] for f in full["facts"] if f["hit"]}
        fk = recall_by_kind(full["facts"])
        lines.append(f"\n#### Trace of {tr['n_tokens']} tokens, {tr['messages']} messages, {len(tr['facts'])} facts\n")
        lines.append("**Kept**: share of facts whose sentence is still live after the trace (what the policy decided).\n")
        lines.append("| budget | policy | live | system | tool_result | decision | user | all |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for r in tr["runs"]:
            if r["policy"] == "full":
                continue
            rk = recall_by_kind(r["facts"], field="kept")
            cells = " | ".join(_pct(*rk[k]) for k in (*KINDS, "all"))
            lines.append(f"| {r['fraction']:.0%} ({r['budget']}) | {r['policy']} | {r['live_after_trace']} | {cells} |")
        lines.append(
            "\n**Recalled** by the model: absolute, and in parentheses relative to the facts the full cache recalls.\n"
        )
        lines.append("| budget | policy | system | tool_result | decision | user | all | re-prefills |")
        lines.append("|---|---|---|---|---|---|---|---|")
        cells = " | ".join(f"{fk[k][0]}/{fk[k][1]}" for k in (*KINDS, "all"))
        lines.append(f"| full | — | {cells} | {full.get('probe_reprefills', 0)} |")
        for r in tr["runs"]:
            if r["policy"] == "full":
                continue
            rk = recall_by_kind(r["facts"])
            rel = recall_by_kind(r["facts"], only=known)
            cells = " | ".join(f"{_pct(*rk[k])} ({_pct(*rel[k])})" for k in (*KINDS, "all"))
            lines.append(f"| {r['fraction']:.0%} | {r['policy']} | {cells} | {r.get('probe_reprefills', 0)} |")
    lines.append("\n#### Eviction cost against the turn that triggered it\n")
    lines.append("| trace | policy | evictions | evict p50 ms | evict p99 ms | turn p99 ms | share p50 | share p99 |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for tr in report["traces"]:
        for name in POLICY_ORDER:
            turns = [t for r in tr["runs"] if r["policy"] == name for t in r["turns"] if t["evict_s"] > 0]
            if not turns:
                continue
            ev = [1e3 * t["evict_s"] for t in turns]
            tt = [1e3 * t["total_s"] for t in turns]
            share = [t["evict_s"] / t["total_s"] for t in turns if t["total_s"] > 0]
            lines.append(
                f"| {tr['n_tokens']} | {name} | {len(turns)} | {_p(ev, 50):.2f} | {_p(ev, 99):.2f} | {_p(tt, 99):.0f} "
                f"| {100 * _p(share, 50):.2f}% | {100 * _p(share, 99):.2f}% |"
            )
    lines.append("\n#### `select` alone (synthetic view, evict to 50%)\n")
    lines.append("| policy @ tokens | median ms | p99 ms |")
    lines.append("|---|---|---|")
    for k, v in report.get("select_cost", {}).items():
        lines.append(f"| {k} | {v['median_ms']:.2f} | {v['p99_ms']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
