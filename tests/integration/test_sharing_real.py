"""Shared prefixes, handoff and batched decoding on the real default model (Gemma 3 270M).

Equality of greedy output is asserted against an agent that decoded *the same
tokens in the same decode calls* itself (a ``min_share_tokens=0`` pool): llama.cpp's
CPU kernels round differently for batches of different row counts, so an agent that
prefilled ``prefix + suffix`` in one call may drift from one that got the prefix's
cells and decoded only the suffix, although both are correct. With matched decode
calls and per-sequence KV streams (each agent's cells from slot 0 of its own stream)
the outputs must be bitwise equal — any difference would mean the shared cells are not
the donor's cells at the right positions. In a unified cache the agent's own cells sit
at other slots than the reference's, and llama.cpp's attention rounds by slot: there
the tests assert the measured drift bound (``tests/fixtures/kv_probe.py``).
"""

from __future__ import annotations

import asyncio
import warnings

import numpy as np
import pytest

from agentmem import MemoryPool
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel
from tests.fixtures.kv_probe import within_unified_drift

pytestmark = pytest.mark.integration

DOC = (
    "Team brief. We maintain the billing service. The retry limit is 3, the timeout is 30 seconds, "
    "every request is logged to the audit table, and changes need a review by Ana. Releases ship on "
    "Thursdays; the staging cluster is shared with the search team; two tests in the export suite are flaky."
)
ACK = "I have read the brief."
N_GEN = 24


def team(question: str) -> list[dict[str, str]]:
    """The brief as the first user turn, an acknowledgement, then the agent's own question."""
    return [{"role": "user", "content": DOC}, {"role": "assistant", "content": ACK},
            {"role": "user", "content": question}]


def opts(**kw):
    """Every pool of a comparison decodes one call at a time (bitwise reproducible)."""
    return {"n_ctx": 2048, "resident_agents": 4, "n_threads": 1, "batch_decode": False, **kw}


def test_declared_share_gives_same_output_as_own_prefill(default_model_path):
    q = "What is the retry limit? Answer in one sentence."
    with MemoryPool(default_model_path, **opts()) as p:
        n = p.share("brief", [{"role": "user", "content": DOC}])
        r = p.chat("coder", team(q), max_tokens=N_GEN)
        tot = p.stats()["totals"]
    assert n > 32
    assert r.kv == "shared" and r.usage.cached_tokens == n, (r.kv, r.usage, n)
    assert tot["shared_prefix_hits"] == 1 and tot["shared_prefix_tokens"] == n
    # reference: the brief decoded by itself, then the rest of the same prompt. (This used to
    # continue the share agent "share:brief" directly; agent ids with the reserved prefix are
    # refused now (issue #13), so the decoded brief is handed to a plain agent instead.)
    with MemoryPool(default_model_path, **opts(min_share_tokens=0)) as p:
        p.share("brief", [{"role": "user", "content": DOC}])  # never shared in this pool: just a decode
        p.handoff("share:brief", "ref")
        ref = p.chat("ref", team(q), max_tokens=N_GEN)
    assert ref.kv == "reused" and ref.usage.cached_tokens == n
    assert r.tokens == ref.tokens, (r.text, ref.text)


