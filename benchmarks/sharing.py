"""Shared prefixes, handoff and batched decoding: memory, join TTFT, aggregate tokens/s.

Three measurements on the default model (Gemma 3 270M Q4_K_M, f16 KV cache), each
against a baseline measured in the same run:

1. **memory** — N = 1, 3, 5, 10, 15 agents whose prompts start with the same
   ~2,000-token document (deterministic synthetic text, declared once with
   ``pool.share``), each with ~200 private tokens. Real bytes of the KV cells in
   use (``stats()["totals"]["hot_cells_bytes"]``, i.e.
   ``llama_state_seq_get_size(ctx, -1)``: every used cell counted once) against N
   independent copies. The independent copies are *measured* in a pool with
   ``min_share_tokens=0`` for the first N ≤ 3 agents (N ≤ 1 with ``--quick``) and
   extrapolated for larger N from that pool's measured bytes per cell × the
   agents' token counts (prefilling 15 × 2,200 tokens would take minutes on two
   busy cores). Then every agent is parked in RAM, then in the SQLite archive:
   parked members keep only their private cells and reference one shared block
   (``stats()["shared"]``), so the parked bytes (private states + the block, once
   per tier) are compared with the same ideal and with the sum of the agents'
   whole states (what parking stored before shared blocks). PolyKV's published
   15-agent figure is restated on a consistent f16 basis next to ours. Target:
   live and parked bytes ≤ 1.1 × (shared + Σ private).
2. **ttft** — a new agent joins with the document as its prefix plus a short
   question: TTFT when the prefix is taken from a live donor (``seq_cp``), from
   a parked donor (restore of the share's RAM state), and when the agent prefills
   the same prompt itself (a ``min_share_tokens=0`` pool), interleaved. With the
   memory section, also the ~200-private-token joins of that section against the
   same prompts prefilled. Full mode adds a handoff (``pool.handoff``) against
   prefilling the destination's prompt, and a parked team whose donor history runs
   past the join point. Target: >= 20x.
3. **batch** — 4 and 8 agents generating 64 tokens each at once
   (``asyncio.gather`` of ``pool.achat``; continuous batching) vs the same requests
   one after another, same pool. Aggregate generated tokens/s, the share of
   identical greedy replies, and the anatomy of one decode step (k rows with
   logits for all k rows vs for one row) that explains the speed-up. Target: >= 2x
   at 4 agents.

The machine may be shared: every section records ``os.getloadavg()`` and every
variant uses the same ``--threads`` (default 1, the steadiest on a loaded 2-core box).

Usage::

    python benchmarks/sharing.py            # everything, ~8-12 min on 2 busy cores
    python benchmarks/sharing.py --quick    # N <= 5, fewer repetitions, ~4 min
    python benchmarks/sharing.py --only batch

Prints tables and writes ``bench-results/sharing.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import add_gpu_layers, load, make_pool, mib, ms, run_meta, table  # noqa: E402
from benchmarks._report import sections as parse_sections  # noqa: E402

logger = logging.getLogger("benchmarks.sharing")

SECTIONS = ("memory", "ttft", "batch")
TARGETS = {"live_vs_ideal_max": 1.1, "join_ttft_speedup": 20.0, "batch_speedup_4": 2.0}

# PolyKV (arXiv 2604.24971, SEEDS.md): 15 agents sharing a 4K document on Llama-3-8B.
POLYKV = {
    "agents": 15, "doc_tokens": 4096, "baseline_gb_published": 19.8, "pool_gb_published": 0.45,
    "compression_vs_f16": 2.91,  # keys int8 + values 3 bit ~ 5.5 bits vs 16
    # Llama-3-8B: 32 layers, 8 KV heads x 128 dims, K and V
    "llama3_8b_kv_bytes_per_token_f16": 32 * 8 * 128 * 2 * 2,
}

# --------------------------------------------------------------------------- synthetic text
_SERVICES = ["billing", "search", "payments", "auth", "analytics", "export", "onboarding", "audit", "mobile",
             "pipeline"]
_THINGS = ["retry limit", "timeout", "cache size", "batch size", "rate limit", "queue depth", "log level",
           "replica count"]
_OWNERS = ["Ana", "Bruno", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana", "Ivo", "Jun"]
_ROLES = ["planner", "coder", "reviewer", "tester", "writer", "analyst", "critic", "researcher", "operator", "auditor",
          "designer", "manager", "scout", "editor", "archivist", "translator"]


def make_document(pool: Any, target_tokens: int, seed: int = 7) -> str:
    """A deterministic design document of about ``target_tokens`` tokens (as the first user turn)."""
    rng = random.Random(seed)
    parts: list[str] = []
    i = 0
    while True:
        svc, thing, owner = rng.choice(_SERVICES), rng.choice(_THINGS), rng.choice(_OWNERS)
        parts.append(
            f"Section {i}. The {svc} service sets its {thing} to {rng.randint(2, 90)}; {owner} owns it, "
            f"changes need a review by {rng.choice(_OWNERS)}, and the value is checked every "
            f"{rng.randint(1, 24)} hours."
        )
        i += 1
        if pool.count_tokens(share_messages(" ".join(parts))) >= target_tokens:
            return " ".join(parts)


def private_text(pool: Any, doc: str, i: int, target_tokens: int) -> str:
    """Agent ``i``'s own instructions after the document: about ``target_tokens`` tokens, ending in a question."""
    rng = random.Random(1000 + i)
    role = _ROLES[i % len(_ROLES)]
    parts = [f"You are agent {i}, the {role} of the team."]
    base = pool.count_tokens(messages(doc, ""))
    while True:
        parts.append(
            f"Note {len(parts)}: as the {role}, check the {rng.choice(_THINGS)} of the {rng.choice(_SERVICES)} service "
            f"with {rng.choice(_OWNERS)} before step {rng.randint(1, 40)}."
        )
        text = " ".join(parts) + f" Question for agent {i}: which value should the {role} check first?"
        if pool.count_tokens(messages(doc, text)) - base >= target_tokens:
            return text


