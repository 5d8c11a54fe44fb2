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