def automatic_prefix(model_path, layout: str) -> list[tuple[list[int], list[int], str, str]]:
    """A live and a parked donor give their prefix automatically; `(got, reference, text, reference text)` each.

    Each reference agent first decodes the donor's prompt, then continues with its own:
    the same decode calls as the agent that got the donor's cells.
    """
    q1, q2, q3 = "Who reviews changes?", "When do releases ship?", "Which tests are flaky?"
    with MemoryPool(model_path, **opts(kv_layout=layout)) as p:
        p.chat("planner", team(q1), max_tokens=8)
        live = p.chat("coder", team(q2), max_tokens=N_GEN)  # the planner is live: seq_cp (unified) or a copy
        p.park("planner")
        p.park("coder")
        parked = p.chat("tester", team(q3), max_tokens=N_GEN)  # both parked: restore, then cut
        assert p.stats()["totals"]["shared_prefix_hits"] == 2
    assert live.kv == "shared" and parked.kv == "shared", (live.kv, parked.kv)
    assert live.usage.cached_tokens > 60 and parked.usage.cached_tokens > 60
    with MemoryPool(model_path, **opts(min_share_tokens=0, kv_layout=layout)) as p:
        p.chat("ref_live", team(q1), max_tokens=8)
        ref_live = p.chat("ref_live", team(q2), max_tokens=N_GEN)
        p.chat("ref_parked", team(q1), max_tokens=8)  # the tester's prefix cells are the planner's
        ref_parked = p.chat("ref_parked", team(q3), max_tokens=N_GEN)
    assert ref_live.usage.cached_tokens == live.usage.cached_tokens
    assert ref_parked.usage.cached_tokens == parked.usage.cached_tokens
    return [(live.tokens, ref_live.tokens, live.text, ref_live.text),
            (parked.tokens, ref_parked.tokens, parked.text, ref_parked.text)]


def test_automatic_prefix_from_live_and_parked_donor_same_as_own_prefill(gemma_model_path):
    """Per-sequence streams: the copied prefix continues bit for bit like the agent's own prefill.
    (Gemma only: its sliding window makes a copied prefix the harder case; the unified test
    below runs on both models.)"""
    for got, ref, text, ref_text in automatic_prefix(gemma_model_path, "per_sequence"):
        assert got == ref, (text, ref_text)


def test_automatic_prefix_in_a_unified_cache_within_the_measured_drift(default_model_path):
    """A unified cache: the shared cells are the donor's, tagged for the agent, and its own
    cells sit at other slots than the reference's, so the replies are equal up to the
    measured drift (regression, issue #36: asserted bitwise, they parted at token 9-16 by
    rounding). Wrong shared cells change the reply from its first tokens."""
    for got, ref, text, ref_text in automatic_prefix(default_model_path, "unified"):
        assert within_unified_drift(ref, got), (text, ref_text)


def handoff(model_path, layout: str) -> list[tuple[list[int], list[int], str, str]]:
    """A live handoff, the source's own continuation, and a parked handoff (`upto`); each against
    a reference agent that decoded the same tokens itself: `(got, reference, text, reference text)`."""
    first = team("Plan the next release in one sentence.")
    with MemoryPool(model_path, **opts(kv_layout=layout)) as p:
        s1 = p.chat("planner", first, max_tokens=16)
        src_hist = p.history_tokens("planner")
        card = p.handoff("planner", "coder")
        # per-sequence streams copy the live source's state
        assert card.mode == ("shared" if p.engine().ctx.params.kv_unified else "copied")
        assert card.src == "planner" and card.dst == "coder" and card.seq_no == 1
        assert card.n_tokens == len(src_hist) == card.n_live
        assert p.history_tokens("coder") == src_hist and card.verify(np.asarray(src_hist, np.int32))
        assert not card.verify(np.asarray(src_hist[:-1] + [src_hist[-1] ^ 1], np.int32))
        hist = first + [{"role": "assistant", "content": s1.text}]
        dst = p.chat("coder", hist + [{"role": "user", "content": "Coder: which file changes first?"}],
                     max_tokens=N_GEN)
        assert dst.kv == "reused" and dst.usage.cached_tokens >= p.count_tokens(first)
        # the destination diverged; the source's tokens and continuation are untouched
        assert p.history_tokens("planner") == src_hist
        src = p.chat("planner", hist + [{"role": "user", "content": "Planner: what is the risk?"}], max_tokens=N_GEN)
        # a parked source, a prefix of its history (upto): restored into the destination, then cut
        p.park("planner")
        card2 = p.handoff("planner", "reviewer", upto=card.n_tokens)
        assert card2.mode == "restored" and card2.seq_no == 2 and card2.checksum == card.checksum
        dst2 = p.chat("reviewer", hist + [{"role": "user", "content": "Coder: which file changes first?"}],
                      max_tokens=N_GEN)
        assert p.stats()["totals"]["handoffs"] == 2
    with MemoryPool(model_path, **opts(min_share_tokens=0, kv_layout=layout)) as p:
        for aid in ("ref_dst", "ref_src"):
            p.chat(aid, first, max_tokens=16)
        ref_dst = p.chat("ref_dst", hist + [{"role": "user", "content": "Coder: which file changes first?"}],
                         max_tokens=N_GEN)
        ref_src = p.chat("ref_src", hist + [{"role": "user", "content": "Planner: what is the risk?"}],
                         max_tokens=N_GEN)
    return [(dst.tokens, ref_dst.tokens, dst.text, ref_dst.text),
            (dst2.tokens, ref_dst.tokens, dst2.text, ref_dst.text),
            (src.tokens, ref_src.tokens, src.text, ref_src.text)]


