"""Contract tests of the archive's API (agentmem.archive), run over SQLite and PostgreSQL.

`arc` (tests/fixtures/archives.py) is a fresh archive of each backend; the
PostgreSQL one lives on a real server the session starts. Tests of what only one
backend has (SQLite pragmas, FTS5 and its LIKE fallback, values only SQLite's
untyped columns hold) use `sqlite_arc` or build their archive themselves.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agentmem.archive import MIGRATIONS, SCHEMA_VERSION, Archive, PostgresArchive, checksum, open_archive
from agentmem.archive import connection as archive_mod
from agentmem.errors import AgentMemError, ArchiveError, CodecError, ConfigError, FingerprintMismatch, StateError
from tests.fixtures.archives import raw_connection

FP = {"model": "gemma-3-270m-q4_k_m", "type_k": "f16", "type_v": "f16", "swa_full": True}


@pytest.fixture
def sqlite_arc(tmp_path: Path):
    """A SQLite archive, for the tests of what only that backend has."""
    with Archive(tmp_path / "agents.db") as archive:
        yield archive


def _raw(archive: Archive):
    """A second, independent connection for tampering with the database (`?` placeholders)."""
    return raw_connection(archive)


# ------------------------------------------------------------------ opening


def test_fresh_archive_has_current_schema_and_pragmas(sqlite_arc: Archive) -> None:
    arc = sqlite_arc
    assert arc.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
    conn = arc._conn
    assert conn is not None
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    tables = set(arc._db.table_names())  # type: ignore[union-attr]
    assert {"meta", "agents", "ledgers", "states", "events", "evicted_spans", "shared_blocks"} <= tables
    assert arc.fts_enabled and "evicted_spans_fts" in tables


def test_synchronous_full_is_applied(tmp_path: Path) -> None:
    with Archive(tmp_path / "a.db", synchronous="FULL") as a:
        assert a._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="synchronous"):
        Archive(tmp_path / "b.db", synchronous="OFF")  # type: ignore[arg-type]


def test_memory_archive_works_without_file() -> None:
    with Archive(":memory:") as a:
        a.put_ledger("x", [1, 2, 3], [])
        assert a.get_ledger("x").n_tokens == 3
        assert a.stats().file_bytes > 0


def test_close_is_idempotent_and_later_calls_fail(archive_target: str) -> None:
    a = open_archive(archive_target)
    a.close()
    a.close()
    assert a.closed
    with pytest.raises(ArchiveError, match="closed"):
        a.list_agents()
    # the lock went with it
    open_archive(archive_target).close()


# ------------------------------------------------------------------ agents


def test_put_agent_creates_and_updates_selectively(arc: Archive) -> None:
    arc.put_agent("planner", priority="foreground", labels={"team": "blue"})
    rec = arc.get_agent("planner")
    assert rec is not None
    assert (rec.priority, rec.labels) == ("foreground", {"team": "blue"})
    created = rec.created
    arc.put_agent("planner", labels={"team": "red"})  # priority kept
    rec = arc.get_agent("planner")
    assert (rec.priority, rec.labels, rec.created) == ("foreground", {"team": "red"}, created)
    assert rec.updated >= created
    arc.put_agent("planner", priority=3)
    assert arc.get_agent("planner").priority == 3  # ints stay ints
    arc.put_agent("bare")
    bare = arc.get_agent("bare")
    assert (bare.priority, bare.labels, bare.tier, bare.codec, bare.n_bytes) == (0, {}, None, None, 0)
    assert arc.get_agent("nobody") is None


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_agent_id_is_rejected(arc: Archive, bad: object) -> None:
    with pytest.raises(TypeError, match="agent_id"):
        arc.put_agent(bad)  # type: ignore[arg-type]


def test_list_agents_reports_tokens_tier_codec_bytes(arc: Archive) -> None:
    arc.put_ledger("b", np.arange(100, dtype=np.int32), [(0, 100, "user", 0)])
    arc.put_state("b", b"x" * 1000, codec="q8_0", n_tokens=100, fingerprint=FP, tier="warm")
    arc.put_agent("a")
    a, b = arc.list_agents()
    assert a.agent_id == "a" and a.ledger_tokens == 0 and a.tier is None
    assert (b.agent_id, b.ledger_tokens, b.tier, b.codec, b.state_tokens, b.state_bytes) == (
        "b",
        100,
        "warm",
        "q8_0",
        100,
        1000,
    )
    assert b.ledger_bytes == 400 + len('[[0,100,"user",0]]') and b.n_bytes == b.ledger_bytes + 1000


# ------------------------------------------------------------------ ledgers


@pytest.mark.parametrize("stored", ["{not json", "[1, 2]", "5", "null"])
def test_corrupt_labels_read_as_empty_with_a_warning(arc: Archive, caplog, stored: str) -> None:
    """Issue #13 item 6: a corrupt agent row's `labels` (not JSON, or JSON but not an object)
    made `list_agents()`/`get_agent()` raise, so the pool could not open the archive and
    `agentmem archive ls` printed a traceback."""
    arc.put_agent("bad", labels={"team": "a"})
    arc.put_agent("good", labels={"team": "b"})
    _raw(arc).execute("UPDATE agents SET labels = ? WHERE id = 'bad'", [stored])
    with caplog.at_level(logging.WARNING, logger="agentmem.archive.agents"):
        agents = {r.agent_id: r.labels for r in arc.list_agents()}
        assert agents == {"bad": {}, "good": {"team": "b"}}
        assert arc.get_agent("bad").labels == {}  # type: ignore[union-attr]
    assert "labels of agent 'bad'" in caplog.text and "empty labels" in caplog.text


def test_search_k_must_be_a_non_negative_int(arc: Archive) -> None:
    """Issue #13 item 6: `search_evicted(k=-1)` raised a plain `ValueError`, not a typed error."""
    _fill_spans(arc)
    for bad in (-1, True, 2.5, "3"):
        with pytest.raises(ConfigError, match="k must be"):
            arc.search_evicted("coder", "ACME", k=bad)  # type: ignore[arg-type]