ACK = "I have read the document."


def share_messages(doc: str) -> list[dict[str, str]]:
    """The declared share: the document as the first user turn."""
    return [{"role": "user", "content": doc}]


def messages(doc: str, user: str) -> list[dict[str, str]]:
    """An agent's prompt: the shared document turn, an acknowledgement, then its own turn.

    The document is a *user* turn, not a system message: with Gemma's template a
    system message alone renders as a closed turn (``...<end_of_turn>``) while an
    agent's system message continues into its first user turn (``...\n\n``), so a
    system-message share is never a whole prefix of an agent's prompt, and a
    parked share can then not be cut (see the ``parked share, system message`` row).
    """
    return [{"role": "user", "content": doc}, {"role": "assistant", "content": ACK}, {"role": "user", "content": user}]


# --------------------------------------------------------------------------- helpers










def round_ctx(n: int) -> int:
    return int(math.ceil(n / 256) * 256)


def kv_bytes_per_token(pool: Any) -> int | None:
    """f16 K+V bytes of one token over all layers, from the GGUF metadata (None when not stated)."""
    m = pool.engine().model
    arch = m.meta("general.architecture")
    try:
        n_layer = int(m.meta(f"{arch}.block_count"))
        n_head = int(m.meta(f"{arch}.attention.head_count"))
        n_kv = int(m.meta(f"{arch}.attention.head_count_kv") or n_head)
        n_embd = int(m.meta(f"{arch}.embedding_length"))
        k_len = int(m.meta(f"{arch}.attention.key_length") or n_embd // n_head)
        v_len = int(m.meta(f"{arch}.attention.value_length") or n_embd // n_head)
    except (TypeError, ValueError):
        return None
    return n_layer * n_kv * (k_len + v_len) * 2


# --------------------------------------------------------------------------- 1. memory
def bench_memory(args: argparse.Namespace, common: dict[str, Any]) -> dict[str, Any]:
    ns = [1, 3, 5] if args.quick else [1, 3, 5, 10, 15]
    ns_indep = [1] if args.quick else [1, 3]
    n_max, gen = max(ns), 8
    out: dict[str, Any] = {"load_start": load(), "gen_tokens": gen}
    per_agent = args.doc_tokens + args.private_tokens + gen + 64
    k_restore = 3  # agents continued after a park of everything (each restore needs its own cells)
    n_ctx = round_ctx(max(args.doc_tokens + 64 + n_max * (args.private_tokens + gen + 64) + 512,
                          k_restore * per_agent + 512))
    logger.info("memory: %d agents sharing a ~%d-token document (n_ctx=%d)", n_max, args.doc_tokens, n_ctx)
    import tempfile

    tmpdir = tempfile.TemporaryDirectory(prefix="agentmem-sharing-")
    arc_path = os.path.join(tmpdir.name, "archive.db")
    with make_pool(common, n_ctx=n_ctx, resident_agents=n_max + 2, min_share_tokens=32, batch_decode=False,
                   archive_path=arc_path) as pool:
        doc = make_document(pool, args.doc_tokens)
        privs = [private_text(pool, doc, i, args.private_tokens) for i in range(n_max)]
        per_tok = kv_bytes_per_token(pool)
        t = time.perf_counter()
        n_share = pool.share("doc", share_messages(doc))
        share_s = time.perf_counter() - t
        st = pool.stats()
        share_cells = st["totals"]["hot_cells_bytes"]
        out.update(doc_tokens=n_share, share_prefill_s=share_s, share_cells_bytes=share_cells,
                   share_state_bytes=st["agents"]["share:doc"]["bytes"], kv_bytes_per_token_f16=per_tok,
                   cells_bytes_per_token_measured=share_cells / n_share)
        agents: list[dict[str, Any]] = []
        rows: list[dict[str, Any]] = []
        for i in range(n_max):
            aid = f"agent{i:02d}"
            r = pool.chat(aid, messages(doc, privs[i]), max_tokens=gen)
            agents.append({"id": aid, "kv": r.kv, "prompt_tokens": r.usage.prompt_tokens,
                           "cached_tokens": r.usage.cached_tokens, "ttft_s": r.timings.ttft_s, "reply": r.text})
            if i + 1 in ns:
                st = pool.stats()
                for a in agents:
                    a["live_tokens"] = st["agents"][a["id"]]["live_tokens"]
                    a["state_bytes"] = st["agents"][a["id"]]["bytes"]
                private = sum(a["live_tokens"] - a["cached_tokens"] for a in agents)
                rows.append({
                    "n": i + 1,
                    "live_cells_bytes": st["totals"]["hot_cells_bytes"],
                    "sum_state_bytes": st["totals"]["hot_bytes"],
                    "pool_reported_saved": st["totals"]["shared_bytes_saved"],
                    "shared_tokens": n_share,
                    "private_tokens": private,
                    "agent_tokens": sum(a["live_tokens"] for a in agents),
                    "kv_counts": {k: sum(a["kv"] == k for a in agents) for k in ("shared", "prefilled", "restored")},
                })
        totals = pool.stats()["totals"]
        out["shared_prefix_hits"] = totals["shared_prefix_hits"]
        out["shared_prefix_tokens"] = totals["shared_prefix_tokens"]
        for aid in pool.agents():  # everything to RAM
            pool.park(aid)
        st = pool.stats()
        warm = {aid: a["bytes"] for aid, a in st["agents"].items()}
        blocks = st["shared"]["blocks"]
        out["blocks"] = {k: {x: v[x] for x in ("tokens", "refs", "bytes", "parked_refs")} for k, v in blocks.items()}
        out["warm_total_bytes"] = st["tiers"]["warm"]["bytes"]
        out["warm_block_bytes"] = st["shared"]["ram_bytes"]
        out["warm_share_bytes"] = warm["share:doc"]
        out["parked_bytes_saved_reported"] = st["shared"]["parked_bytes_saved"]
        out["block_splits"] = st["totals"]["block_splits"]
        out["block_split_misses"] = st["totals"]["block_split_misses"]
        for a in agents:
            a["parked_bytes"] = warm[a["id"]]
            a["block"] = st["agents"][a["id"]]["block"]
        for aid in pool.agents():  # everything to the archive
            pool.park(aid, "cold")
        st = pool.stats()
        out["cold_total_bytes"] = st["tiers"]["cold"]["bytes"]
        out["cold_block_bytes"] = st["shared"]["archive_bytes"]
        out["ram_block_bytes_after_cold"] = st["shared"]["ram_bytes"]
        out["archive_file_bytes"] = sum(os.path.getsize(arc_path + x) for x in ("", "-wal") if os.path.exists(arc_path + x))
        cold = {aid: a["bytes"] for aid, a in st["agents"].items()}
        for a in agents:
            a["archived_bytes"] = cold[a["id"]]
        for row in rows:
            n = row["n"]
            row["parked_bytes"] = out["warm_block_bytes"] + warm["share:doc"] + sum(a["parked_bytes"] for a in agents[:n])
            row["archived_bytes"] = out["cold_block_bytes"] + cold["share:doc"] + sum(a["archived_bytes"] for a in agents[:n])
        # a park/restore cycle (from the archive): each restored agent gets its own cells
        # (restores do not re-link shared cells in the live cache)
        kinds, cells = [], []
        for i, a in enumerate(agents[:k_restore]):
            follow = messages(doc, privs[i]) + [{"role": "assistant", "content": a["reply"]},
                                                {"role": "user", "content": "Continue."}]
            kinds.append(pool.chat(a["id"], follow, max_tokens=1).kv)
            cells.append(pool.stats()["totals"]["hot_cells_bytes"])
        by_n = {x["n"]: x["live_cells_bytes"] for x in rows}
        big = sorted(by_n)
        out["after_restore"] = {
            "agents": k_restore, "kv": kinds, "live_cells_bytes": cells,
            "per_agent_bytes": cells[-1] / k_restore,
            "restore_failures": pool.stats()["totals"]["restore_failures"],
            "linked_restores": pool.stats()["totals"]["linked_restores"],
            "per_extra_agent_bytes_when_shared": (by_n[big[-1]] - by_n[big[0]]) / (big[-1] - big[0]),
        }
    tmpdir.cleanup()
    out["agents"] = agents

    # N independent copies: the same prompts in a pool that never shares
    n_ind = max(ns_indep)
    n_ctx_ind = round_ctx(n_ind * per_agent + 256)
    logger.info("memory: %d independent agents (min_share_tokens=0, n_ctx=%d)", n_ind, n_ctx_ind)
    indep: list[dict[str, Any]] = []
    with make_pool(common, n_ctx=n_ctx_ind, resident_agents=n_ind + 1, min_share_tokens=0, batch_decode=False) as pool:
        for i in range(n_ind):
            aid = f"agent{i:02d}"
            r = pool.chat(aid, messages(doc, privs[i]), max_tokens=gen)
            st = pool.stats()
            indep.append({"n": i + 1, "kv": r.kv, "ttft_s": r.timings.ttft_s, "prompt_tokens": r.usage.prompt_tokens,
                          "live_cells_bytes": st["totals"]["hot_cells_bytes"],
                          "tokens": sum(a["live_tokens"] for a in st["agents"].values())})
    per_cell_ind = indep[-1]["live_cells_bytes"] / indep[-1]["tokens"]
    out["independent_measured"] = indep
    out["independent_bytes_per_cell"] = per_cell_ind
    measured = {x["n"]: x["live_cells_bytes"] for x in indep}
    per_cell = per_tok or out["cells_bytes_per_token_measured"]
    for row in rows:
        n = row["n"]
        row["independent_bytes"] = measured.get(n, per_cell_ind * sum(a["live_tokens"] for a in agents[:n]))
        row["independent_source"] = "measured" if n in measured else "measured bytes/cell x tokens"
        row["ideal_bytes"] = per_cell * (row["shared_tokens"] + row["private_tokens"])
        row["live_vs_ideal"] = row["live_cells_bytes"] / row["ideal_bytes"]
        row["saving_x"] = row["independent_bytes"] / row["live_cells_bytes"]
        # ideal parked: the shared block once + the private tokens' cells (f16)
        block_bytes = out["warm_block_bytes"] or out["warm_share_bytes"]
        row["parked_ideal_bytes"] = block_bytes + per_cell * row["private_tokens"]
        row["parked_vs_ideal"] = row["parked_bytes"] / row["parked_ideal_bytes"]
        row["archived_vs_ideal"] = row["archived_bytes"] / row["parked_ideal_bytes"]
        # what parking stored before shared blocks: every agent's whole state
        row["parked_whole_states_bytes"] = row["sum_state_bytes"]
        row["parked_saving_x"] = row["parked_whole_states_bytes"] / row["parked_bytes"]
        row["meets_target"] = max(row["live_vs_ideal"], row["parked_vs_ideal"], row["archived_vs_ideal"]) <= \
            TARGETS["live_vs_ideal_max"]
    out["rows"] = rows
    out["polykv"] = polykv_restated(rows[-1], per_tok)
    out["load_end"] = load()
    return out


def polykv_restated(row: dict[str, Any], per_tok: int | None) -> dict[str, Any]:
    """PolyKV's 15-agent figure on a consistent f16 basis, next to ours."""
    p = dict(POLYKV)
    fp32_to_f16 = 0.5
    p["baseline_gb_f16"] = p["baseline_gb_published"] * fp32_to_f16
    # 0.45 = 19.8 / 15 / 2.91: one *fp32* copy divided by an f16-relative compression ratio
    p["pool_gb_published_check"] = p["baseline_gb_published"] / p["agents"] / p["compression_vs_f16"]
    p["one_copy_gb_f16"] = p["baseline_gb_f16"] / p["agents"]
    p["one_copy_compressed_gb_f16_basis"] = p["one_copy_gb_f16"] / p["compression_vs_f16"]
    p["from_model_shape_gb_f16"] = p["agents"] * p["doc_tokens"] * p["llama3_8b_kv_bytes_per_token_f16"] / 1e9
    p["published_ratio"] = p["baseline_gb_published"] / p["pool_gb_published"]
    p["f16_sharing_only_ratio"] = p["baseline_gb_f16"] / p["one_copy_gb_f16"]
    p["f16_with_compression_ratio"] = p["baseline_gb_f16"] / p["one_copy_compressed_gb_f16_basis"]
    ours = {"agents": row["n"], "independent_bytes": row["independent_bytes"], "live_bytes": row["live_cells_bytes"],
            "ratio": row["saving_x"]}
    if per_tok:
        scale = p["llama3_8b_kv_bytes_per_token_f16"] / per_tok
        ours["llama3_8b_scaled_independent_gb"] = row["independent_bytes"] * scale / 1e9
        ours["llama3_8b_scaled_live_gb"] = row["live_cells_bytes"] * scale / 1e9
    p["ours"] = ours
    return p


def print_memory(r: dict[str, Any]) -> None:
    print(f"\n== memory: agents sharing a {r['doc_tokens']}-token document (f16 KV; "
          f"{r['kv_bytes_per_token_f16']} B/token from the model shape) ==")
    rows = []
    for x in r["rows"]:
        rows.append([
            x["n"], x["shared_tokens"], x["private_tokens"], mib(x["live_cells_bytes"]), mib(x["ideal_bytes"]),
            f"{x['live_vs_ideal']:.3f}",
            mib(x["independent_bytes"]) + ("" if x["independent_source"] == "measured" else "*"),
            f"{x['saving_x']:.2f}x",
        ])
    print(table(["N", "shared tok", "private tok", "live (shared)", "ideal", "live/ideal", "N copies", "saving"], rows))
    print("\nparked (every agent parked; shared block stored once per tier):")
    prow = [[x["n"], mib(x["parked_whole_states_bytes"]), mib(x["parked_bytes"]), mib(x["archived_bytes"]),
             mib(x["parked_ideal_bytes"]), f"{x['parked_vs_ideal']:.3f}", f"{x['archived_vs_ideal']:.3f}",
             f"{x['parked_saving_x']:.2f}x"] for x in r["rows"]]
    print(table(["N", "whole states (no blocks)", "RAM parked", "archive", "ideal", "RAM/ideal", "archive/ideal",
                 "saving"], prow))
    blk = ", ".join(f"{v['tokens']} tok x {v['refs']} refs" for v in r["blocks"].values())
    print(f"blocks: {len(r['blocks'])} ({blk}); splits {r['block_splits']}, misses {r['block_split_misses']}; "
          f"archive file {mib(r['archive_file_bytes'])}; RAM block copy once all went to the archive: "
          f"{mib(r['ram_block_bytes_after_cold'])}")
    print("* = measured bytes per cell of the no-sharing pool x the agents' token counts "
          f"({r['independent_bytes_per_cell']:.0f} B/cell); others measured in a min_share_tokens=0 pool")
    ar = r["after_restore"]
    steps = ", ".join(mib(b - a) for a, b in zip([0, *ar["live_cells_bytes"]], ar["live_cells_bytes"]))
    print(f"park everything (archive), then continue {ar['agents']} agents ({', '.join(ar['kv'])}; "
          f"{ar['linked_restores']} linked to a live member's prefix): live cells grew by {steps}, "
          f"{mib(ar['per_agent_bytes'])} per restored agent vs {mib(ar['per_extra_agent_bytes_when_shared'])} "
          "per extra agent while sharing (a joined restore writes private cells)")
    p = r["polykv"]
    o = p["ours"]
    print("\nPolyKV (arXiv 2604.24971), 15 agents, 4K document, Llama-3-8B, restated on f16:")
    print(table(["figure", "N copies", "shared", "ratio"], [
        ["published (fp32 baseline, K8/V3 pool)", f"{p['baseline_gb_published']:.2f} GB",
         f"{p['pool_gb_published']:.2f} GB", f"{p['published_ratio']:.0f}x"],
        ["f16 basis, sharing only (one f16 copy)", f"{p['baseline_gb_f16']:.2f} GB", f"{p['one_copy_gb_f16']:.2f} GB",
         f"{p['f16_sharing_only_ratio']:.0f}x"],
        ["f16 basis, sharing + K8/V3 (2.91x)", f"{p['baseline_gb_f16']:.2f} GB",
         f"{p['one_copy_compressed_gb_f16_basis']:.2f} GB", f"{p['f16_with_compression_ratio']:.0f}x"],
        [f"agentmem measured, {o['agents']} agents, Gemma 3 270M f16", mib(o["independent_bytes"]),
         mib(o["live_bytes"]), f"{o['ratio']:.1f}x"],
        *([["  same cells at Llama-3-8B size (x{:.1f} B/token)".format(POLYKV["llama3_8b_kv_bytes_per_token_f16"]
                                                                      / r["kv_bytes_per_token_f16"]),
            f"{o['llama3_8b_scaled_independent_gb']:.2f} GB", f"{o['llama3_8b_scaled_live_gb']:.2f} GB",
            f"{o['ratio']:.1f}x"]] if "llama3_8b_scaled_live_gb" in o else []),
    ]))


# --------------------------------------------------------------------------- 2. ttft
def bench_ttft(args: argparse.Namespace, common: dict[str, Any], memory: dict[str, Any] | None) -> dict[str, Any]:
    reps = 1 if args.quick else 3
    out: dict[str, Any] = {"load_start": load(), "reps": reps}
    n_ctx = round_ctx(2 * (args.doc_tokens + args.private_tokens + 256) + 512)
    trials: dict[str, list[dict[str, Any]]] = {"live donor": [], "parked donor": [], "prefill": []}
    with make_pool(common, n_ctx=n_ctx, resident_agents=4, min_share_tokens=32, batch_decode=False) as sp, \
            make_pool(common, n_ctx=n_ctx, resident_agents=4, min_share_tokens=0, batch_decode=False) as pp:
        doc = make_document(sp, args.doc_tokens)
        t = time.perf_counter()
        n_share = sp.share("doc", share_messages(doc))
        out["share_prefill_s"] = time.perf_counter() - t
        out["doc_tokens"] = n_share
        qs = [f"Question {k}: which service has the highest {_THINGS[k % len(_THINGS)]}? Answer briefly."
              for k in range(reps)]

        def trial(pool: Any, kind: str, k: int) -> None:
            aid = f"join{k}"
            r = pool.chat(aid, messages(doc, qs[k]), max_tokens=1)
            trials[kind].append({"ttft_s": r.timings.ttft_s, "restore_s": r.timings.restore_s, "kv": r.kv,
                                 "prompt_tokens": r.usage.prompt_tokens, "cached_tokens": r.usage.cached_tokens,
                                 "load": load()})
            pool.forget(aid)

        logger.info("ttft: %d join(s) per variant on a %d-token document", reps, n_share)
        for k in range(reps):  # interleaved so load drifts hit both alike
            trial(sp, "live donor", k)
            trial(pp, "prefill", k)
        sp.park("share:doc")
        for k in range(reps):
            trial(sp, "parked donor", k)
        out["trials"] = trials
        if not args.quick:
            out["system_layout"] = ttft_system_layout(sp, doc, qs[0])
            out["parked_team"] = ttft_parked_team(sp, doc, qs[0])
            out["handoff"] = ttft_handoff(sp, pp, doc, private_text(sp, doc, 0, args.private_tokens))
    base = statistics.median(x["ttft_s"] for x in trials["prefill"])
    rows = []
    for kind in ("live donor", "parked donor", "prefill"):
        xs = trials[kind]
        med = statistics.median(x["ttft_s"] for x in xs)
        rows.append({"variant": kind, "ttft_s": med, "speedup": base / med, "kv": sorted({x["kv"] for x in xs}),
                     "prompt_tokens": xs[0]["prompt_tokens"], "cached_tokens": xs[0]["cached_tokens"],
                     "restore_s": statistics.median(x["restore_s"] for x in xs)})
    if memory is not None:  # ~200 private tokens after the shared document: memory section's joins
        ind = memory["independent_measured"]
        shared = memory["agents"][: len(ind)]
        b = statistics.median(x["ttft_s"] for x in ind)
        s = statistics.median(x["ttft_s"] for x in shared)
        rows.append({"variant": "join, ~200 private tokens (memory section)", "ttft_s": s, "speedup": b / s,
                     "kv": sorted({x["kv"] for x in shared}), "prompt_tokens": shared[0]["prompt_tokens"],
                     "cached_tokens": shared[0]["cached_tokens"], "baseline_ttft_s": b})
    if "handoff" in out:
        h = out["handoff"]
        rows.append({"variant": f"handoff ({h['card']['mode']}) + new turn", "ttft_s": h["dst_ttft_s"] + h["handoff_s"],
                     "speedup": h["prefill_ttft_s"] / (h["dst_ttft_s"] + h["handoff_s"]), "kv": [h["dst_kv"]],
                     "prompt_tokens": h["prompt_tokens"], "cached_tokens": h["cached_tokens"],
                     "baseline_ttft_s": h["prefill_ttft_s"]})
    for key, label in (("system_layout", "parked share, document as system message"),
                       ("parked_team", "parked team, donor history past the join point")):
        if key in out:
            p = out[key]
            rows.append({"variant": label, "ttft_s": p["ttft_s"], "speedup": base / p["ttft_s"], "kv": [p["kv"]],
                         "prompt_tokens": p["prompt_tokens"], "cached_tokens": p["cached_tokens"]})
    out["rows"] = rows
    out["prefill_ttft_s"] = base
    out["meets_target"] = all(r["speedup"] >= TARGETS["join_ttft_speedup"] for r in rows
                              if r["variant"] in ("live donor", "parked donor"))
    out["load_end"] = load()
    return out


def ttft_handoff(sp: Any, pp: Any, doc: str, private: str) -> dict[str, Any]:
    """Hand a live agent's whole context to a new agent that continues it, vs prefilling that prompt."""
    first = messages(doc, private)
    r = sp.chat("src", first, max_tokens=16)
    t = time.perf_counter()
    card = sp.handoff("src", "dst")
    handoff_s = time.perf_counter() - t
    follow = first + [{"role": "assistant", "content": r.text},
                      {"role": "user", "content": "Hand this over: summarise the next step in one sentence."}]
    d = sp.chat("dst", follow, max_tokens=1)
    verified = card.verify(sp.history_tokens("dst"))
    b = pp.chat("dst", follow, max_tokens=1)
    for aid in ("src", "dst"):
        sp.forget(aid)
    pp.forget("dst")
    return {"handoff_s": handoff_s, "dst_ttft_s": d.timings.ttft_s, "dst_kv": d.kv,
            "prompt_tokens": d.usage.prompt_tokens, "cached_tokens": d.usage.cached_tokens,
            "prefill_ttft_s": b.timings.ttft_s, "card_verifies": verified,
            "card": {k: getattr(card, k) for k in ("src", "dst", "seq_no", "n_tokens", "n_live", "mode", "checksum")}}


def ttft_system_layout(sp: Any, doc: str, question: str) -> dict[str, Any]:
    """The share is parked; an agent carries the document as a *system* message (renders ``doc\n\n`` + question)."""
    r = sp.chat("sysjoin", [{"role": "system", "content": doc}, {"role": "user", "content": question}], max_tokens=1)
    sp.forget("sysjoin")
    return {"ttft_s": r.timings.ttft_s, "kv": r.kv, "prompt_tokens": r.usage.prompt_tokens,
            "cached_tokens": r.usage.cached_tokens}


def ttft_parked_team(sp: Any, doc: str, question: str) -> dict[str, Any]:
    """All parked: the share and a member whose history goes past the document; a new agent joins."""
    sp.chat("member", messages(doc, "Member: list two services."), max_tokens=16)
    sp.park("member")
    r = sp.chat("late", messages(doc, question), max_tokens=1)
    res = {"ttft_s": r.timings.ttft_s, "kv": r.kv, "prompt_tokens": r.usage.prompt_tokens,
           "cached_tokens": r.usage.cached_tokens}
    for aid in ("member", "late"):
        sp.forget(aid)
    return res


def print_ttft(r: dict[str, Any]) -> None:
    print(f"\n== ttft: a new agent joins with a {r['doc_tokens']}-token shared document "
          f"(median of {r['reps']}; prefill baseline {ms(r['prefill_ttft_s'])}) ==")
    rows = [[x["variant"], x["prompt_tokens"], x["cached_tokens"], ",".join(x["kv"]), ms(x["ttft_s"]),
             ms(x.get("baseline_ttft_s", r["prefill_ttft_s"])), f"{x['speedup']:.1f}x"] for x in r["rows"]]
    print(table(["variant", "prompt tok", "cached tok", "kv", "TTFT", "prefill TTFT", "speed-up"], rows))


# --------------------------------------------------------------------------- 3. batch
_TOPICS = ["gardening", "databases", "sailing", "cooking", "chess", "astronomy", "painting", "running"]


def batch_messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"You are writer {i}. Write long, detailed answers."},
            {"role": "user",
             "content": f"Write a numbered list of thirty practical tips about {_TOPICS[i]}, one per line."}]


