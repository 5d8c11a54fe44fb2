"""Span vectors on PostgreSQL with pgvector (#34): the HNSW index, its plan, its ranking, the fallback without it,
an older archive gaining the column; and the hot partitions in RAM on every backend."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest

import agentmem.archive.pgvector as pgvector
from agentmem.archive import ArchiveBase, open_archive
from agentmem.archive.pgvector import index_name
from agentmem.recall import FunctionEmbedder, RecallIndex
from tests.fixtures.archives import VECTOR_BACKENDS, raw_connection

DIM = 16


def _vectors(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _spans(n: int) -> list[tuple[int, int, str, str]]:
    return [(i, i + 1, "user", f"span {i}") for i in range(n)]


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


@pytest.fixture(params=VECTOR_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pg(pgvector_url: str) -> Iterator[ArchiveBase]:
    """A pgvector archive with no hot partitions: every search goes through the server."""
    with open_archive(pgvector_url) as arc:
        arc.hot_vectors.resize(max_bytes=0)
        yield arc


def test_each_embedder_gets_an_hnsw_index_and_a_search_uses_it(pg: ArchiveBase) -> None:
    pg.add_evicted_spans("a", _spans(3000), vectors=_vectors(3000, 0), model="toy")
    pg.add_evicted_spans("b", _spans(500), vectors=_vectors(500, 1), model="toy")
    raw = raw_connection(pg)
    indexes = dict(raw.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'span_vectors' "
                               "AND schemaname = current_schema()").fetchall())
    name = index_name("toy", DIM)
    assert "USING hnsw" in indexes[name] and "vector_cosine_ops" in indexes[name], indexes
    raw.execute("ANALYZE span_vectors")
    query, params = pg.ann_query("a", None, _unit(_vectors(1, 2)[0]), 5, "toy")
    conn = raw._conn  # bytes SQL: past the `?` rewriting of `raw.execute`
    plan = "\n".join(r[0] for r in conn.execute(b"EXPLAIN " + query.as_bytes(conn), params).fetchall())
    assert f"Index Scan using {name}" in plan, plan
    assert "agent_id = 'a'" in plan, "the agent filter is in SQL"


def test_hnsw_results_equal_the_exact_numpy_ranking(pg: ArchiveBase) -> None:
    vecs = _vectors(300, 3)
    ids = pg.add_evicted_spans("a", _spans(300), vectors=vecs, model="toy")
    for seed in range(5):
        q = _unit(_vectors(1, 100 + seed)[0])
        exact = [ids[i] for i in np.argsort(-(_unit(vecs) @ q))[:10]]
        hits = pg.search_vectors("a", q, k=10, model="toy")
        assert [h.id for h in hits] == exact
        assert [h.score for h in hits] == pytest.approx(sorted((_unit(vecs) @ q).tolist(), reverse=True)[:10],
                                                        abs=1e-5)


def test_a_strangers_nearest_spans_never_come_back_through_hnsw(pg: ArchiveBase) -> None:
    """The index scan walks every agent's vectors; the SQL filter (and the iterative scan) keep the agent's own."""
    q = _unit(_vectors(1, 4)[0])
    pg.add_evicted_spans("team-b/x", _spans(400), vectors=q + 0.01 * _vectors(400, 5), model="toy")
    pg.add_evicted_spans("team-a/x", _spans(30), vectors=-q + 0.5 * _vectors(30, 6), model="toy")
    hits = pg.search_vectors("team-a/x", q, k=20, model="toy")
    assert len(hits) == 20 and {h.agent_id for h in hits} == {"team-a/x"}
    assert {h.agent_id for h in pg.search_vectors(None, q, k=50, model="toy", tenant="team-a/")} == {"team-a/x"}


def test_before_pgvector_0_8_a_short_filtered_scan_is_redone_exactly(pg: ArchiveBase) -> None:
    """Without `hnsw.iterative_scan` (pgvector < 0.8) one index scan may leave fewer than `k` of the agent's rows."""
    import dataclasses

    pg._ann = dataclasses.replace(pg._ann, version="0.7.4")
    q = _unit(_vectors(1, 4)[0])
    pg.add_evicted_spans("team-b/x", _spans(400), vectors=q + 0.01 * _vectors(400, 5), model="toy")
    mine = pg.add_evicted_spans("team-a/x", _spans(30), vectors=-q + 0.5 * _vectors(30, 6), model="toy")
    hits = pg.search_vectors("team-a/x", q, k=20, model="toy")
    assert len(hits) == 20 and {h.id for h in hits} <= set(mine)