def test_ledger_roundtrip(arc: Archive) -> None:
    tokens = np.array([0, 1, -5, 2**31 - 1, 262143], dtype=np.int64)
    regions = [(0, 2, "system", 1), (2, 5, "tool_result", 0)]
    messages = [{"role": "system", "content": "Be brief. ünïcødé"}, {"role": "tool", "content": "42", "pin": True}]
    arc.put_ledger("a", tokens, regions, messages)
    led = arc.get_ledger("a")
    assert led is not None
    assert led.tokens.dtype == np.int32 and led.tokens.flags.writeable
    np.testing.assert_array_equal(led.tokens, tokens)
    assert led.regions == regions and led.messages == messages and led.n_tokens == 5
    # stored as int32 little-endian bytes
    raw = _raw(arc).execute("SELECT tokens FROM ledgers").fetchone()[0]
    assert raw == tokens.astype("<i4").tobytes()
    arc.put_ledger("a", [7], [], None)  # replaces
    led = arc.get_ledger("a")
    assert led.tokens.tolist() == [7] and led.regions == [] and led.messages is None
    assert arc.get_ledger("none") is None
    assert arc.delete_ledger("a") and not arc.delete_ledger("a")


@pytest.mark.parametrize(
    ("tokens", "regions", "messages", "exc", "match"),
    [
        (np.zeros((2, 2), np.int32), [], None, ValueError, "1-D"),
        (np.zeros(3, np.float32), [], None, TypeError, "integers"),
        ([2**40], [], None, ValueError, "int32"),
        ([1, 2], [(0, 3, "user", 0)], None, ValueError, "outside"),
        ([1, 2], [(2, 1, "user", 0)], None, ValueError, "reversed"),
        ([1, 2], [(0, 1, "user")], None, ValueError, "regions\\[0\\]"),
        ([1, 2], [(0, 1, 5, 0)], None, TypeError, "region must be a str"),
        ([1, 2], [], [{"content": object()}], TypeError, "JSON"),
    ],
)
def test_bad_ledgers_are_rejected(arc: Archive, tokens, regions, messages, exc, match) -> None:
    with pytest.raises(exc, match=match):
        arc.put_ledger("a", tokens, regions, messages)
    assert arc.get_ledger("a") is None


# ------------------------------------------------------------------ states