async def gather_chats(pool: Any, ids: list[str], max_tokens: int) -> list[Any]:
    calls = (pool.achat(aid, batch_messages(i), max_tokens=max_tokens) for i, aid in enumerate(ids))
    return await asyncio.gather(*calls)


def bench_batch(args: argparse.Namespace, common: dict[str, Any]) -> dict[str, Any]:
    reps = 1 if args.quick else 2
    out: dict[str, Any] = {"load_start": load(), "max_tokens": args.gen_tokens, "reps": reps, "rows": []}
    n_max = 8
    n_ctx = round_ctx(n_max * (args.gen_tokens + 128) + 512)
    with make_pool(common, n_ctx=n_ctx, resident_agents=n_max + 1, batch_decode=True) as pool:
        loop = asyncio.new_event_loop()
        # asyncio.to_thread's default executor has min(32, cpu_count + 4) workers (6 on 2 cores): too few for 8 agents
        loop.set_default_executor(ThreadPoolExecutor(max_workers=n_max + 4, thread_name_prefix="bench"))
        try:
            for n in (4, 8):
                ids = [f"w{n}_{i}" for i in range(n)]
                for i, aid in enumerate(ids):  # prefill once: both variants then decode 1 prompt token + generate
                    pool.chat(aid, batch_messages(i), max_tokens=1)
                runs: dict[str, list[dict[str, Any]]] = {"batched": [], "sequential": []}
                for _ in range(reps):
                    before = pool.stats()["totals"]
                    t = time.perf_counter()
                    res = loop.run_until_complete(gather_chats(pool, ids, args.gen_tokens))
                    wall = time.perf_counter() - t
                    after = pool.stats()["totals"]
                    runs["batched"].append({
                        "wall_s": wall, "tokens": sum(x.usage.completion_tokens for x in res),
                        "replies": [x.tokens for x in res],
                        "steps": after["batched_steps"] - before["batched_steps"],
                        "step_tokens": after["batched_tokens"] - before["batched_tokens"], "load": load()})
                    t = time.perf_counter()
                    res = [pool.chat(aid, batch_messages(i), max_tokens=args.gen_tokens) for i, aid in enumerate(ids)]
                    wall = time.perf_counter() - t
                    runs["sequential"].append({"wall_s": wall, "tokens": sum(x.usage.completion_tokens for x in res),
                                               "replies": [x.tokens for x in res], "load": load()})
                for aid in ids:
                    pool.forget(aid)
                tps = {k: statistics.median(x["tokens"] / x["wall_s"] for x in v) for k, v in runs.items()}
                b, s = runs["batched"][-1]["replies"], runs["sequential"][-1]["replies"]
                first_div = []
                for x, y in zip(b, s):
                    d = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), None)
                    first_div.append(d if d is not None else (None if len(x) == len(y) else min(len(x), len(y))))
                out["rows"].append({
                    "agents": n, "batched_tok_s": tps["batched"], "sequential_tok_s": tps["sequential"],
                    "speedup": tps["batched"] / tps["sequential"],
                    "tokens": runs["batched"][-1]["tokens"],
                    "mean_batch": runs["batched"][-1]["step_tokens"] / max(1, runs["batched"][-1]["steps"]),
                    "identical_replies": sum(x == y for x, y in zip(b, s)),
                    "same_first_token": sum(bool(x) and bool(y) and x[0] == y[0] for x, y in zip(b, s)),
                    "first_divergence": first_div,
                    "runs": [{k: v for k, v in x.items() if k != "replies"} | {"variant": kind}
                             for kind, xs in runs.items() for x in xs],
                })
        finally:
            loop.close()
        out["max_batch"] = pool.stats()["totals"]["max_batch"]
        out["anatomy"] = decode_anatomy(pool)
    out["meets_target"] = out["rows"][0]["speedup"] >= TARGETS["batch_speedup_4"]
    out["load_end"] = load()
    return out


