"""Recall of evicted text by meaning (#34): recall@k of BM25, vectors and hybrid; embedding and indexing cost.

Sections (``--only``):

* ``set`` — the memory set of ``benchmarks/_recall_set.py`` (52 facts and 24 lines of small
  talk, each its own span) archived in a SQLite file, asked by paraphrase and by keyword:
  recall@1 and recall@3 of ``keyword`` (FTS5 BM25, what recall did before), ``vector``
  (the default embedder) and ``hybrid`` (both, reciprocal rank fusion) — after closing
  and reopening the archive, as after a restart. With ``tokenlearn-static-model``
  installed its 64-d static vectors are measured as a second candidate; with ``--llama``
  the chat model's own mean-pooled embeddings (llama.cpp's embeddings mode) as a third.
* ``pool`` — the same conversation through a real pool with a token budget: the facts
  are evicted in eviction blocks (spans cut mid-sentence, as in use) and ``pool.recall``
  is asked; recall@k counts a hit when a returned span holds a piece of the fact.
* ``cost`` — embedding throughput (texts/s), indexing throughput (spans/s archived with
  and without vectors), search latency per mode over ``--spans`` spans of one agent, and
  the index's bytes per 1k spans.

Usage::

    python benchmarks/recall.py [--only set,pool,cost] [--spans 1000] [--quick] [--llama]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _recall_set import FACTS, FILLER  # noqa: E402
from _report import load, table  # noqa: E402

from agentmem.archive import Archive  # noqa: E402
from agentmem.recall import FunctionEmbedder, RecallIndex, make_embedder  # noqa: E402

MODES = ("keyword", "vector", "hybrid")


def _spans() -> list[tuple[int, int, str, str]]:
    """Facts and small talk interleaved, as one conversation's spans."""
    out, pos = [], 0
    fill = iter(FILLER * 3)
    for i, f in enumerate(FACTS):
        for text in ([f.text, next(fill)] if i % 2 else [f.text]):
            out.append((pos, pos + 32, "user", text))
            pos += 32
    return out


def _recall_at(ranked: list[list[bool]], k: int) -> float:
    return sum(any(r[:k]) for r in ranked) / len(ranked)