@pytest.mark.parametrize(
    "blob",
    [
        b"\x01\x02" * 5000,
        memoryview(bytearray(b"abc" * 999)),
        np.arange(4096, dtype=np.float16),
        np.arange(64, dtype=np.int8)[::2],  # non-contiguous array
        memoryview(np.arange(100, dtype=np.float32).reshape(10, 10)),  # typed, 2-D
        memoryview(np.arange(100, dtype=np.int16))[::3],  # non-contiguous view
        b"",
    ],
    ids=["bytes", "memoryview", "ndarray", "strided", "mv-2d", "mv-strided", "empty"],
)
def test_state_roundtrip(arc: Archive, blob) -> None:
    expected = (
        np.ascontiguousarray(blob).tobytes()
        if isinstance(blob, np.ndarray)
        else blob.tobytes()
        if isinstance(blob, memoryview)
        else bytes(blob)
    )
    info = arc.put_state("a", blob, codec="f16", n_tokens=12, fingerprint=FP)
    assert info.checksum == "sha256:" + hashlib.sha256(expected).hexdigest() == checksum(expected)
    st = arc.get_state("a")
    assert st is not None
    assert st.blob == expected and st.n_bytes == len(expected)
    assert (st.codec, st.n_tokens, st.tier, st.fingerprint) == ("f16", 12, "cold", FP)
    meta = arc.get_state_info("a")
    assert meta == info


def test_state_replace_and_delete(arc: Archive) -> None:
    arc.put_state("a", b"one", codec="f16", n_tokens=1, fingerprint=FP)
    arc.put_state("a", b"two!", codec="q4_0", n_tokens=2, fingerprint=FP)
    st = arc.get_state("a")
    assert (st.blob, st.codec, st.n_tokens) == (b"two!", "q4_0", 2)
    assert arc.delete_state("a") and not arc.delete_state("a")
    assert arc.get_state("a") is None and arc.get_state_info("a") is None
    assert arc.get_agent("a") is not None  # the agent stays


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"codec": "", "n_tokens": 1, "fingerprint": FP}, TypeError),
        ({"codec": "f16", "n_tokens": -1, "fingerprint": FP}, ValueError),
        ({"codec": "f16", "n_tokens": 1, "fingerprint": {"x": object()}}, TypeError),
        ({"codec": "f16", "n_tokens": 1, "fingerprint": ["not", "a", "dict"]}, TypeError),
    ],
)
def test_bad_state_arguments(arc: Archive, kwargs, exc) -> None:
    with pytest.raises(exc):
        arc.put_state("a", b"kv", **kwargs)


def test_corrupted_blob_is_detected_by_checksum(arc: Archive) -> None:
    blob = bytes(range(256)) * 100
    arc.put_state("a", blob, codec="f16", n_tokens=10, fingerprint=FP)
    flipped = bytearray(blob)
    flipped[1234] ^= 0x01
    _raw(arc).execute("UPDATE states SET blob = ? WHERE agent_id = 'a'", [bytes(flipped)])
    with pytest.raises(CodecError, match="checksum") as info:
        arc.get_state("a")
    assert isinstance(info.value, StateError)  # the pool's cache-miss family
    assert arc.path in str(info.value) and "'a'" in str(info.value)
    assert arc.get_state_info("a") is not None  # metadata still readable


def test_truncated_blob_is_detected(arc: Archive) -> None:
    arc.put_state("a", b"k" * 5000, codec="f16", n_tokens=10, fingerprint=FP)
    _raw(arc).execute("UPDATE states SET blob = substr(blob, 1, 2500)")
    with pytest.raises(CodecError, match="truncated: 2500 bytes stored, 5000 expected"):
        arc.get_state("a")


def test_a_text_blob_is_detected(sqlite_arc: Archive) -> None:
    """SQLite only: its untyped columns can hold text where a blob belongs (bytea cannot)."""
    arc = sqlite_arc
    arc.put_state("a", b"k" * 5000, codec="f16", n_tokens=10, fingerprint=FP)
    _raw(arc).execute("UPDATE states SET blob = 'text'")
    with pytest.raises(CodecError, match="holds str"):
        arc.get_state("a")


def test_unknown_checksum_algorithm_is_a_codec_error(arc: Archive) -> None:
    arc.put_state("a", b"kv", codec="f16", n_tokens=1, fingerprint=FP)
    _raw(arc).execute("UPDATE states SET checksum = 'md17:00'")
    with pytest.raises(CodecError, match="unknown algorithm"):
        arc.get_state("a")