def decode_anatomy(pool: Any, reps: int = 9) -> list[dict[str, Any]]:
    """ms of one ``llama_decode`` of k one-token rows, logits for all k rows vs for one row.

    Low level (the pool's own context, all sequences emptied first); variants are
    interleaved ``reps`` times so a load change hits them alike. ``bound_speedup`` =
    k x t(1 row) / t(k rows, k logits): the best aggregate speed-up batching can give.
    """
    ctx = pool.engine().ctx
    toks = pool.engine().model.tokenize("Write a list of tips about gardening.", add_special=True)
    ks = [k for k in (1, 2, 4, 8) if k <= pool.config.resident_agents]
    samples: dict[tuple[int, int], list[float]] = {}
    with ctx.lock:
        for s in range(max(ks)):
            ctx.seq_rm(s)
            ctx.decode_run(s, toks, 0)
        pos = [len(toks)] * max(ks)
        b = ctx._batch
        for _ in range(reps):
            for k in ks:
                for n_logits in sorted({k, 1}):
                    b.clear()
                    for s in range(k):
                        b.add_run([toks[-1]], pos[s], s, logits_last=s < n_logits)
                    t = time.perf_counter()
                    ctx._decode(b)
                    samples.setdefault((k, n_logits), []).append(time.perf_counter() - t)
                    for s in range(k):
                        pos[s] += 1
        for s in range(max(ks)):
            ctx.seq_rm(s)
    one = statistics.median(samples[(1, 1)])
    res = []
    for k in ks:
        full, single = statistics.median(samples[(k, k)]), statistics.median(samples[(k, 1)])
        res.append({"rows": k, "all_logits_ms": 1e3 * full, "one_logits_ms": 1e3 * single,
                    "bound_speedup": k * one / full})
    return res


