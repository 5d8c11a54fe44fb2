"""`kv_layout`: the typed option, the rule `"auto"` follows, and both layouts on a real (tiny) context."""

from __future__ import annotations

import pytest

from agentmem import MemoryPool
from agentmem.config import KV_LAYOUTS, PoolConfig
from agentmem.errors import ConfigError
from agentmem.pool.layout import PER_SEQUENCE_FROM, choose_kv_layout, stream_cells


def test_the_option_is_validated_and_serializable():
    cfg = PoolConfig(kv_layout="per_sequence")
    assert PoolConfig.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["kv_layout"] == "per_sequence"
    assert PoolConfig().kv_layout == "auto" and KV_LAYOUTS == ("auto", "unified", "per_sequence")
    with pytest.raises(ConfigError, match="kv_layout"):
        PoolConfig(kv_layout="streams")


@pytest.mark.parametrize(
    ("n_ctx", "resident", "capacity", "want"),
    [
        (8192, 4, 0, "unified"),  # the default: any agent may fill the context
        (16384, 8, 2048, "per_sequence"),
        (16384, 8, 2049, "unified"),  # one agent's capacity would not fit its stream
        (8192, PER_SEQUENCE_FROM, 8192 // PER_SEQUENCE_FROM, "per_sequence"),
        (8192, PER_SEQUENCE_FROM - 1, 1024, "unified"),  # too few resident agents to gain
        (8192, 1, 1024, "unified"),
    ],
)
def test_auto_follows_the_rule(n_ctx, resident, capacity, want):
    assert choose_kv_layout(PoolConfig(n_ctx=n_ctx, resident_agents=resident, agent_capacity=capacity)) == want


@pytest.mark.parametrize("layout", ["unified", "per_sequence"])
def test_an_explicit_layout_is_kept(layout):
    assert choose_kv_layout(PoolConfig(kv_layout=layout)) == layout
    assert choose_kv_layout(PoolConfig(kv_layout=layout, n_ctx=16384, resident_agents=8, agent_capacity=2048)) == layout


def test_stream_cells_match_llama_cpp(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=1000, resident_agents=3, n_batch=64, prefetch=False, kv_layout="per_sequence") as p:
        assert p.engine().ctx.n_ctx_seq == stream_cells(1000, 3) and not p.engine().ctx.params.kv_unified
        assert p.stats()["totals"]["kv_layout"] == "per_sequence"


@pytest.mark.parametrize("model", ["tiny_model_path", "tiny_gemma3_path"])
def test_both_layouts_give_the_same_greedy_replies(model, request):
    """Three agents on two sequences (parks, restores, a shared prefix copied or tagged)."""
    path = request.getfixturevalue(model)
    brief = {"role": "system", "content": "the team must ship the release on friday and every change needs a review " * 3}
    out: dict[str, list[list[int]]] = {}
    for layout in ("unified", "per_sequence"):
        with MemoryPool(path, n_ctx=2048, resident_agents=2, n_batch=64, prefetch=False, batch_decode=False,
                        kv_layout=layout, min_share_tokens=8) as p:
            assert p.stats()["totals"]["kv_layout"] == layout
            hist = {a: [brief] for a in ("x", "y", "z")}
            got = []
            for k in range(3):
                for a in hist:
                    msgs = hist[a] + [{"role": "user", "content": f"step {k} for {a}"}]
                    r = p.chat(a, msgs, max_tokens=5)
                    got.append(r.tokens)
                    hist[a] = msgs + [{"role": "assistant", "content": r.text}]
            assert p.stats()["totals"]["restores"] > 0
            out[layout] = got
    assert out["unified"] == out["per_sequence"]