def test_fingerprint_check(arc: Archive) -> None:
    arc.put_state("a", b"kv", codec="f16", n_tokens=1, fingerprint={**FP, "layers": (18, 1)})
    assert arc.get_state("a", fingerprint={**FP, "layers": [18, 1]}) is not None  # tuple == list
    with pytest.raises(FingerprintMismatch, match="type_k: stored 'f16' != current 'q8_0'"):
        arc.get_state("a", fingerprint={**FP, "layers": [18, 1], "type_k": "q8_0"})


# ------------------------------------------------------------------ transactions


def test_transaction_commits_ledger_and_state_together(arc: Archive) -> None:
    with arc.transaction() as t:
        assert t is arc
        arc.put_ledger("a", [1, 2], [(0, 2, "user", 0)])
        arc.put_state("a", b"kv", codec="f16", n_tokens=2, fingerprint=FP)
        # not visible to another connection before commit
        assert _raw(arc).execute("SELECT count(*) FROM states").fetchone()[0] == 0
    assert _raw(arc).execute("SELECT count(*) FROM states").fetchone()[0] == 1


def test_transaction_rolls_back_everything_on_error(arc: Archive) -> None:
    arc.put_ledger("a", [1], [])
    with pytest.raises(RuntimeError, match="boom"), arc.transaction():
        arc.put_ledger("a", [1, 2, 3], [])
        arc.put_state("a", b"kv", codec="f16", n_tokens=3, fingerprint=FP)
        arc.put_agent("new")
        raise RuntimeError("boom")
    assert arc.get_ledger("a").n_tokens == 1
    assert arc.get_state("a") is None and arc.get_agent("new") is None


def test_nested_transaction_is_a_savepoint(arc: Archive) -> None:
    with arc.transaction():
        arc.put_agent("outer")
        with pytest.raises(KeyError), arc.transaction():
            arc.put_agent("inner")
            raise KeyError("x")
    assert arc.get_agent("outer") is not None and arc.get_agent("inner") is None


def test_threads_serialise_on_one_archive(arc: Archive) -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(20):
                with arc.transaction():
                    arc.put_ledger(f"t{i}", np.arange(j + 1), [])
                    arc.put_state(f"t{i}", bytes([j]) * 1000, codec="f16", n_tokens=j + 1, fingerprint=FP)
                assert arc.get_state(f"t{i}").n_tokens == j + 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [a.state_tokens for a in arc.list_agents()] == [20] * 4


# ------------------------------------------------------------------ deleting


def test_delete_agent_cascades(arc: Archive) -> None:
    with arc.transaction():
        arc.put_ledger("a", [1, 2], [])
        arc.put_state("a", b"kv", codec="f16", n_tokens=2, fingerprint=FP)
        arc.log_event("a", "park")
        arc.add_evicted_span("a", 0, 2, "user", "remember the zebra password")
        arc.put_ledger("b", [3], [])
        arc.log_event("b", "park")
        arc.add_evicted_span("b", 0, 1, "user", "another zebra")
    assert arc.delete_agent("a") is True
    assert arc.delete_agent("a") is False
    assert arc.get_agent("a") is None and arc.get_ledger("a") is None and arc.get_state("a") is None
    assert arc.events("a") == [] and arc.list_evicted("a") == []
    conn = _raw(arc)
    if isinstance(arc, PostgresArchive):  # the tsvector is a column of the row itself: gone with it
        assert conn.execute("SELECT count(*) FROM evicted_spans WHERE tsv @@ plainto_tsquery('english', 'zebra')").fetchone()[0] == 1
    else:  # the FTS index lost the row too (its trigger fired on the cascade)
        assert (
            conn.execute("SELECT count(*) FROM evicted_spans_fts WHERE evicted_spans_fts MATCH 'zebra'").fetchone()[0] == 1
        )
    assert [s.agent_id for s in arc.search_evicted(None, "zebra")] == ["b"]
    assert len(arc.events("b")) == 1


# ------------------------------------------------------------------ events


def test_events_newest_first_with_filters(arc: Archive) -> None:
    for i in range(5):
        arc.log_event("a", "park" if i % 2 else "restore", i=i)
    arc.log_event(None, "pool_start", n_seq=4)
    arc.log_event("b", "park", obj=object())  # not JSON: stored as repr
    evs = arc.events()
    assert [e.kind for e in evs][:2] == ["park", "pool_start"]
    assert evs[0].data["obj"].startswith("<object object")
    assert [e.data["i"] for e in arc.events("a")] == [4, 3, 2, 1, 0]
    assert [e.data["i"] for e in arc.events("a", kind="park")] == [3, 1]
    assert len(arc.events(limit=2)) == 2
    assert arc.events(None)[1].agent_id is None
    assert arc.prune_events(keep_last=3) == 4
    assert [e.kind for e in arc.events()] == ["park", "pool_start", "restore"]
    assert arc.prune_events(keep_last=10) == 0