def print_batch(r: dict[str, Any]) -> None:
    print(f"\n== batch: agents generating {r['max_tokens']} tokens each at once vs one after another "
          f"(median of {r['reps']}) ==")
    rows = [[x["agents"], x["tokens"], f"{x['batched_tok_s']:.1f}", f"{x['sequential_tok_s']:.1f}",
             f"{x['speedup']:.2f}x", f"{x['mean_batch']:.1f}", f"{x['identical_replies']}/{x['agents']}",
             f"{x['same_first_token']}/{x['agents']}",
             ",".join("=" if d is None else str(d) for d in x["first_divergence"])] for x in r["rows"]]
    print(table(["agents", "tokens", "batched tok/s", "one-by-one tok/s", "speed-up", "mean batch", "identical",
                 "same 1st token", "first divergence"], rows))
    a = r["anatomy"]
    print("\none llama_decode of k one-token rows (low level):")
    print(table(["rows", "logits for all rows", "logits for one row", "per row, all logits", "best speed-up"],
                [[x["rows"], f"{x['all_logits_ms']:.1f} ms", f"{x['one_logits_ms']:.1f} ms",
                  f"{x['all_logits_ms'] / x['rows']:.1f} ms", f"{x['bound_speedup']:.2f}x"] for x in a]))


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N <= 5, one repetition, no handoff/parked-team rows (~4 min)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {', '.join(SECTIONS)}")
    ap.add_argument("--threads", type=int, default=1, help="n_threads of every pool (same for all variants)")
    add_gpu_layers(ap)
    ap.add_argument("--model", default=None, help="GGUF path (default: the bundled Gemma 3 270M)")
    ap.add_argument("--doc-tokens", type=int, default=2000, help="tokens of the shared document")
    ap.add_argument("--private-tokens", type=int, default=200, help="private prompt tokens per agent (memory section)")
    ap.add_argument("--gen-tokens", type=int, default=64, help="tokens each agent generates (batch section)")
    ap.add_argument("--out", type=Path, default=Path("bench-results/sharing.json"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("agentmem").setLevel(logging.WARNING)
    sections = parse_sections(ap, args.only, SECTIONS)
    from agentmem.engine.context import llama_build_info
    from agentmem.model import resolve_model_path

    model = str(resolve_model_path(args.model))
    common = {"model": model, "threads": args.threads}
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "meta": run_meta("sharing.py", model, args, argv, llama=llama_build_info()),
        "targets": TARGETS,
    }
    if "memory" in sections:
        results["memory"] = bench_memory(args, common)
        print_memory(results["memory"])
    if "ttft" in sections:
        results["ttft"] = bench_ttft(args, common, results.get("memory"))
        print_ttft(results["ttft"])
    if "batch" in sections:
        results["batch"] = bench_batch(args, common)
        print_batch(results["batch"])
    results["meta"]["load_at_end"] = load()
    results["meta"]["wall_s"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    logger.info("wrote %s (%.0f s)", args.out, results["meta"]["wall_s"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
