"""Shared KV blocks: parked agents keep a shared prefix once, in RAM and in the archive.

Runs on the tiny synthetic models (a plain llama and an iSWA gemma3), with the
real llama.cpp: blobs are cut and joined byte for byte, restores give the same
greedy output as agents that were never parked, counts never go negative and
blocks are freed with their last reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from agentmem import MemoryPool
from agentmem.archive import Archive
from agentmem.codec import join_state, parse_state, split_state
from agentmem.errors import CodecError
from agentmem.memory.shared import BlockStore

BRIEF = "the team must ship the release on friday and every change needs a review " * 4
ASKS = ["plan the work", "write the code", "review the change"]


def team(user: str) -> list[dict]:
    return [{"role": "system", "content": BRIEF}, {"role": "user", "content": user}]


def opts(**kw):
    base = dict(n_ctx=2048, n_batch=64, prefetch=False, batch_decode=False)
    base.update(kw)
    return base


@pytest.fixture(params=["llama", "gemma3"])
def model(request, tiny_model_path, tiny_gemma3_path):
    return tiny_model_path if request.param == "llama" else tiny_gemma3_path


def run_team(pool: MemoryPool, rounds: int = 2, hist: dict | None = None, max_tokens: int = 4) -> list[list[int]]:
    out = []
    hist = {a: team(a) for a in ASKS} if hist is None else hist
    for _ in range(rounds):
        for a in ASKS:
            r = pool.chat(a, hist[a], max_tokens=max_tokens)
            out.append(r.tokens)
            hist[a] = hist[a] + [{"role": "assistant", "content": r.text}, {"role": "user", "content": "go on"}]
    return out


def share_and_member(model) -> tuple[int, np.ndarray, np.ndarray]:
    """(brief tokens, the brief's state, the state of an agent that started from it)."""
    with MemoryPool(model, **opts(resident_agents=4)) as pool:
        n = pool.share("brief", [{"role": "system", "content": BRIEF}])
        pool.chat("a", team("hello there"), max_tokens=5)
        return n, pool.engine().ctx.state_get(pool.engine()._core.agents["share:brief"].seq), pool.engine().ctx.state_get(pool.engine()._core.agents["a"].seq)


def test_split_join_roundtrip_is_byte_exact(model):
    n, block, blob = share_and_member(model)
    priv, order = split_state(blob, block, n)
    assert priv.nbytes < blob.nbytes / 2  # the brief is most of the state
    assert np.array_equal(join_state(block, priv, order), blob)
    parse_state(priv)  # the private part is itself a valid state blob
    # a blob whose shared cells differ from the block is not cut
    bad = block.copy()
    t = next(parse_state(bad).tensors())
    bad[t.data_offset : t.data_offset + t.data_size] ^= 1
    assert split_state(blob, bad, n) is None
    with pytest.raises(CodecError):
        join_state(block, priv, order[:-1])


@pytest.mark.usefixtures("unified_kv_only")
def test_parked_members_store_the_prefix_once_and_restore_exactly(model):
    with MemoryPool(model, **opts(resident_agents=4)) as ref:
        ref.share("brief", [{"role": "system", "content": BRIEF}])
        want = run_team(ref)
    with MemoryPool(model, **opts(resident_agents=1)) as pool:  # every switch parks and restores
        pool.share("brief", [{"role": "system", "content": BRIEF}])
        got = run_team(pool)
        st = pool.stats()
        (bid, blk), = st["shared"]["blocks"].items()
        assert set(blk["members"]) == {"share:brief", *ASKS}
        parked = [a for a, x in st["agents"].items() if x["tier"] == "warm"]
        assert len(parked) == 3
        for a in parked:
            assert st["agents"][a]["block"] == bid
            assert st["agents"][a]["bytes"] < blk["bytes"]  # only the private cells
        assert st["totals"]["block_splits"] >= 3 and st["totals"]["restore_failures"] == 0
        assert st["shared"]["parked_bytes_saved"] > 0
    assert got == want


@pytest.mark.usefixtures("unified_kv_only")
def test_block_refcounts_never_negative_and_free_at_zero(tiny_model_path):
    store = BlockStore()
    b = store.create(np.arange(3), np.zeros(4, np.uint8))
    assert store.release(b.id, "nobody") is True  # no references at all: freed, nothing negative
    with MemoryPool(tiny_model_path, **opts(resident_agents=2)) as pool:
        pool.share("brief", [{"role": "system", "content": BRIEF}])
        for a in ASKS:
            pool.chat(a, team(a), max_tokens=2)
        blocks = pool.stats()["shared"]["blocks"]
        assert len(blocks) == 1 and next(iter(blocks.values()))["refs"] == 4
        for a in [*ASKS, "share:brief"]:
            pool.forget(a)
        assert pool.stats()["shared"]["blocks"] == {}
        assert pool.stats()["totals"]["blocks_freed"] == 1


@pytest.mark.usefixtures("unified_kv_only")
def test_archive_keeps_one_block_with_counted_references(model, tmp_path):
    path = tmp_path / "a.db"
    with MemoryPool(model, **opts(resident_agents=4, archive_path=str(path))) as pool:
        pool.share("brief", [{"role": "system", "content": BRIEF}])
        hist: dict = {}
        hist.update({a: team(a) for a in ASKS})
        # one reply token: the ledger then ends at the prompt, and the next prompt extends it
        # (a cold state has no sliding-window checkpoint to cut back to on gemma3)
        want = run_team(pool, rounds=1, hist=hist, max_tokens=1)
        for a in [*ASKS, "share:brief"]:
            pool.park(a, "cold")
        st = pool.stats()
        (bid, blk), = st["shared"]["blocks"].items()
        assert blk["in_archive"] and blk["archive_refs"] == 4 and not blk["in_ram"]
        cold = {a: x["bytes"] for a, x in st["agents"].items()}
        assert all(cold[a] < blk["bytes"] for a in ASKS)
        assert cold["share:brief"] < 1000  # nothing private at all
        first = [pool.chat(a, hist[a], max_tokens=1) for a in ASKS]  # restores from the archive
        assert [r.kv for r in first] == ["restored"] * 3
        assert pool.stats()["totals"]["restore_failures"] == 0
        for a, r in zip(ASKS, first):
            hist[a] = hist[a] + [{"role": "assistant", "content": r.text}, {"role": "user", "content": "go on"}]
            pool.park(a, "cold")
    with Archive(path, readonly=True) as arc:
        assert [b.refcount for b in arc.list_shared_blocks()] == [4]
    with MemoryPool(model, **opts(resident_agents=4, archive_path=str(path))) as pool:  # restart (same config)
        assert pool.stats()["shared"]["blocks"][bid]["refs"] == 4
        again = [pool.chat(a, hist[a], max_tokens=4) for a in ASKS]
        assert [r.kv for r in again] == ["restored"] * 3
    with MemoryPool(model, **opts(resident_agents=4, min_share_tokens=0)) as ref:  # never parked, no sharing
        for a in ASKS:
            ref.chat(a, hist[a][:-4], max_tokens=1)
            ref.chat(a, hist[a][:-2], max_tokens=1)
        assert [ref.chat(a, hist[a], max_tokens=4).tokens for a in ASKS] == [r.tokens for r in again]
    with MemoryPool(model, **opts(resident_agents=4, archive_path=str(path))) as pool:
        for a in [*ASKS, "share:brief"]:
            pool.forget(a)
    with Archive(path, readonly=True) as arc:
        assert arc.list_shared_blocks() == [] and arc.state_blocks() == {}
    assert want  # the first round ran


@pytest.mark.usefixtures("unified_kv_only")
def test_eviction_inside_a_shared_prefix_does_not_move_the_other_agents_cells(tiny_model_path):
    msgs = team("plan the work")
    with MemoryPool(tiny_model_path, **opts(resident_agents=4, min_share_tokens=0)) as ref:
        want = ref.chat("a", msgs, max_tokens=6).tokens
    with MemoryPool(tiny_model_path, **opts(resident_agents=4, eviction="sliding_window")) as pool:
        pool.chat("a", msgs, max_tokens=6)
        n = len(pool.tokens("a"))
        pool.set_budget("b", n // 2, eviction="streaming_llm")  # b will evict inside the shared brief
        r = pool.chat("b", team("write the code"), max_tokens=6)
        assert r.kv == "shared"
        st = pool.stats()
        assert st["agents"]["b"]["evicted_tokens"] > 0 and st["totals"]["privatized"] >= 1
        assert st["agents"]["b"]["block"] is None  # it no longer holds the block's cells
        a = pool.engine()._core.agents["a"]
        pos = np.sort(parse_state(pool.engine().ctx.state_get(a.seq)).positions)
        assert pos.tolist() == list(range(a.ledger.n_live))  # a's cells were not shifted by b's eviction
        again = pool.chat("a", msgs, max_tokens=6)
        assert again.kv == "reused" and again.tokens == want


def test_waiting_agents_get_a_sequence_by_priority(tiny_model_path):
    import threading
    import time

    with MemoryPool(tiny_model_path, **opts(resident_agents=1)) as pool:
        pool.set_priority("low", "background")
        pool.set_priority("high", "foreground")
        stream = pool.chat_stream("holder", team("talk"), max_tokens=8)
        next(stream)  # the holder is generating: it keeps the only sequence
        order: list[str] = []

        def call(agent: str) -> None:
            pool.chat(agent, team(agent), max_tokens=1)
            order.append(agent)

        threads = []
        for agent in ("low", "high"):  # the low-priority call arrives first
            t = threading.Thread(target=call, args=(agent,))
            t.start()
            threads.append(t)
            deadline = time.monotonic() + 10
            while agent not in pool.engine()._residency.waiters and time.monotonic() < deadline:
                time.sleep(0.005)
            assert agent in pool.engine()._residency.waiters
        stream.drain()
        for t in threads:
            t.join(timeout=30)
        assert order == ["high", "low"]
        assert pool.stats()["totals"]["seq_waits"] >= 2


def test_prefix_index_agrees_with_a_scan():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from agentmem.memory.ledger import Ledger
    from agentmem.memory.shared import PrefixIndex, longest_shared_prefix

    seqs = st.lists(st.integers(0, 3), min_size=0, max_size=12)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 5), seqs), min_size=1, max_size=12), seqs)
    def check(ops, query):
        idx, current = PrefixIndex(), {}
        for version, (agent, toks) in enumerate(ops):
            name = f"a{agent}"
            if not toks and name in current:  # an empty op removes the agent
                idx.remove(name)
                del current[name]
                continue
            idx.sync(name, np.array(toks, np.int32), version=version)
            current[name] = toks
        q = np.array(query, np.int32)
        got = dict(idx.matches(q))
        for name, toks in current.items():
            led = Ledger()
            led.extend(toks, region="user")
            want = longest_shared_prefix(q, [(name, led)])[1]
            assert got.get(name, 0) == want, (name, toks, query, got)
        assert set(got) <= set(current)

    check()