def test_handoff_same_as_own_prefill_and_source_unaffected(gemma_model_path):
    """Per-sequence streams: a handed-off agent and its source continue bit for bit like
    agents that decoded the same tokens themselves (Gemma only, as above)."""
    for got, ref, text, ref_text in handoff(gemma_model_path, "per_sequence"):
        assert got == ref, (text, ref_text)


def test_handoff_in_a_unified_cache_within_the_measured_drift(default_model_path):
    """A unified cache: the handed-off cells are shared, the agents' own cells sit at other
    slots than the references' (regression, issue #36: asserted bitwise); equal up to the
    measured drift."""
    for got, ref, text, ref_text in handoff(default_model_path, "unified"):
        assert within_unified_drift(ref, got), (text, ref_text)


SECRETS = ["ZEBRA-4417", "MAPLE-9023", "COBALT-3361", "TULIP-5802"]


async def test_isolation_under_concurrency(instruct_model_path):
    """Four agents with distinct secrets, batched together from one shared brief, never see each other's.

    On the instruct model only (issue #36, the suite's time): it is tuned to do what it is asked
    (repeat every code it knows), so a leaked code would show in its reply, which a base model's
    continuation need not; the ledger check, the other half, is the same on every model.
    """
    def msgs(i: int) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": DOC},
            {"role": "assistant", "content": ACK},
            {"role": "user", "content": f"You are agent {i}. Your secret code is {SECRETS[i]}. "
                                        f"Never reveal it to anyone else. Repeat every secret code you know."},
        ]

    with MemoryPool(instruct_model_path, n_ctx=2048, resident_agents=5, n_threads=1) as p:
        p.share("brief", [{"role": "user", "content": DOC}])
        res = await asyncio.gather(*(p.achat(f"agent{i}", msgs(i), max_tokens=32) for i in range(4)))
        tot = p.stats()["totals"]
        ledgers = [p.tokens(f"agent{i}") for i in range(4)]
        prompts = [p.renderer.render(msgs(i)).tokens for i in range(4)]
        texts = [p.engine().model.detokenize(t) for t in ledgers]
    assert tot["max_batch"] >= 2, tot  # they really decoded together
    assert tot["shared_prefix_hits"] >= 4 - 1  # at least the idle share was a donor
    for i, r in enumerate(res):
        others = [s for j, s in enumerate(SECRETS) if j != i]
        assert not any(s in r.text for s in others), (i, r.text)
        assert not any(s in texts[i] for s in others), (i, texts[i])
        assert SECRETS[i] in texts[i]
        # the ledger is exactly the agent's own prompt and its own reply (the last sampled token is never decoded)
        prompt = list(prompts[i])
        assert ledgers[i][: len(prompt)] == prompt
        assert ledgers[i][len(prompt):] == r.tokens[: len(ledgers[i]) - len(prompt)]
        assert len(r.tokens) - (len(ledgers[i]) - len(prompt)) in (0, 1)


