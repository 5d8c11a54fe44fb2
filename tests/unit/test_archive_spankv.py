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