def test_prefix_index_is_refreshed_only_when_a_ledger_changes(tiny_model_path):
    with MemoryPool(tiny_model_path, **opts(resident_agents=4)) as pool:
        pool.chat("a", team("plan the work"), max_tokens=2)
        r = pool.chat("b", team("write the code"), max_tokens=2)
        assert r.kv == "shared"
        idx = pool.engine()._core.prefixes
        assert "a" in idx
        ver = idx._seqs["a"][0]
        pool.chat("c", team("review it"), max_tokens=2)  # a is unchanged: its entry is reused
        assert idx._seqs["a"][0] == ver
        pool.forget("a")
        assert "a" not in idx


def _permuted(blob: np.ndarray, seed: int = 0) -> np.ndarray:
    """The same cells in another order (what a restore into a fragmented cache gives)."""
    out = blob.copy()
    rng = np.random.default_rng(seed)
    for sec in parse_state(blob).sections:
        for st in sec.streams:
            if st.n_cells < 2:
                continue
            perm = rng.permutation(st.n_cells)
            stride = st.cells_size // st.n_cells
            cells = blob[st.cells_offset : st.cells_offset + st.cells_size].reshape(st.n_cells, stride)
            out[st.cells_offset : st.cells_offset + st.cells_size] = cells[perm].reshape(-1)
            for t in st.k + st.v:
                data = blob[t.data_offset : t.data_offset + t.data_size]
                if t.transposed:
                    rows = data.reshape(t.n_embd, t.n_cells, t.row_size)[:, perm, :]
                else:
                    rows = data.reshape(t.n_cells, t.row_size)[perm]
                out[t.data_offset : t.data_offset + t.data_size] = rows.reshape(-1)
    return out