def section_set(embedders: dict[str, Any]) -> list[list[Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, emb in embedders.items():
            path = Path(d) / f"{name}.db"
            with Archive(path) as arc:
                RecallIndex(arc, embedder=emb).add("a", _spans())
            with Archive(path) as arc:  # reopened: what a restarted pool searches
                idx = RecallIndex(arc, embedder=emb)
                for mode in MODES if name == next(iter(embedders)) else MODES[1:]:
                    label = "keyword (BM25)" if mode == "keyword" else f"{mode} ({name})"
                    for kind in ("paraphrase", "keyword"):
                        ranked = []
                        for f in FACTS:
                            hits = idx.search("a", getattr(f, kind), 3, mode=mode)
                            ranked.append([h.text == f.text for h in hits])
                        rows.append([label, kind, f"{_recall_at(ranked, 1):.2f}", f"{_recall_at(ranked, 3):.2f}"])
    return rows


def section_pool(model: str | None, threads: int) -> list[list[Any]]:
    from agentmem import MemoryPool

    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    fill = iter(FILLER * 3)
    for f in FACTS:
        msgs += [{"role": "user", "content": f.text}, {"role": "assistant", "content": next(fill)}]
    msgs.append({"role": "user", "content": "Thanks for listening."})
    rows = []
    with tempfile.TemporaryDirectory() as d, MemoryPool(
        model, n_threads=threads, n_ctx=8192, resident_agents=1, prefetch=False, archive_path=str(Path(d) / "a.db"),
        agent_budget_tokens=256,
    ) as pool:
        t0 = time.perf_counter()
        pool.chat("a", msgs, max_tokens=1)
        dt = time.perf_counter() - t0
        st = pool.recall_stats()
        evicted = pool.engine()._core.recall_store.list_evicted("a")
        for mode in MODES:
            for kind in ("paraphrase", "keyword"):
                ranked = []
                for f in FACTS:
                    pieces = {w for w in f.text.split() if len(w) > 4}
                    hits = pool.recall("a", getattr(f, kind), 3, mode=mode)
                    ranked.append([len(pieces & set(h.text.split())) >= 2 for h in hits])
                rows.append([mode, kind, f"{_recall_at(ranked, 1):.2f}", f"{_recall_at(ranked, 3):.2f}"])
        rows.append(["(call)", f"{len(evicted)} spans evicted", f"{dt:.1f} s call",
                     f"{st['embed_seconds']:.2f} s embedding"])
    return rows


def _llama_embedder(model: str | None, threads: int) -> Any:
    """The chat model's own mean-pooled hidden states (llama.cpp embeddings mode), as a candidate."""
    import llama_cpp

    from agentmem.model import resolve_model_path

    llm = llama_cpp.Llama(model_path=str(resolve_model_path(model)), embedding=True, n_threads=threads,
                          n_ctx=512, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False)
    return FunctionEmbedder(lambda texts: [llm.embed(t, normalize=True) for t in texts], name="gemma-mean")


def _timed(fn: Callable[[], Any], reps: int) -> float:
    xs = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs)


def section_cost(emb: Any, n_spans: int, reps: int) -> list[list[Any]]:
    texts = [s[3] for s in _spans()]
    many = [(i * 32, i * 32 + 32, "user", f"{texts[i % len(texts)]} ({i})") for i in range(n_spans)]
    rows = []
    emb.embed(texts[:4])  # loads the weights
    t = _timed(lambda: emb.embed(texts), 1)
    rows.append(["embedding", f"{len(texts) / t:.0f} texts/s", f"{len(texts)} texts, batch of all"])
    t1 = _timed(lambda: emb.embed(texts[:1]), reps)
    rows.append(["embedding one query", f"{1e3 * t1:.1f} ms", ""])
    with tempfile.TemporaryDirectory() as d:
        for label, e in (("without vectors", "none"), ("with vectors", emb)):
            path = Path(d) / f"{label}.db"
            with Archive(path) as arc:
                idx = RecallIndex(arc, embedder=e)
                t = time.perf_counter()
                for lo in range(0, len(many), 8):  # an eviction archives a few spans at a time
                    idx.add("a", many[lo:lo + 8])
                dt = time.perf_counter() - t
                rows.append([f"indexing {label}", f"{len(many) / dt:.0f} spans/s", f"{n_spans} spans, 8 per call"])
                if e == "none":
                    continue
                arc.checkpoint()
                vec = arc.stats().tables["span_vectors"]
                rows.append(["index bytes per 1k spans", f"{1000 * vec.payload_bytes / vec.rows / 1024:.0f} KiB",
                             f"vectors only; the file {os.path.getsize(path) / 2**20:.1f} MiB in all"])
                q = FACTS[0].paraphrase
                for mode in MODES:
                    t = _timed(lambda: idx.search("a", q, 3, mode=mode), reps)
                    rows.append([f"search, {mode}", f"{1e3 * t:.1f} ms", f"{n_spans} spans, query embedding included"])
                qv = emb.embed([q])[0]
                t = _timed(lambda: arc.search_vectors("a", qv, k=3, model=emb.name), reps)
                rows.append(["cosine search alone", f"{1e3 * t:.1f} ms",
                             f"{n_spans} spans: SQL, numpy, rows read back"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="set,pool,cost")
    ap.add_argument("--spans", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default=None, help="the pool section's model (default: the bundled one)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("AGENTMEM_THREADS", "1")))
    ap.add_argument("--quick", action="store_true", help="no pool section, 300 spans")
    ap.add_argument("--llama", action="store_true", help="also measure the chat model's pooled embeddings (set)")
    args = ap.parse_args(argv)
    only = {s.strip() for s in args.only.split(",")} - ({"pool"} if args.quick else set())
    n_spans = 300 if args.quick else args.spans
    emb = make_embedder("minilm")
    print(f"load before: {load()}  embedder: {emb.name}")
    if "set" in only:
        embedders: dict[str, Any] = {"all-minilm-l6-v2": emb}
        try:
            from static_model import get_embeddings

            embedders["static-64d"] = FunctionEmbedder(get_embeddings, name="tokenlearn-static-64d")
        except ImportError:
            pass
        if args.llama:
            embedders["gemma-3-270m-mean"] = _llama_embedder(args.model, args.threads)
        print("\n== set: 52 facts among small talk, archive reopened; recall@k\n")
        print(table(["ranking", "question", "recall@1", "recall@3"], section_set(embedders)))
    if "pool" in only:
        print("\n== pool: evicted under a 256-token budget, pool.recall\n")
        print(table(["mode", "question", "recall@1", "recall@3"], section_pool(args.model, args.threads)))
    if "cost" in only:
        print("\n== cost\n")
        print(table(["what", "figure", "note"], section_cost(emb, n_spans, args.reps)))
    print(f"\nload after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
