"""Regression: a restored sliding-window model re-prefilled whenever the app re-sent
the last reply differently (the blob keeps the SWA layers only for the last window)."""

from __future__ import annotations

import pytest

from agentmem import MemoryPool


def conv(*turns: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


def test_restore_then_rollback_of_the_reply_uses_the_checkpoint(tiny_gemma3_path):
    """The tiny gemma3 has a 16-token window: any cut-back after a restore needs the checkpoint."""
    first = conv("tell me about the weather in paris today please")
    with MemoryPool(tiny_gemma3_path, n_ctx=1024, resident_agents=1, n_batch=64, prefetch=False, min_share_tokens=0) as p:
        r1 = p.chat("a", first, max_tokens=12)
        p.chat("b", conv("something else"), max_tokens=2)  # parks a
        follow = first + [{"role": "assistant", "content": "a different reply than generated"}, {"role": "user", "content": "and tomorrow?"}]
        r2 = p.chat("a", follow, max_tokens=6)
        assert r2.kv == "restored"
        assert r2.usage.cached_tokens >= r1.usage.prompt_tokens  # rolled back to the prompt end, not to 0
    with MemoryPool(tiny_gemma3_path, n_ctx=1024, resident_agents=1, n_batch=64, prefetch=False, min_share_tokens=0) as p:
        p.chat("a", first, max_tokens=12)
        never = p.chat("a", follow, max_tokens=6)
    assert r2.tokens == never.tokens


def test_the_checkpoint_survives_the_archive_and_a_restart(tiny_gemma3_path, tmp_path):
    """Cold states keep their checkpoint (and prompt end) too, across a restart."""
    first = conv("tell me about the weather in paris today please")
    follow = first + [{"role": "assistant", "content": "a different reply than generated"},
                      {"role": "user", "content": "and tomorrow?"}]
    opts = dict(n_ctx=1024, resident_agents=1, n_batch=64, prefetch=False, min_share_tokens=0)
    with MemoryPool(tiny_gemma3_path, archive_path=str(tmp_path / "a.db"), **opts) as p:
        r1 = p.chat("a", first, max_tokens=12)
        p.park("a", "cold")
        r2 = p.chat("a", follow, max_tokens=6)  # restored from the archive, rolled back to the prompt end
        assert r2.kv == "restored" and r2.usage.cached_tokens >= r1.usage.prompt_tokens
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        p.chat("a", first, max_tokens=12)
        never = p.chat("a", follow, max_tokens=6)
    assert r2.tokens == never.tokens
    again = follow + [{"role": "assistant", "content": "yet another text"}, {"role": "user", "content": "ok"}]
    with MemoryPool(tiny_gemma3_path, archive_path=str(tmp_path / "a.db"), **opts) as p:  # restart: state in the archive
        r3 = p.chat("a", again, max_tokens=4)
        assert r3.kv == "restored" and r3.usage.cached_tokens >= r2.usage.prompt_tokens


def test_a_handoff_destination_never_rolls_back_to_its_old_prompt_end(tiny_gemma3_path):
    """Regression (soak, #13): `handoff` replaced the destination's ledger but kept its
    `prompt_end` (and any checkpoint) from its own earlier conversation. Parked, it stored a
    sliding-window checkpoint cut at that stale position (empty: the cells were below the
    window), and its next diverging call rolled back to it: an empty checkpoint passed
    `reaches` (`seq_pos_min` is -1 for no cells), so the sliding-window layers silently lacked
    the positions before the cut; with other stale ends `llama_decode` failed with -1 (the
    window's cells ended before the ledger). The live KV must hold every ledger position."""
    long = conv("read the file and review the change to the pool module " * 6)
    opts = dict(n_ctx=2048, resident_agents=2, n_batch=64, prefetch=False, batch_decode=False, min_share_tokens=0)
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        p.chat("d", conv("hi there"), max_tokens=4)
        p.chat("s", long, max_tokens=8)
        p.park("s")  # a parked source hands over only its sliding window's last cells
        p.handoff("s", "d")
        p.park("d")
        follow = long + [{"role": "assistant", "content": "something else entirely"}, {"role": "user", "content": "go on"}]
        got = p.chat("d", follow, max_tokens=8)
        a = p.engine()._core.agents["d"]
        assert (p.engine().ctx.seq_pos_min(a.seq), p.engine().ctx.seq_pos_max(a.seq)) == (0, a.ledger.n_live - 1)
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        assert p.chat("d", follow, max_tokens=8).tokens == got.tokens


@pytest.mark.usefixtures("unified_kv_only")
def test_a_cut_inside_the_gap_of_a_restored_shared_state_re_prefills(tiny_gemma3_path):
    """Regression (soak, #13): an agent restored from a state cut at a shared block holds the
    block's sliding-window cells from position 0 and then only its private last window, with
    a gap between. `reaches` looked at the lowest position only, so a diverging call that cut
    inside the gap kept the cells, and `llama_decode` failed with -1 (the window's cells ended
    at the block) -- an EngineError out of `chat`. The cut must fall back to a re-prefill."""
    brief = "the team must ship the release on friday and every change needs a review " * 4
    words = " ".join(f"step {i} reads the file" for i in range(40))
    first = [{"role": "system", "content": brief}, {"role": "user", "content": words}]
    opts = dict(n_ctx=2048, resident_agents=2, n_batch=64, prefetch=False, batch_decode=False)
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        n_brief = p.share("brief", [{"role": "system", "content": brief}])
        r1 = p.chat("a", first, max_tokens=4)
        assert r1.kv == "shared"
        p.park("a")
        edited = [first[0], {"role": "user", "content": words[: len(words) // 3] + " and then stops"}]
        got = p.chat("a", edited, max_tokens=6)  # common prefix ends inside the gap
        a = p.engine()._core.agents["a"]
        assert (p.engine().ctx.seq_pos_min(a.seq), p.engine().ctx.seq_pos_max(a.seq)) == (0, a.ledger.n_live - 1)
        assert got.usage.cached_tokens in (0, n_brief) or got.usage.cached_tokens >= r1.usage.prompt_tokens
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        assert p.chat("a", edited, max_tokens=6).tokens == got.tokens


def _scripted(monkeypatch, tokens: list[int]) -> None:
    """The next call's sampler emits `tokens` (the tiny model's own greedy replies are byte soup
    that does not re-tokenize to itself, so a re-sent reply would never match its KV)."""
    from agentmem.engine.sampling import Sampler

    it = iter(tokens)
    monkeypatch.setattr(Sampler, "sample", lambda self, ctx_ptr, idx: next(it))


def test_a_restored_agent_keeps_the_re_sent_part_of_its_reply_exactly(tiny_gemma3_path, monkeypatch):
    """Regression (#15 item 5): when the app re-sent the reply cut short of what the KV held
    (trimmed, edited, a stop string's tokens), a restored sliding-window agent rolled back to
    its prompt end and re-prefilled the reply tokens it had: the blob keeps the window only
    before the reply's end, so any cut of 2+ tokens failed the reach test. The checkpoint plus
    the reply's live cells hold the window at every cut after the prompt end: the re-sent
    part is kept, and the KV the call continues from is the never-parked agent's, byte for byte."""
    from tests.fixtures.kv_probe import after_reconcile

    first = conv("tell me about the weather in paris today please")
    reply = "the weather in paris is mild and the sky is clear"
    opts = dict(n_ctx=1024, resident_agents=1, n_batch=64, prefetch=False, min_share_tokens=0, batch_decode=False)

    def first_call(p):
        whole = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "ok"}]
        n0 = len(p.renderer.render(first).tokens)
        reply_ids = p.renderer.render(whole).tokens[n0 : n0 + 10]
        _scripted(monkeypatch, reply_ids)
        r = p.chat("a", first, max_tokens=10)
        monkeypatch.undo()
        assert r.tokens == reply_ids and len(r.tokens) == 10  # 9 in the KV (the 10th was never decoded)
        return r

    with MemoryPool(tiny_gemma3_path, **opts) as p:
        r1 = first_call(p)
        cut = p.engine().model.detokenize(r1.tokens[:6])  # the app keeps the first 6 reply tokens
        follow = first + [{"role": "assistant", "content": cut}, {"role": "user", "content": "and tomorrow?"}]
        p.chat("b", conv("something else"), max_tokens=2)  # parks a
        with after_reconcile(p) as seen:
            r2 = p.chat("a", follow, max_tokens=8)
        assert r2.kv == "restored"
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        first_call(p)
        with after_reconcile(p) as seen_never:
            never = p.chat("a", follow, max_tokens=8)
    kept_reply = r2.usage.cached_tokens - r1.usage.prompt_tokens
    assert kept_reply >= 5, (r2.usage.cached_tokens, r1.usage.prompt_tokens)  # was 0: rolled back to the prompt end
    assert r2.usage.cached_tokens == never.usage.cached_tokens
    (n_keep, rows), (n_keep_never, rows_never) = seen[0], seen_never[0]
    assert n_keep == n_keep_never
    window = range(max(0, n_keep - 16 + 1), n_keep)  # no eviction: history tokens are live positions
    assert all(rows[q] == rows_never[q] for q in window), [q for q in window if rows.get(q) != rows_never.get(q)]
    assert max(rows) == n_keep - 1  # nothing past the cut
    assert r2.tokens == never.tokens
