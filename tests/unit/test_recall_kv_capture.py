"""Recall as KV in the pool (`PoolConfig.recall_kv`, agentmem/pool/kvcapture.py), on the tiny model.

Evicted runs of one message that `SplicePolicy` would splice (64-256 tokens) have their
cells copied out before eviction and stored in `span_kv`; a later prompt quoting them (a
recall block) gets them back as cells, or as text when the cells are gone. Nothing is
captured with the flag off (the default), nor on a context that cannot splice.
"""

from __future__ import annotations

import numpy as np
import pytest

from agentmem import MemoryPool
from agentmem.codec import decode_state, is_encoded
from agentmem.config import PoolConfig
from agentmem.engine.splice import SpanKV, splice_span
from agentmem.errors import ConfigError
from agentmem.pool.kvcapture import _SPLICE_COUNTERS
from agentmem.tools.recall import recall_block, recall_spans
from tests.fixtures.archives import raw_connection

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def long_conv(n_turns: int) -> list[dict]:
    """Turns whose user messages are long (~100+ tokens each), so an eviction block of 64 stays in one message."""
    msgs = [{"role": "system", "content": "you are a careful assistant"}]
    for i in range(n_turns):
        text = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(80))
        msgs.append({"role": "user", "content": f"note {i}: {text}"})
        msgs.append({"role": "assistant", "content": f"noted {i}"})
    msgs.append({"role": "user", "content": "what was note 1?"})
    return msgs


def _pool(path, tmp_path, **kw) -> MemoryPool:
    return MemoryPool(path, chat_format="chatml", n_ctx=4096, resident_agents=1, n_batch=64, prefetch=False,
                      agent_budget_tokens=512, eviction="sliding_window", eviction_block=64,
                      archive_path=str(tmp_path / "a.db"), recall_embedder="none", **kw)


def test_flag_off_captures_nothing_and_reports_nothing(tiny_model_path, tmp_path):
    with _pool(tiny_model_path, tmp_path, recall_kv=False) as p:
        p.chat("a", long_conv(12), max_tokens=2)
        assert p.stats()["agents"]["a"]["evicted_tokens"] > 0
        assert "kv_captured" not in p.recall_stats()
        assert p.engine().ctx.params.n_seq_max == 1  # no scratch sequence
        arc = p.engine()._core.recall_store
        assert raw_connection(arc).execute("SELECT count(*) FROM span_kv").fetchone()[0] == 0


def test_evicted_runs_the_policy_would_splice_are_stored_and_splice_back(tiny_model_path, tmp_path):
    with _pool(tiny_model_path, tmp_path, recall_kv=True, recall_kv_keep=1000) as p:
        core = p.engine()._core
        assert core.ctx.params.n_seq_max == 2 and p.engine()._span_kv.enabled
        p.chat("a", long_conv(12), max_tokens=2)
        st = p.recall_stats()
        assert st["kv_enabled"] and st["kv_captured"] >= 1 and st["kv_stored"] >= 1
        assert st["kv_capture_bytes"] > 0
        led = core.agents["a"].ledger
        ids = [r[0] for r in raw_connection(core.recall_store).execute("SELECT span_id FROM span_kv").fetchall()]
        assert len(ids) == st["kv_stored"]
        for sid in ids:
            got = core.recall_store.get_span_kv("a", sid, model=p.engine()._span_kv.model)
            assert got is not None and 64 <= len(got.tokens) <= 256
            # the stored ids are the history's tokens of some evicted, contiguous run
            hist = np.asarray(led.tokens)
            n = len(got.tokens)
            starts = [i for i in range(len(hist) - n + 1) if not led.live[i] and tuple(hist[i:i + n]) == got.tokens]
            assert starts, "stored token ids are no evicted run of the history"
        # the blob loads back into a sequence at a new position (the splice half's primitive)
        ctx = core.ctx
        got = core.recall_store.get_span_kv("a", ids[0], model=p.engine()._span_kv.model)
        seq, live = core.agents["a"].seq, core.agents["a"].ledger.n_live
        assert is_encoded(got.blob)  # q8_0 by default (recall_kv_codec)
        kv = SpanKV(blob=np.asarray(decode_state(got.blob)), pos0=got.pos0, tokens=got.tokens)
        splice_span(ctx, kv, seq=seq, pos0=live, heal=4, scratch=p.engine()._span_kv.scratch)
        assert ctx.seq_pos_max(seq) == live + kv.n - 1
        ctx.seq_rm(seq, live, -1)