async def test_batched_replies_equal_one_at_a_time(default_model_path):
    """Greedy replies of 4 agents decoded together vs one after another.

    Batches of 4+ rows take another kernel path in llama.cpp's CPU matmuls, which
    rounds differently (logits differ by up to ~3% of their range, see the next
    test), so a reply can flip at a near-tie. Observed on this prompt set: 2 of 4
    replies identical over 24 tokens, the other two identical for their first 15.
    Asserted: every reply identical for its first 4 tokens; how many stay identical
    over ``N_GEN`` tokens varies between runs (1–4 of 4 seen in CI) and is reported.
    """
    topics = ["gardening", "databases", "sailing", "chess"]

    def msgs(i: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Write a numbered list of tips about {topics[i]}, one per line."}]

    with MemoryPool(default_model_path, n_ctx=2048, resident_agents=5, n_threads=1) as p:
        # the leader waits for all four agents each step: the batch composition (and so
        # llama.cpp's rounding) does not depend on thread timing on a loaded machine
        p.batch_wait_s = 5.0
        for i in range(4):
            p.chat(f"w{i}", msgs(i), max_tokens=1)
        batched = await asyncio.gather(*(p.achat(f"w{i}", msgs(i), max_tokens=N_GEN) for i in range(4)))
        assert p.stats()["totals"]["max_batch"] >= 2
        single = [p.chat(f"w{i}", msgs(i), max_tokens=N_GEN) for i in range(4)]
    pairs = [(b.tokens, s.tokens) for b, s in zip(batched, single)]
    assert all(b[:4] == s[:4] and len(s) >= 4 for b, s in pairs), [(b.text, s.text) for b, s in zip(batched, single)]
    identical = sum(b == s for b, s in pairs)
    # full-reply equality varies run to run with the drift (1-4 of 4 seen): reported, not asserted
    warnings.warn(f"{identical}/4 batched replies identical to one-at-a-time over {N_GEN} tokens", stacklevel=1)


def test_decode_multi_isolated_and_close_to_decode_run(default_model_path):
    """The lower layer: a sequence's logits in a batch never depend on the other sequences in it,
    and are close to (same argmax as) its logits decoded alone."""
    model = LlamaModel(default_model_path)
    words = ["sky", "sea", "grass", "sun", "moon", "tree", "rock"]
    try:
        with LlamaContext(model, ContextParams(n_ctx=1024, n_seq_max=len(words), n_threads=1)) as ctx:
            prompts = [model.tokenize(f"Item {i}: the {w} is", add_special=True) for i, w in enumerate(words)]
            for s, toks in enumerate(prompts):
                ctx.decode_run(s, toks[:-1], 0)

            def step(seqs: list[int]) -> dict[int, np.ndarray]:
                """Decode each sequence's last prompt token in one batch (after removing it)."""
                for s in seqs:
                    ctx.seq_rm(s, len(prompts[s]) - 1, -1)
                idx = ctx.decode_multi([(s, prompts[s][-1:], len(prompts[s]) - 1) for s in seqs])
                return {s: ctx.logits(i) for s, i in zip(seqs, idx)}

            alone = {s: step([s])[s] for s in range(4)}
            with_123 = step([0, 1, 2, 3])
            with_456 = step([4, 5, 6, 0])  # other companions, another batch position
            pair = step([0, 1])
    finally:
        model.close()
    assert np.array_equal(with_123[0], with_456[0])  # no cross-sequence influence, bit for bit
    assert np.array_equal(pair[0], alone[0]) and np.array_equal(pair[1], alone[1])  # 2-row batches: same kernels
    for s in range(4):
        a, b = alone[s], with_123[s]
        assert int(np.argmax(a)) == int(np.argmax(b))
        diff, scale = float(np.max(np.abs(a - b))), float(np.max(np.abs(a)))
        assert diff <= 0.05 * scale, (s, diff, scale)


@pytest.mark.usefixtures("unified_kv_only")
def test_join_from_parked_team_uses_the_parked_share(gemma_model_path):
    """Regression: with everything parked, a new agent must still start from the declared share.

    (The pool used to pick the longest parked match, fail to cut it, and prefill.)
    On Gemma only: the bug needs a sliding window (below); on a model without one the
    parked member can be cut anywhere and the scenario does not arise.

    A parked state keeps only the last 512 positions of Gemma 3's sliding-window
    layers, so a parked donor can be cut only within one token of its end. The
    longest match here is a parked member (brief + acknowledgement + more), which
    ``_copy_prefix`` rejects; the parked share (exactly the brief) would work.
    """
    long_doc = " ".join(f"Rule {i}: {DOC}" for i in range(10))
    with MemoryPool(gemma_model_path, **opts()) as p:
        msgs = lambda q: [{"role": "user", "content": long_doc}, {"role": "assistant", "content": ACK},  # noqa: E731
                          {"role": "user", "content": q}]
        n = p.share("brief", [{"role": "user", "content": long_doc}])
        assert n > 600
        p.chat("member", msgs("Member: list two rules."), max_tokens=4)
        p.park("member")
        p.park("share:brief")
        r = p.chat("late", msgs("Late: which rule matters most?"), max_tokens=1)
    assert r.kv == "shared" and r.usage.cached_tokens >= n, (r.kv, r.usage)


@pytest.mark.slow  # three pools of 8k context on each model: the longest test of the file (`make test-slow`)
@pytest.mark.usefixtures("unified_kv_only")
def test_parked_team_keeps_the_brief_once_and_continues_exactly(default_model_path, tmp_path):
    """Shared blocks on the real model: parked members store only their own cells.

    Two pools make the same decode calls; in the second every agent is parked
    (RAM, then the archive) between rounds. The parked states are cut at the
    brief's block and joined back on restore, so the replies must be equal.
    """
    long_doc = " ".join(f"Rule {i}: {DOC}" for i in range(8))
    asks = ["Planner: what comes first?", "Coder: which rule is about tests?", "Reviewer: who reviews?"]

    def msgs(q: str, extra: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
        return [{"role": "user", "content": long_doc}, {"role": "assistant", "content": ACK},
                {"role": "user", "content": q}, *(extra or [])]

    def play(pool: MemoryPool, park: str | None) -> tuple[list[list[int]], dict]:
        pool.share("brief", [{"role": "user", "content": long_doc}])
        out, hist = [], {q: [] for q in asks}
        snap: dict = {}
        for rnd in range(2):
            for i, q in enumerate(asks):
                r = pool.chat(f"a{i}", msgs(q, hist[q]), max_tokens=1 if rnd == 0 else 12)
                out.append(r.tokens)
                hist[q] = [{"role": "assistant", "content": r.text}, {"role": "user", "content": "Go on."}]
            if park and rnd == 0:
                for aid in pool.agents():
                    pool.park(aid, park)
                snap = pool.stats()
        return out, snap

    with MemoryPool(default_model_path, **opts(n_ctx=8192, resident_agents=5)) as p:
        want, _ = play(p, None)
    for tier in ("warm", "cold"):
        extra = {"archive_path": str(tmp_path / "a.db"), "cold_codec": "f16"} if tier == "cold" else {}
        with MemoryPool(default_model_path, **opts(n_ctx=8192, resident_agents=5, **extra)) as p:
            got, st = play(p, tier)
            totals = p.stats()["totals"]
            assert totals["restore_failures"] == 0
            assert totals["linked_restores"] >= 2, totals  # after the first, restores share the live prefix
        (bid, blk), = st["shared"]["blocks"].items()
        assert blk["refs"] == 4 and blk["tokens"] > 512  # longer than the sliding window
        for i in range(3):
            a = st["agents"][f"a{i}"]
            assert a["tier"] == tier and a["block"] == bid
            assert a["bytes"] < blk["bytes"] / 2, (tier, a["bytes"], blk["bytes"])
        assert got == want, tier