# ------------------------------------------------------------------ evicted text / FTS


def _fill_spans(arc: Archive) -> None:
    arc.add_evicted_spans(
        "coder",
        [
            (0, 40, "tool_result", "The invoice total for ACME Corp was 1234 EUR, due on Friday."),
            (40, 80, "assistant", "I will now refactor the parser module."),
            (80, 120, "user", "Please remember: the deploy key is stored in vault path kv/deploy."),
            (120, 160, "tool_result", "Invoices from ACME are paid by bank transfer."),
        ],
    )
    arc.add_evicted_span("reviewer", 0, 10, "user", "ACME invoice review pending")


def test_search_ranks_by_relevance_and_filters_by_agent(arc: Archive) -> None:
    _fill_spans(arc)
    hits = arc.search_evicted("coder", "ACME invoice total", k=5)
    assert [h.start for h in hits] == [0, 120]  # both ACME+invoice(s); the first also has "total"
    assert hits[0].score > hits[1].score > 0
    assert hits[0].region == "tool_result" and hits[0].end == 40
    assert all(h.agent_id == "coder" for h in hits)
    assert {h.agent_id for h in arc.search_evicted(None, "ACME", k=10)} == {"coder", "reviewer"}
    assert len(arc.search_evicted(None, "ACME", k=1)) == 1
    assert arc.search_evicted("coder", "deploy key")[0].start == 80
    assert arc.search_evicted("nobody", "ACME") == []


def test_search_uses_stemming(arc: Archive) -> None:
    _fill_spans(arc)
    assert {h.start for h in arc.search_evicted("coder", "invoices")} == {0, 120}
    assert [h.start for h in arc.search_evicted("coder", "refactoring")] == [40]