def test_the_codec_halves_the_bytes_and_the_agent_keeps_its_newest_spans(tiny_model_path, tmp_path):
    """`recall_kv_codec` (q8_0) stores about half of f16's bytes; `recall_kv_keep` bounds an agent's rows."""
    with _pool(tiny_model_path, tmp_path, recall_kv=True, recall_kv_keep=3) as p:
        p.chat("a", long_conv(12), max_tokens=2)
        st = p.recall_stats()
        assert st["kv_stored"] > 3
        assert st["kv_stored_bytes"] < 0.6 * st["kv_capture_bytes"]
        core = p.engine()._core
        ids = [r[0] for r in raw_connection(core.recall_store).execute("SELECT span_id FROM span_kv").fetchall()]
        assert len(ids) == 3
        assert sorted(ids) == sorted(i for i, _ in core.recall_store.span_kv_tokens("a", model=p.engine()._span_kv.model))
        newest = raw_connection(core.recall_store).execute("SELECT max(id) FROM evicted_spans").fetchone()[0]
        assert max(ids) <= newest
    (tmp_path / "f16").mkdir()
    with _pool(tiny_model_path, tmp_path / "f16", recall_kv=True, recall_kv_codec="f16") as p:
        p.chat("a", long_conv(12), max_tokens=2)
        st = p.recall_stats()
        assert st["kv_stored"] >= 1 and st["kv_stored_bytes"] > 0.9 * st["kv_capture_bytes"] / st["kv_captured"] * st["kv_stored"]


