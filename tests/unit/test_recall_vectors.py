"""The archive's span vectors (#34): same transaction, agent and tenant filters, backfill.

Each test runs on SQLite, on PostgreSQL without pgvector (Debian's: the exact numpy
fallback) and on PostgreSQL with pgvector (HNSW), each with the hot partitions in RAM
on and off (off: every search goes to the archive's own path).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from agentmem.archive import ArchiveBase, open_archive
from agentmem.errors import ConfigError
from tests.fixtures.archives import VECTOR_BACKENDS, raw_connection

E = np.eye(4, dtype=np.float32)


@pytest.fixture(params=VECTOR_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """sqlite, postgres (no pgvector) and pgvector."""
    return str(request.param)


@pytest.fixture(params=["ram", "archive"])
def arc(archive_target: str, backend: str, request: pytest.FixtureRequest) -> Iterator[ArchiveBase]:
    """An open archive; `archive`: with no hot partitions, so searches take the backend's path."""
    with open_archive(archive_target) as archive:
        assert archive.vector_search == ("pgvector-hnsw" if backend == "pgvector" else "exact-numpy")
        if request.param == "archive":
            archive.hot_vectors.resize(max_bytes=0)
        yield archive


def _span(i: int, text: str) -> tuple[int, int, str, str]:
    return (10 * i, 10 * i + 8, "user", text)


def test_vectors_are_searched_by_cosine_best_first(arc: ArchiveBase) -> None:
    arc.add_evicted_spans("a", [_span(0, "north"), _span(1, "east"), _span(2, "south")], vectors=3 * E[:3], model="toy")
    hits = arc.search_vectors("a", [0.1, 0.9, 0.0, 0.0], k=2, model="toy")
    assert [h.text for h in hits] == ["east", "north"]
    assert hits[0].score == pytest.approx(0.9 / np.hypot(0.1, 0.9), rel=1e-5)
    assert arc.search_vectors("a", [0.1, 0.9, 0.0, 0.0], k=5, model="toy", min_similarity=0.5)[0].text == "east"
    assert len(arc.search_vectors("a", [0.1, 0.9, 0.0, 0.0], k=5, model="toy", min_similarity=0.5)) == 1


def test_a_failed_vector_write_leaves_no_span(arc: ArchiveBase, monkeypatch: pytest.MonkeyPatch) -> None:
    """Span and vector share one transaction: when the vector's insert fails, the span is not archived either."""
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(type(arc), "_write_vectors", broken)
    with pytest.raises(Exception, match="disk on fire"):
        arc.add_evicted_spans("a", [_span(0, "north")], vectors=E[:1], model="toy")
    monkeypatch.undo()
    assert arc.list_evicted("a") == []
    assert raw_connection(arc).execute("SELECT count(*) FROM span_vectors").fetchone()[0] == 0


def test_bad_vectors_are_refused_before_any_write(arc: ArchiveBase) -> None:
    with pytest.raises(ConfigError, match="vectors need model"):
        arc.add_evicted_spans("a", [_span(0, "x")], vectors=E[:1])
    with pytest.raises(ConfigError, match="2-D matrix of 2 rows"):
        arc.add_evicted_spans("a", [_span(0, "x"), _span(1, "y")], vectors=E[:1], model="toy")
    with pytest.raises(ConfigError, match="zero vector"):
        arc.add_evicted_spans("a", [_span(0, "x")], vectors=np.zeros((1, 4)), model="toy")
    with pytest.raises(ConfigError, match="NaN"):
        arc.add_evicted_spans("a", [_span(0, "x")], vectors=np.full((1, 4), np.nan), model="toy")
    assert arc.list_evicted("a") == []


def test_another_agents_or_tenants_spans_are_never_returned(arc: ArchiveBase) -> None:
    for agent in ("team-a/planner", "team-a/coder", "team-b/planner", "team-ab"):
        arc.add_evicted_spans(agent, [_span(0, f"{agent} secret")], vectors=E[:1], model="toy")
    q = E[0]
    assert [h.agent_id for h in arc.search_vectors("team-a/planner", q, k=10, model="toy")] == ["team-a/planner"]
    tenant = {h.agent_id for h in arc.search_vectors(None, q, k=10, model="toy", tenant="team-a/")}
    assert tenant == {"team-a/planner", "team-a/coder"}
    assert arc.search_vectors("team-b/planner", q, k=10, model="toy", tenant="team-a/") == []
    with pytest.raises(ConfigError, match="agent_id or tenant"):
        arc.search_vectors(None, q, k=10, model="toy")


def test_vectors_of_another_embedder_are_not_compared(arc: ArchiveBase) -> None:
    arc.add_evicted_spans("a", [_span(0, "x")], vectors=E[:1], model="toy")
    assert arc.search_vectors("a", E[0], k=3, model="other") == []
    assert arc.spans_without_vectors("a", model="other") == [(arc.list_evicted("a")[0].id, "x")]
    with pytest.raises(ConfigError, match="not 3-d"):
        arc.search_vectors("a", [1.0, 0.0, 0.0], k=3, model="toy")


def test_spans_archived_without_vectors_are_backfilled(arc: ArchiveBase) -> None:
    ids = arc.add_evicted_spans("a", [_span(0, "north"), _span(1, "east")])
    other = arc.add_evicted_spans("b", [_span(0, "west")])
    todo = arc.spans_without_vectors("a", model="toy")
    assert todo == [(ids[0], "north"), (ids[1], "east")]
    # another agent's span id is skipped, never given a vector under "a"
    assert arc.add_span_vectors("a", [*ids, other[0]], E[:3], model="toy") == 2
    assert arc.spans_without_vectors("a", model="toy") == []
    assert arc.spans_without_vectors("b", model="toy") == [(other[0], "west")]
    assert arc.search_vectors("a", E[1], k=1, model="toy")[0].text == "east"


def test_vectors_go_with_their_agent(arc: ArchiveBase) -> None:
    arc.add_evicted_spans("a", [_span(0, "x")], vectors=E[:1], model="toy")
    arc.delete_agent("a")
    assert raw_connection(arc).execute("SELECT count(*) FROM span_vectors").fetchone()[0] == 0
    assert arc.stats().tables["span_vectors"].rows == 0


def test_vectors_survive_reopening(archive_target: str) -> None:
    with open_archive(archive_target) as arc:
        arc.add_evicted_spans("a", [_span(0, "north"), _span(1, "east")], vectors=E[:2], model="toy")
    with open_archive(archive_target) as arc:
        assert arc.search_vectors("a", E[1], k=1, model="toy")[0].text == "east"
        assert arc.stats().tables["span_vectors"].payload_bytes == 2 * 4 * 4