def test_join_finds_shared_cells_by_position_in_any_cell_order(tiny_gemma3_path):
    n, block, blob = share_and_member(tiny_gemma3_path)
    priv, order = split_state(blob, block, n)
    shuffled = _permuted(block)
    assert not np.array_equal(shuffled, block)
    assert np.array_equal(join_state(shuffled, priv, order), blob)
    # a reference missing a needed position is an error, not a wrong blob
    upper, _ = split_state(block, block, n // 2)  # the block's cells at positions >= n // 2 only
    with pytest.raises(CodecError, match="lacks positions"):
        join_state(upper, priv, order)


@pytest.mark.usefixtures("unified_kv_only")
def test_restore_links_the_prefix_of_a_live_member(model):
    with MemoryPool(model, **opts(resident_agents=4)) as ref:
        ref.share("brief", [{"role": "system", "content": BRIEF}])
        want = run_team(ref)
    with MemoryPool(model, **opts(resident_agents=4)) as pool:
        pool.share("brief", [{"role": "system", "content": BRIEF}])
        hist = {a: team(a) for a in ASKS}
        got = run_team(pool, rounds=1, hist=hist)
        for a in [*ASKS, "share:brief"]:
            pool.park(a)
        live_before = pool.stats()["totals"]["hot_cells_bytes"]
        got += run_team(pool, rounds=1, hist=hist)  # the first restore joins, the next ones link
        st = pool.stats()
        assert st["totals"]["linked_restores"] == 2 and st["totals"]["restore_failures"] == 0
        # the three restored agents hold the brief once again
        sizes = [st["agents"][a]["bytes"] for a in ASKS]
        assert st["totals"]["hot_cells_bytes"] < sum(sizes)
        assert live_before == 0
    assert got == want