HOSTILE = [
    '"',
    '"""',
    'ACME"',
    "'; DROP TABLE agents; --",
    "NEAR(ACME invoice, 2)",
    "ACME AND OR NOT",
    "NOT",
    "*",
    "invoice*",
    "-ACME",
    "^ACME",
    "text: ACME",
    "coder:ACME",
    "{text}: ACME",
    "(((",
    "ACME + + invoice",
    "\x00ACME",
    "🦓 ACME ☃",
    "a" * 5000,
    " ".join(["word"] * 1000),
    "",
    "   ",
    "%_\\",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_never_raise(arc: Archive, query: str) -> None:
    _fill_spans(arc)
    hits = arc.search_evicted("coder", query, k=3)
    assert len(hits) <= 3
    if "ACME" in query:
        assert hits, f"{query!r} should still find ACME"
    assert arc.get_agent("coder") is not None  # nothing was dropped


def test_search_k_zero_and_negative(arc: Archive) -> None:
    _fill_spans(arc)
    assert arc.search_evicted("coder", "ACME", k=0) == []
    with pytest.raises(ValueError):
        arc.search_evicted("coder", "ACME", k=-1)


def test_bad_evicted_spans_are_rejected(arc: Archive) -> None:
    with pytest.raises(ValueError):
        arc.add_evicted_span("a", 5, 2, "user", "x")
    with pytest.raises(TypeError):
        arc.add_evicted_span("a", 0, 2, "user", None)  # type: ignore[arg-type]
    assert arc.list_evicted("a") == []


def test_like_fallback_without_fts5(tmp_path: Path, monkeypatch, caplog) -> None:
    path = tmp_path / "a.db"
    with Archive(path) as a:  # created with FTS5
        _fill_spans(a)
    monkeypatch.setattr(archive_mod, "_fts5_available", lambda conn: False)
    with caplog.at_level(logging.WARNING, logger="agentmem.archive.connection"):
        a = Archive(path)
    assert "falls back to LIKE" in caplog.text
    with a:
        assert not a.fts_enabled
        # inserts still work: the FTS sync triggers were dropped
        a.add_evicted_span("coder", 200, 210, "user", "zebra crossing at ACME")
        hits = a.search_evicted("coder", "ACME invoice total", k=10)
        assert [h.start for h in hits][:1] == [0] and {h.start for h in hits} == {0, 120, 200}
        assert hits[0].score == 3.0 and hits[1].score == 2.0
        assert a.search_evicted("coder", "%") == [] and a.search_evicted("coder", "_") == []
        for q in HOSTILE:
            a.search_evicted("coder", q)
    monkeypatch.undo()
    with Archive(path) as a:  # FTS5 back: the index is rebuilt and includes the new row
        assert a.fts_enabled
        assert [h.start for h in a.search_evicted("coder", "zebra")] == [200]


def test_fresh_archive_without_fts5(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(archive_mod, "_fts5_available", lambda conn: False)
    with Archive(tmp_path / "a.db") as a:
        _fill_spans(a)
        assert not a.fts_enabled and "evicted_spans_fts" not in a._db.table_names()  # type: ignore[union-attr]
        assert a.search_evicted("reviewer", "review")[0].agent_id == "reviewer"


# ------------------------------------------------------------------ shared blocks


def test_shared_block_refcounts(arc: Archive) -> None:
    info = arc.put_shared_block("sys", b"shared-kv", n_tokens=9, fingerprint=FP)
    assert (info.refcount, info.n_tokens, info.n_bytes) == (0, 9, 9)
    assert arc.incref_shared_block("sys") == 1
    assert arc.incref_shared_block("sys", 2) == 3
    arc.put_shared_block("sys", b"shared-kv2", n_tokens=10, fingerprint=FP)  # refcount kept
    blk = arc.get_shared_block("sys")
    assert (blk.refcount, blk.blob, blk.n_tokens) == (3, b"shared-kv2", 10)
    assert arc.decref_shared_block("sys", 3) == 0
    with pytest.raises(ArchiveError, match="refcount 0"):
        arc.decref_shared_block("sys")
    assert arc.list_shared_blocks()[0].refcount == 0  # unchanged, never negative
    with pytest.raises(ArchiveError, match="no shared block"):
        arc.incref_shared_block("nope")
    assert arc.get_shared_block("nope") is None
    arc.put_shared_block("keep", b"x", n_tokens=1, fingerprint=FP)
    arc.incref_shared_block("keep")
    assert arc.gc_shared_blocks() == 1
    assert [b.block_id for b in arc.list_shared_blocks()] == ["keep"]
    raw = _raw(arc)
    with pytest.raises(raw.IntegrityError):  # the schema itself forbids negatives
        raw.execute("UPDATE shared_blocks SET refcount = -1")


def test_corrupt_shared_block_is_detected(arc: Archive) -> None:
    arc.put_shared_block("sys", b"shared-kv", n_tokens=9, fingerprint=FP)
    _raw(arc).execute("UPDATE shared_blocks SET blob = ?", [b"shared-kw"])
    with pytest.raises(CodecError, match="shared block 'sys' is corrupt: checksum"):
        arc.get_shared_block("sys")


def test_a_text_shared_block_is_detected(sqlite_arc: Archive) -> None:
    """SQLite only: text where a blob belongs (bytea cannot hold it)."""
    arc = sqlite_arc
    arc.put_shared_block("sys", b"shared-kv", n_tokens=9, fingerprint=FP)
    _raw(arc).execute("UPDATE shared_blocks SET blob = 'text, not a blob'")
    with pytest.raises(CodecError, match="holds str"):
        arc.get_shared_block("sys")


# ------------------------------------------------------------------ maintenance


def test_stats_and_vacuum(arc: Archive) -> None:
    rng = np.random.default_rng(0)
    for i in range(4):
        arc.put_state(f"a{i}", rng.bytes(500_000), codec="f16", n_tokens=10, fingerprint=FP)
    arc.log_event("a0", "x")
    st = arc.stats()
    assert st.tables["states"].rows == 4
    assert 2_000_000 <= st.tables["states"].payload_bytes < 2_010_000
    assert st.tables["events"].rows == 1 and st.schema_version == SCHEMA_VERSION and st.fts
    assert st.file_bytes >= 2_000_000
    for i in range(4):
        arc.delete_agent(f"a{i}")
    res = arc.vacuum()
    assert res.bytes_before >= 2_000_000 > res.bytes_after
    assert arc.stats().file_bytes == res.bytes_after
    with arc.transaction(), pytest.raises(ArchiveError, match="inside a transaction"):
        arc.vacuum()


def test_sqlite_errors_become_archive_errors(sqlite_arc: Archive) -> None:
    arc = sqlite_arc
    arc._conn.execute("DROP TABLE events")  # type: ignore[union-attr]
    with pytest.raises(ArchiveError, match=r"agents\.db: log_event failed: no such table"):
        arc.log_event("a", "x")
    assert isinstance(ArchiveError("x"), AgentMemError)


def test_state_with_an_unknown_block_is_refused_and_the_old_state_kept(arc: Archive) -> None:
    with arc as a:
        a.put_state("x", b"old", codec="f16", n_tokens=1, fingerprint={})
        with pytest.raises(ArchiveError, match="no shared block 'nope'"):
            a.put_state("x", b"new", codec="f16", n_tokens=2, fingerprint={}, block_id="nope", layout=b"\0" * 4)
        assert a.get_state("x").blob == b"old"
        with pytest.raises(ArchiveError, match="no stored state to checkpoint"):
            a.put_checkpoint("ghost", b"c", prompt_end=(1, 1))
        a.put_shared_block("blk", b"kv", n_tokens=3, fingerprint={})
        a.put_state("x", b"new", codec="f16", n_tokens=2, fingerprint={}, block_id="blk", layout=b"\0" * 4)
        a.put_checkpoint("x", b"ck", prompt_end=(2, 2))
        assert a.list_shared_blocks()[0].refcount == 1 and a.get_checkpoint("x")[2] == (2, 2)
        a.put_state("x", b"plain", codec="f16", n_tokens=2, fingerprint={})  # no block, no checkpoint any more
        assert a.list_shared_blocks() == [] and a.get_checkpoint("x") is None


def test_restoring_a_state_on_the_same_block_keeps_the_block(arc: Archive) -> None:
    """Bug: re-storing a state that references the same shared block deleted the old
    reference first; the unref trigger dropped the block (refcount 0) and the new state was
    refused with "no shared block" — a second checkpoint of a share agent failed."""
    with Archive(":memory:") as a:
        a.put_shared_block("blk", b"kv", n_tokens=3, fingerprint={})
        a.put_state("x", b"one", codec="f16", n_tokens=4, fingerprint={}, block_id="blk", layout=b"\0" * 4)
        a.put_state("x", b"two", codec="f16", n_tokens=5, fingerprint={}, block_id="blk", layout=b"\1" * 4)
        assert a.get_state("x").blob == b"two"
        assert [(b.block_id, b.refcount) for b in a.list_shared_blocks()] == [("blk", 1)]
        assert a.state_blocks() == {"x": "blk"}
        a.put_shared_block("other", b"kv2", n_tokens=3, fingerprint={})
        a.put_state("x", b"three", codec="f16", n_tokens=5, fingerprint={}, block_id="other", layout=b"\0" * 4)
        assert [(b.block_id, b.refcount) for b in a.list_shared_blocks()] == [("other", 1)]


def test_archive_package_exports_are_pinned() -> None:
    import agentmem.archive

    assert sorted(agentmem.archive.__all__) == sorted(
        [
            "MIGRATIONS", "SCHEMA_VERSION", "AgentRecord", "Archive", "ArchiveBase", "ArchiveStats", "EventRecord",
            "EvictedSpan", "Lease", "LeaseEvent", "LedgerRecord", "PostgresArchive", "SharedBlock",
            "SharedBlockInfo", "StateInfo", "StoredState", "TableStats", "VacuumResult", "checksum", "open_archive",
        ]
    )
    assert all(hasattr(agentmem.archive, name) for name in agentmem.archive.__all__)


# ------------------------------------------------------------------ values SQLite cannot hold

BAD = "a\ud800b"  # a lone surrogate: a str that has no UTF-8 encoding
HUGE = 10**30  # beyond SQLite's 64-bit INTEGER


def _writes_of_unstorable_values() -> list[tuple[str, Callable[[Archive], object]]]:
    toks = np.arange(3, dtype=np.int32)
    return [
        ("agent_id", lambda a: a.put_agent(BAD)),
        ("priority", lambda a: a.put_agent("a", priority=HUGE)),
        ("priority", lambda a: a.put_agent("a", priority=-(2**63) - 1)),
        ("priority", lambda a: a.put_agent("a", priority=BAD)),
        ("labels", lambda a: a.put_agent("a", labels={"team": BAD})),
        ("agent_id", lambda a: a.put_ledger(BAD, toks, [])),
        ("region", lambda a: a.put_ledger("a", toks, [(0, 3, BAD, 0)])),
        ("messages", lambda a: a.put_ledger("a", toks, [], [{"role": "user", "content": BAD}])),
        ("agent_id", lambda a: a.put_state(BAD, b"kv", codec="f16", n_tokens=3, fingerprint=FP)),
        ("n_tokens", lambda a: a.put_state("a", b"kv", codec="f16", n_tokens=HUGE, fingerprint=FP)),
        ("codec", lambda a: a.put_state("a", b"kv", codec=BAD, n_tokens=3, fingerprint=FP)),
        ("tier", lambda a: a.put_state("a", b"kv", codec="f16", n_tokens=3, fingerprint=FP, tier=BAD)),
        ("fingerprint", lambda a: a.put_state("a", b"kv", codec="f16", n_tokens=3, fingerprint={"model": BAD})),
        ("prompt_end", lambda a: a.put_checkpoint("keep", b"ck", prompt_end=(HUGE, 1))),
        ("agent_id", lambda a: a.put_checkpoint(BAD, b"ck", prompt_end=(1, 1))),
        ("agent_id", lambda a: a.delete_agent(BAD)),
        ("agent_id", lambda a: a.delete_ledger(BAD)),
        ("agent_id", lambda a: a.delete_state(BAD)),
        ("agent_id", lambda a: a.log_event(BAD, "demote")),
        ("kind", lambda a: a.log_event("a", BAD)),
        ("data", lambda a: a.log_event("a", "demote", to=BAD)),
        ("agent_id", lambda a: a.add_evicted_span(BAD, 0, 1, "user", "x")),
        ("start", lambda a: a.add_evicted_span("a", HUGE, HUGE + 1, "user", "x")),
        ("text", lambda a: a.add_evicted_span("a", 0, 1, "user", BAD)),
        ("region", lambda a: a.add_evicted_span("a", 0, 1, BAD, "x")),
        ("block_id", lambda a: a.put_shared_block(BAD, b"kv", n_tokens=1, fingerprint=FP)),
        ("n_tokens", lambda a: a.put_shared_block("b", b"kv", n_tokens=HUGE, fingerprint=FP)),
        ("fingerprint", lambda a: a.put_shared_block("b", b"kv", n_tokens=1, fingerprint={"m": BAD})),
        ("block_id", lambda a: a.incref_shared_block(BAD)),
        ("n", lambda a: a.incref_shared_block("blk", HUGE)),
        ("n", lambda a: a.incref_shared_block("blk", 2**63 - 1)),  # 1 + n passes the 64-bit limit
        ("limit", lambda a: a.events(limit=HUGE)),
        ("limit", lambda a: a.list_evicted("keep", limit=HUGE)),
        ("keep_last", lambda a: a.prune_events(HUGE)),
        ("k", lambda a: a.search_evicted(None, "kept", k=HUGE)),
    ]


_UNSTORABLE = _writes_of_unstorable_values()


@pytest.mark.parametrize(("field", "write"), _UNSTORABLE, ids=[f"{i}-{f}" for i, (f, _) in enumerate(_UNSTORABLE)])
def test_unstorable_values_are_typed_errors_naming_the_field(arc: Archive, field: str, write) -> None:
    """Issue #13 item 3: an agent id with a lone surrogate ("\\ud800") or an integer beyond
    SQLite's 64 bits (priority 10**30) reached SQLite and escaped as `UnicodeEncodeError` /
    `OverflowError: Python int too large to convert to SQLite INTEGER`, which broke the
    pool's save loop; every writer now rejects them with a `ConfigError` naming the field."""
    arc.put_state("keep", b"kv", codec="f16", n_tokens=3, fingerprint=FP)
    arc.put_shared_block("blk", b"kv", n_tokens=1, fingerprint=FP)
    assert arc.incref_shared_block("blk") == 1
    arc.add_evicted_span("keep", 0, 1, "user", "kept text")
    before = (arc.list_agents(), arc.list_shared_blocks(), arc.events(), arc.list_evicted("keep"))
    with pytest.raises(ConfigError, match=rf"\b{field}\b") as info:
        write(arc)
    assert isinstance(info.value, AgentMemError)
    assert (arc.list_agents(), arc.list_shared_blocks(), arc.events(), arc.list_evicted("keep")) == before
