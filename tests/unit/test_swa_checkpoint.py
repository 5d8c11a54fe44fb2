"""Regression: a restored sliding-window model re-prefilled whenever the app re-sent
the last reply differently (the blob keeps the SWA layers only for the last window)."""

from __future__ import annotations

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
        a = p._core.agents["d"]
        assert (p.ctx.seq_pos_min(a.seq), p.ctx.seq_pos_max(a.seq)) == (0, a.ledger.n_live - 1)
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        assert p.chat("d", follow, max_tokens=8).tokens == got.tokens


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
        a = p._core.agents["a"]
        assert (p.ctx.seq_pos_min(a.seq), p.ctx.seq_pos_max(a.seq)) == (0, a.ledger.n_live - 1)
        assert got.usage.cached_tokens in (0, n_brief) or got.usage.cached_tokens >= r1.usage.prompt_tokens
    with MemoryPool(tiny_gemma3_path, **opts) as p:
        assert p.chat("a", edited, max_tokens=6).tokens == got.tokens