def test_a_damaged_blob_is_prefilled_as_text(tiny_model_path, tmp_path):
    """A hostile or corrupted `span_kv` row (its codec checksum fails) never reaches llama.cpp: the text goes in."""
    with _pool(tiny_model_path, tmp_path, recall_kv=True) as p:
        first, second = _recall_turn(p)
        con = raw_connection(p.engine()._core.recall_store)
        for sid, blob in con.execute("SELECT span_id, blob FROM span_kv").fetchall():
            bad = bytearray(blob)
            bad[len(bad) // 2] ^= 0xFF
            con.execute("UPDATE span_kv SET blob = ? WHERE span_id = ?", [bytes(bad), sid])
        p.chat("a", second, max_tokens=2)
        st = p.recall_stats()
        assert st["kv_matched"] >= 1 and st["kv_spliced"] == 0 and st["kv_prefilled"] == st["kv_matched"]
        _kv_consistent(p)


def test_auto_keeps_cells_for_the_agents_that_recall_only(tiny_model_path, tmp_path):
    """The default (`recall_kv="auto"`): an agent that never recalls pays nothing; one that does, from then on."""
    with _pool(tiny_model_path, tmp_path) as p:
        core = p.engine()._core
        assert core.config.recall_kv == "auto" and core.ctx.params.n_seq_max == 2 and p.engine()._span_kv.enabled
        p.chat("quiet", long_conv(12), max_tokens=2)
        assert p.stats()["agents"]["quiet"]["evicted_tokens"] > 0
        assert p.recall_stats()["kv_captured"] == 0
        assert raw_connection(core.recall_store).execute("SELECT count(*) FROM span_kv").fetchone()[0] == 0
        p.recall("a", "anything", 1)  # a recall before its history: the agent uses recall
        first, second = _recall_turn(p)
        assert p.recall_stats()["kv_stored"] >= 1
        p.chat("a", second, max_tokens=2)
        st = p.recall_stats()
        assert st["kv_matched"] >= 1 and st["kv_spliced"] == st["kv_matched"]
        totals = p.stats()["totals"]  # the server's agentmem_recall_kv_* counters
        assert totals["recall_kv_spliced_tokens"] == st["kv_spliced_tokens"] and totals["recall_kv_stored"] == st["kv_stored"]
        _kv_consistent(p)
        p.forget("a")
        assert "a" not in p.engine()._span_kv.recalling


def test_recall_kv_needs_a_free_sequence_id():
    with pytest.raises(ConfigError, match="recall_kv"):
        PoolConfig(resident_agents=256, recall_kv=True)
    with pytest.raises(ConfigError, match="recall_kv"):
        PoolConfig(recall_kv=1)
    assert PoolConfig(resident_agents=256).recall_kv == "auto"  # auto: no scratch there, no error
    with pytest.raises(ConfigError, match="recall_kv_keep"):
        PoolConfig(recall_kv_keep=0)


def _recall_turn(p: MemoryPool) -> tuple[list[dict], list[dict]]:
    """A first call that evicts, then the messages of a second one quoting the evicted lines in a recall block."""
    msgs = long_conv(12)
    r = p.chat("a", msgs, max_tokens=2)
    got = recall_spans(p, "a", "note 1 alpha bravo charlie", 3)
    assert got, "the first notes were evicted and are recalled by keyword"
    block = recall_block([t for t, _ in got])
    return msgs, msgs + [{"role": "assistant", "content": r.text}, {"role": "system", "content": block},
                         {"role": "user", "content": "and note 2?"}]


def _kv_consistent(p: MemoryPool) -> None:
    core = p.engine()._core
    a = core.agents["a"]
    assert core.ctx.seq_pos_max(a.seq) == a.ledger.n_live - 1 and core.ctx.seq_pos_max(p.engine()._span_kv.scratch) == -1


def test_a_recalled_span_quoted_in_the_prompt_is_spliced_as_its_cells(tiny_model_path, tmp_path):
    with _pool(tiny_model_path, tmp_path, recall_kv=True) as p:
        first, second = _recall_turn(p)
        r2 = p.chat("a", second, max_tokens=2)
        st = p.recall_stats()
        assert st["kv_matched"] >= 1 and st["kv_spliced"] == st["kv_matched"] and st["kv_prefilled"] == 0
        assert st["kv_spliced_tokens"] >= 64
        assert set(p.engine()._span_kv.recaller.counters) == set(_SPLICE_COUNTERS)  # the disabled stats' keys
        _kv_consistent(p)
        # the ledger holds the prompt's tokens: the next call reuses the whole conversation
        r3 = p.chat("a", second + [{"role": "assistant", "content": r2.text}, {"role": "user", "content": "ok"}],
                    max_tokens=2)
        assert r3.kv == "reused"


def test_a_missing_blob_falls_back_to_the_text(tiny_model_path, tmp_path, monkeypatch):
    """A span listed but whose cells cannot be read (deleted, another writer) is prefilled as text."""
    with _pool(tiny_model_path, tmp_path, recall_kv=True) as p:
        first, second = _recall_turn(p)
        store = p.engine()._core.recall_store
        monkeypatch.setattr(store, "get_span_kv", lambda *args, **kw: None)
        p.chat("a", second, max_tokens=2)
        st = p.recall_stats()
        assert st["kv_matched"] >= 1 and st["kv_spliced"] == 0 and st["kv_prefilled"] == st["kv_matched"]
        _kv_consistent(p)


def test_the_flag_off_never_looks_for_spans(tiny_model_path, tmp_path):
    with _pool(tiny_model_path, tmp_path, recall_kv=False) as p:
        first, second = _recall_turn(p)
        p.chat("a", second, max_tokens=2)
        assert not any(k.startswith("kv_") for k in p.recall_stats())


def test_stored_cells_splice_after_a_restart(tiny_model_path, tmp_path):
    """The cells live in the archive: a pool reopened on it splices them (same fingerprint, same digest)."""
    with _pool(tiny_model_path, tmp_path, recall_kv=True) as p:
        first, second = _recall_turn(p)
        stored = p.recall_stats()["kv_stored"]
    assert stored >= 1
    with _pool(tiny_model_path, tmp_path, recall_kv=True) as p:
        p.chat("a", second, max_tokens=2)
        st = p.recall_stats()
        assert st["kv_matched"] >= 1 and st["kv_spliced"] == st["kv_matched"]
        _kv_consistent(p)


def test_a_context_that_cannot_splice_keeps_text_only(tiny_model_path, tmp_path):
    """Per-sequence streams (a `seq_cp` across streams copies whole streams): no scratch, nothing captured."""
    with _pool(tiny_model_path, tmp_path, recall_kv=True, kv_layout="per_sequence") as p:
        core = p.engine()._core
        assert core.ctx.params.n_seq_max == 1 and not p.engine()._span_kv.enabled
        first, second = _recall_turn(p)
        p.chat("a", second, max_tokens=2)
        st = p.recall_stats()
        assert not st["kv_enabled"] and st["kv_captured"] == st["kv_matched"] == st["kv_spliced"] == 0


def test_auto_leaves_sliding_window_models_to_text(tiny_gemma3_path, tmp_path):
    """Gemma 3 (a sliding window, `swa_full`): spliced cells measured no faster than the text and far off it
    (benchmarks/recall_kv_pool.py on gemma-3-270m: 0.99x, KL 0.30), so `auto` opens no scratch there; `True`
    still can, for experiments."""
    with _pool(tiny_gemma3_path, tmp_path) as p:
        core = p.engine()._core
        assert core.ctx.model.n_swa > 0
        assert core.ctx.params.n_seq_max == 1 and not p.engine()._span_kv.enabled
        p.recall("a", "anything", 1)
        p.chat("a", long_conv(12), max_tokens=2)
        assert p.recall_stats()["kv_captured"] == 0
    (tmp_path / "forced").mkdir()
    with _pool(tiny_gemma3_path, tmp_path / "forced", recall_kv=True) as p:
        assert p.engine().ctx.params.n_seq_max == 2 and p.engine()._span_kv.enabled


def test_cells_survive_a_restart_on_either_archive(tiny_model_path, archive_target):
    """SQLite and PostgreSQL (`archive_url`): stored with the text, spliced by a pool reopened on the archive."""
    where = {"archive_url": archive_target} if archive_target.startswith("postgresql://") \
        else {"archive_path": archive_target}
    opts = dict(chat_format="chatml", n_ctx=4096, resident_agents=1, n_batch=64, prefetch=False,
                agent_budget_tokens=512, eviction="sliding_window", eviction_block=64, recall_embedder="none")
    with MemoryPool(tiny_model_path, recall_kv=True, **opts, **where) as p:
        first, second = _recall_turn(p)
        assert p.recall_stats()["kv_stored"] >= 1
    with MemoryPool(tiny_model_path, recall_kv=True, **opts, **where) as p:
        p.chat("a", second, max_tokens=2)
        st = p.recall_stats()
        assert st["kv_matched"] >= 1 and st["kv_spliced"] == st["kv_matched"] and st["kv_splice_failed"] == 0
        _kv_consistent(p)