def test_without_pgvector_the_archive_falls_back_and_says_so_once(
    postgres_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    with psycopg.connect(postgres_url) as conn:
        if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
            pytest.skip("this server has pgvector: no fallback to see")
    monkeypatch.setattr(pgvector, "_fallback_logged", False)
    with caplog.at_level(logging.INFO, logger="agentmem.archive.pgvector"):
        for _ in range(2):
            with open_archive(postgres_url) as arc:
                assert arc.vector_search == "exact-numpy"
                arc.add_evicted_spans("a", _spans(2), vectors=np.eye(2, DIM, dtype=np.float32), model="toy")
                assert arc.search_vectors("a", np.eye(DIM)[1], k=1, model="toy")[0].text == "span 1"
    said = [r for r in caplog.records if "pgvector is not available" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_archive_written_without_the_column_gets_it_on_opening(pgvector_url: str) -> None:
    """A v6 archive of an agentmem before pgvector (only `vec` blobs) is searched through HNSW once reopened."""
    vecs = _vectors(50, 7)
    with open_archive(pgvector_url) as arc:
        ids = arc.add_evicted_spans("a", _spans(50), vectors=vecs, model="toy")
    raw = raw_connection(arc)
    raw.execute(f"DROP INDEX {index_name('toy', DIM)}")
    raw.execute("ALTER TABLE span_vectors DROP COLUMN embedding")
    with open_archive(pgvector_url, readonly=True) as old:
        assert old.vector_search == "exact-numpy", "a readonly opening changes nothing"
        old.hot_vectors.resize(max_bytes=0)
        assert old.search_vectors("a", vecs[3], k=1, model="toy")[0].id == ids[3]
    with open_archive(pgvector_url) as arc:
        arc.hot_vectors.resize(max_bytes=0)
        assert arc.vector_search == "pgvector-hnsw"
        assert raw.execute("SELECT count(*) FROM span_vectors WHERE embedding IS NULL").fetchone()[0] == 0
        assert raw.execute("SELECT 1 FROM pg_indexes WHERE indexname = ?", [index_name("toy", DIM)]).fetchone()
        assert arc.search_vectors("a", vecs[3], k=1, model="toy")[0].id == ids[3]


# ---------------------------------------------------------------------------------------------- hot partitions


@pytest.fixture
def hot(archive_target: str) -> Iterator[ArchiveBase]:
    with open_archive(archive_target) as arc:
        yield arc


def test_a_hot_agent_is_searched_in_ram_and_counted(hot: ArchiveBase, monkeypatch: pytest.MonkeyPatch) -> None:
    vecs = _vectors(20, 8)
    ids = hot.add_evicted_spans("a", _spans(20), vectors=vecs, model="toy")
    first = hot.search_vectors("a", vecs[5], k=3, model="toy")
    assert hot.vector_stats()["hot_misses"] == 1 and hot.vector_stats()["hot_hits"] == 0
    assert hot.vector_stats()["hot_bytes"] >= 20 * DIM * 4

    def no_reads(*args: object, **kwargs: object) -> None:
        raise AssertionError("a hot agent's vectors were read from the archive")

    monkeypatch.setattr(type(hot), "_ann_search", no_reads)
    monkeypatch.setattr("agentmem.archive.vectors._matrix", no_reads)
    again = hot.search_vectors("a", vecs[5], k=3, model="toy")
    assert [h.id for h in again] == [h.id for h in first] and again[0].id == ids[5]
    assert hot.vector_stats()["hot_hits"] == 1


def test_writes_and_forgetting_drop_the_agents_partition(hot: ArchiveBase) -> None:
    vecs = _vectors(10, 9)
    hot.add_evicted_spans("a", _spans(5), vectors=vecs[:5], model="toy")
    hot.add_evicted_spans("b", _spans(5), vectors=vecs[5:], model="toy")
    hot.search_vectors("a", vecs[0], k=1, model="toy")
    hot.search_vectors("b", vecs[5], k=1, model="toy")
    assert set(hot.hot_vectors.agents()) == {"a", "b"}
    new = hot.add_evicted_spans("a", _spans(1), vectors=vecs[9:], model="toy")
    assert hot.hot_vectors.agents() == ["b"], "a write drops the agent's partition"
    assert hot.search_vectors("a", vecs[9], k=1, model="toy")[0].id == new[0]
    hot.delete_agent("a")
    assert hot.hot_vectors.agents() == ["b"], "a forgotten agent's vectors are gone from RAM too"
    assert hot.search_vectors("a", vecs[9], k=1, model="toy") == []


def test_the_budget_evicts_the_least_recent_unpinned_agent(hot: ArchiveBase) -> None:
    vecs = _vectors(30, 10)
    for n, agent in enumerate("abc"):
        hot.add_evicted_spans(agent, _spans(10), vectors=vecs[10 * n:10 * n + 10], model="toy")
    hot.hot_vectors.resize(max_bytes=2 * 10 * (DIM * 4 + 8))  # two partitions of ten rows
    hot.pin_vectors("a")
    for agent in "abc":
        hot.search_vectors(agent, vecs[0], k=1, model="toy")
    assert sorted(hot.hot_vectors.agents()) == ["a", "c"], "b, least recent unpinned, was evicted; pinned a stays"
    assert hot.vector_stats()["hot_bytes"] <= hot.vector_stats()["hot_max_bytes"]
    hot.hot_vectors.resize(max_bytes=10)
    assert hot.hot_vectors.agents() == [] and hot.search_vectors("a", vecs[0], k=1, model="toy")[0].agent_id == "a"


def test_another_replicas_write_is_seen_through_a_hot_partition(pgvector_url: str) -> None:
    """Replicas share a PostgreSQL archive: a partition cached before another one wrote is not trusted."""
    vecs = _vectors(4, 11)
    with open_archive(pgvector_url) as mine, open_archive(pgvector_url) as theirs:
        mine.add_evicted_spans("a", _spans(2), vectors=vecs[:2], model="toy")
        assert mine.search_vectors("a", vecs[3], k=5, model="toy")
        new = theirs.add_evicted_spans("a", _spans(1), vectors=vecs[3:], model="toy")
        assert mine.search_vectors("a", vecs[3], k=1, model="toy")[0].id == new[0]


def test_recall_stats_name_the_path_and_count_the_hot_partitions(archive_target: str, backend: str) -> None:
    with open_archive(archive_target) as arc:
        idx = RecallIndex(arc, embedder=FunctionEmbedder(lambda t: _vectors(len(t), len(t[0])), name="toy"))
        idx.add("a", _spans(3))
        idx.pin("a")
        idx.search("a", "span 1", 2)
        idx.search("a", "span 2", 2)
        stats = idx.snapshot()
    assert stats["vector_search"] == ("pgvector-hnsw" if backend == "pgvector" else "exact-numpy")
    assert (stats["hot_misses"], stats["hot_hits"], stats["hot_pinned"]) == (1, 1, 1)


def test_replicas_opening_and_writing_together_set_pgvector_up_once(pgvector_url: str) -> None:
    """Regression: replicas writing an embedder's first vectors together deadlocked (CREATE INDEX inside the write
    waited for the other's open insert, which waited for the index's advisory lock); none may fail."""
    import threading

    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def replica(n: int) -> None:
        try:
            barrier.wait()
            with open_archive(pgvector_url) as arc:
                assert arc.vector_search == "pgvector-hnsw"
                arc.add_evicted_spans(f"r{n}", _spans(3), vectors=_vectors(3, n), model="toy")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with open_archive(pgvector_url) as arc:
        raw = raw_connection(arc)
        named = raw.execute("SELECT count(*) FROM pg_indexes WHERE indexname = ?", [index_name("toy", DIM)])
        assert named.fetchone()[0] == 1
        assert raw.execute("SELECT count(*) FROM span_vectors WHERE embedding IS NOT NULL").fetchone()[0] == 12
