"""Contract tests of evicted spans' KV cells (`span_kv`, schema v7), over SQLite and PostgreSQL (`arc`)."""

from __future__ import annotations

import numpy as np
import pytest

from agentmem.archive import ArchiveBase
from agentmem.errors import ConfigError
from tests.fixtures.archives import raw_connection

BLOB = np.arange(300, dtype=np.uint8)


def _spans(arc: ArchiveBase, agent: str = "a") -> list[int]:
    return arc.add_evicted_spans(agent, [(0, 3, "user", "red fox"), (3, 6, "user", "blue jay")])


def test_cells_round_trip_for_their_model_only(arc: ArchiveBase) -> None:
    sid, _ = _spans(arc)
    assert arc.put_span_kv("a", sid, blob=BLOB, pos0=17, tokens=[5, 6, 7], model="m1")
    got = arc.get_span_kv("a", sid, model="m1")
    assert got is not None and (got.span_id, got.pos0, got.tokens) == (sid, 17, (5, 6, 7))
    assert np.array_equal(got.blob, BLOB)
    assert arc.get_span_kv("a", sid, model="m2") is None  # a blob never loads into another layout
    assert arc.stats().tables["span_kv"].payload_bytes == BLOB.size + 3 * 4


def test_a_second_capture_replaces_the_first(arc: ArchiveBase) -> None:
    sid, _ = _spans(arc)
    arc.put_span_kv("a", sid, blob=BLOB, pos0=0, tokens=[1, 2, 3], model="m1")
    arc.put_span_kv("a", sid, blob=BLOB[:10], pos0=4, tokens=[1, 2, 3], model="m2")
    assert arc.get_span_kv("a", sid, model="m1") is None
    got = arc.get_span_kv("a", sid, model="m2")
    assert got is not None and got.pos0 == 4 and got.blob.size == 10


def test_another_agents_span_is_refused_and_not_read(arc: ArchiveBase) -> None:
    sid, _ = _spans(arc, "a")
    assert not arc.put_span_kv("b", sid, blob=BLOB, pos0=0, tokens=[1, 2, 3], model="m1")
    assert not arc.put_span_kv("a", 10_000, blob=BLOB, pos0=0, tokens=[1, 2, 3], model="m1")
    arc.put_span_kv("a", sid, blob=BLOB, pos0=0, tokens=[1, 2, 3], model="m1")
    assert arc.get_span_kv("b", sid, model="m1") is None


def test_cells_go_with_their_agent(arc: ArchiveBase) -> None:
    sid, _ = _spans(arc)
    arc.put_span_kv("a", sid, blob=BLOB, pos0=0, tokens=[1, 2, 3], model="m1")
    arc.delete_agent("a")
    assert raw_connection(arc).execute("SELECT count(*) FROM span_kv").fetchone()[0] == 0


@pytest.mark.parametrize("kwargs, field", [
    ({"blob": np.zeros(0, np.uint8)}, "blob"), ({"pos0": -1}, "pos0"), ({"pos0": True}, "pos0"),
    ({"tokens": []}, "tokens"), ({"tokens": [-1]}, "tokens"),
])
def test_bad_input_is_refused_before_any_write(arc: ArchiveBase, kwargs: dict, field: str) -> None:
    sid, _ = _spans(arc)
    args = {"blob": BLOB, "pos0": 0, "tokens": [1, 2, 3], **kwargs}
    with pytest.raises(ConfigError, match=field):
        arc.put_span_kv("a", sid, model="m1", **args)
    assert arc.get_span_kv("a", sid, model="m1") is None


def test_token_index_lists_one_agents_spans_of_one_model(arc: ArchiveBase) -> None:
    a1, a2 = _spans(arc, "a")
    (b1, _) = _spans(arc, "b")
    arc.put_span_kv("a", a1, blob=BLOB, pos0=0, tokens=[1, 2, 3], model="m1")
    arc.put_span_kv("a", a2, blob=BLOB, pos0=0, tokens=[4, 5], model="m2")
    arc.put_span_kv("b", b1, blob=BLOB, pos0=0, tokens=[6], model="m1")
    assert arc.span_kv_tokens("a", model="m1") == [(a1, (1, 2, 3))]
    assert arc.span_kv_tokens("b", model="m1") == [(b1, (6,))]


def test_keep_drops_the_agents_oldest_cells_only(arc: ArchiveBase) -> None:
    """`put_span_kv(keep=N)` bounds one agent's rows of one model; the text rows and other agents stay."""
    ids = arc.add_evicted_spans("a", [(i, i + 1, "user", f"line {i}") for i in range(5)])
    (b1, _) = _spans(arc, "b")
    arc.put_span_kv("b", b1, blob=BLOB, pos0=0, tokens=[9], model="m1")
    for sid in ids:
        arc.put_span_kv("a", sid, blob=BLOB, pos0=0, tokens=[sid], model="m1", keep=2)
    assert [i for i, _ in arc.span_kv_tokens("a", model="m1")] == ids[-2:]
    assert arc.span_kv_tokens("b", model="m1") == [(b1, (9,))]
    assert len(arc.search_evicted("a", "line", k=10)) == 5
    with pytest.raises(ConfigError, match="keep"):
        arc.put_span_kv("a", ids[0], blob=BLOB, pos0=0, tokens=[1], model="m1", keep=0)


def test_the_token_lists_are_served_from_ram_and_follow_every_write(arc: ArchiveBase) -> None:
    """The pool reads `span_kv_tokens` in every prefill: after the first read it is RAM, kept true by writes."""
    a1, a2 = _spans(arc, "a")
    arc.put_span_kv("a", a1, blob=BLOB, pos0=0, tokens=[1, 2, 3], model="m1")
    first = arc.span_kv_tokens("a", model="m1")
    if not type(arc)._SHARED_WRITERS:
        assert arc.span_kv_tokens("a", model="m1") is first  # no database read
    arc.put_span_kv("a", a2, blob=BLOB, pos0=0, tokens=[4, 5], model="m1")
    assert arc.span_kv_tokens("a", model="m1") == [(a1, (1, 2, 3)), (a2, (4, 5))]
    arc.delete_agent("a")
    assert arc.span_kv_tokens("a", model="m1") == []
    (c1, _) = _spans(arc, "a")  # the same id again: nothing of the deleted agent comes back
    assert arc.span_kv_tokens("a", model="m1") == []


def test_another_writers_rows_are_seen_where_writers_share_the_archive(arc: ArchiveBase) -> None:
    """PostgreSQL replicas: a row written by another process is listed (the cache's token changed)."""
    if not type(arc)._SHARED_WRITERS:
        pytest.skip("one writer per SQLite archive: its own writes keep the list true")
    a1, a2 = _spans(arc, "a")
    arc.put_span_kv("a", a1, blob=BLOB, pos0=0, tokens=[1], model="m1")
    assert len(arc.span_kv_tokens("a", model="m1")) == 1
    con = raw_connection(arc)
    con.execute("INSERT INTO span_kv(span_id, agent_id, model, pos0, n_tokens, tokens, blob) "
                "VALUES (?, 'a', 'm1', 0, 1, ?, ?)", [a2, np.array([2], "<i4").tobytes(), BLOB.tobytes()])
    assert [i for i, _ in arc.span_kv_tokens("a", model="m1")] == [a1, a2]
