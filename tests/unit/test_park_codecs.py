"""Park codecs through the pool on the tiny synthetic models, and a live quantized KV cache.

Contract over every park codec spec (``f16``, ``q8_0``, ``q4_0``, ``q8_0/q4_0``, with
and without rotation), on both tiny architectures (one KV cache / iSWA with two
cache sections): park -> restore continues where the agent stopped (same ledger,
``kv == "restored"``), ``stats()`` names the codec and the parked bytes, and the
quantized sizes follow the block formats. Fidelity is checked on logits through the
lower layer: the tiny models have random weights and many near-ties, so a greedy
token can flip where a real model's would not (``benchmarks/fidelity.py`` measures
the real model). The live-cache tests run the context itself with ``type_k`` /
``type_v`` q8_0.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agentmem import ConfigError, MemoryPool, PolicyError, PoolConfig
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel
from agentmem.codec import decode_state, encode_state, encoded_info, parse_state
from tests.fixtures import tiny_gguf

SPECS = ["f16", "q8_0", "q4_0", "q8_0/q4_0"]
#: KV data bytes per f16 byte: 34 bytes per 32 values (q8_0), 18 (q4_0), f16 64
DATA_RATIO = {"f16": 1.0, "q8_0": 34 / 64, "q4_0": 18 / 64}
POOL = dict(n_ctx=1024, resident_agents=1, n_batch=64, prefetch=False, n_threads=1)
SYSTEM = "you are a helpful bot"


def conv(*turns: str) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for i, t in enumerate(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    return msgs


FIRST = conv("tell me a story about a dog who finds a red ball in the park and brings it home")
OTHER = conv("something else entirely")


def follow(reply: str) -> list[dict[str, str]]:
    return [*FIRST, {"role": "assistant", "content": reply or "ok"}, {"role": "user", "content": "go on"}]


@pytest.fixture(params=["llama", "gemma3"])
def tiny_path(request: pytest.FixtureRequest, tiny_model_path: Path, tiny_gemma3_path: Path) -> Path:
    return tiny_model_path if request.param == "llama" else tiny_gemma3_path


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    lp = p_logits.astype(np.float64) - p_logits.max()
    lp -= np.log(np.exp(lp).sum())
    lq = q_logits.astype(np.float64) - q_logits.max()
    lq -= np.log(np.exp(lq).sum())
    return float(np.sum(np.exp(lp) * (lp - lq)))


def _park_and_restore(path: Path, **options: object) -> dict[str, object]:
    """Chat as ``a``, park it by chatting as ``b``, then continue ``a``: what the pool reported.

    The first call samples one token, which is not decoded, so the next prompt
    extends the parked KV exactly. (A longer random reply may re-tokenize
    differently; the pool then has to cut the restored state back, which an iSWA
    cache cannot do once restored: its sliding-window section holds only the last
    window of cells, and the pool re-prefills instead.)
    """
    with MemoryPool(path, **{**POOL, **options}) as p:
        r1 = p.chat("a", FIRST, max_tokens=1)
        ledger = p.tokens("a")
        p.chat("b", OTHER, max_tokens=4)  # resident_agents=1: parks a
        parked = p.stats()["agents"]["a"]
        state = p.engine()._core.tiers["warm"].get("a")  # the stored object, to check its format
        assert p.tokens("a") == ledger, "parking must not touch the ledger"
        r2 = p.chat("a", follow(r1.text), max_tokens=8)
        after = p.stats()
    return {"r1": r1, "r2": r2, "ledger": ledger, "parked": parked, "state": state, "after": after}


@pytest.mark.parametrize("rotate", [False, True], ids=["plain", "rot"])
@pytest.mark.parametrize("spec", SPECS)
def test_park_restore_continues(tiny_path: Path, spec: str, rotate: bool) -> None:
    out = _park_and_restore(tiny_path, park_codec=spec, park_rotate=rotate)
    r1, r2, parked, state = out["r1"], out["r2"], out["parked"], out["state"]
    assert parked["tier"] == "warm" and parked["codec"] == spec, parked
    assert parked["tokens"] == len(out["ledger"]) and parked["live_tokens"] == len(out["ledger"])
    assert parked["bytes"] == state.nbytes > 0
    assert state.codec == spec and state.n_tokens == len(out["ledger"])
    assert r2.kv == "restored", r2.kv
    # everything the first call decoded is reused, only the new turn is decoded
    assert r2.usage.cached_tokens == r1.usage.prompt_tokens, (r2.usage, r1.usage)
    assert r2.usage.completion_tokens > 0 and r2.finish_reason in ("stop", "length")
    agent = out["after"]["agents"]["a"]
    assert agent["tier"] == "hot" and agent["restores"] == 1 and agent["restore_failures"] == 0, agent
    assert out["after"]["totals"]["restores"] == 1


@pytest.mark.parametrize("spec", ["q8_0", "q4_0", "q8_0/q4_0"])
def test_parked_bytes_follow_the_block_formats(tiny_path: Path, spec: str) -> None:
    """Quantized states shrink K/V data to 34/64 (q8_0) or 18/64 (q4_0) of f16.

    The totals include llama.cpp's cell metadata (12 bytes per cell and cache
    section), which is large next to the tiny models' 32-value rows, so the whole
    state is 0.55-0.57x (q8_0) / 0.32-0.34x (q4_0) of f16 here; on the default model
    (256-value rows) it is 0.532x / 0.283x (``tests/integration/test_park_codecs_real.py``).
    """
    f16 = _park_and_restore(tiny_path, park_codec="f16")["parked"]["bytes"]
    out = _park_and_restore(tiny_path, park_codec=spec)
    info = encoded_info(out["state"].data)
    assert info.original_bytes == f16, (info.original_bytes, f16)
    kv = parse_state(decode_state(out["state"].data)).kv_bytes
    k, v = (spec.split("/") * 2)[:2]
    expect_kv = kv / 2 * (DATA_RATIO[k] + DATA_RATIO[v])  # K and V tensors hold the same number of values
    meta = f16 - kv
    header = out["parked"]["bytes"] - meta - expect_kv
    assert 0 <= header <= 64, f"{header=}, {meta=}, {kv=}"
    ratio = out["parked"]["bytes"] / f16
    bound = {"q8_0": 0.58, "q4_0": 0.35, "q8_0/q4_0": 0.47}[spec]
    assert ratio <= bound, f"{spec}: {ratio=:.3f}"
    if spec in ("q8_0", "q4_0"):
        assert expect_kv / kv <= (0.55 if spec == "q8_0" else 0.30)


def test_f16_restore_identical_to_never_parked(tiny_path: Path) -> None:
    restored = _park_and_restore(tiny_path, park_codec="f16")["r2"]
    with MemoryPool(tiny_path, **POOL) as p:
        r1 = p.chat("a", FIRST, max_tokens=1)
        never = p.chat("a", follow(r1.text), max_tokens=8)
    assert restored.tokens == never.tokens


@pytest.mark.parametrize(("spec", "bad"), [("q3_k", "q3_k"), ("int8", "int8"), ("q8_0/q2", "q2")])
def test_unknown_codec_is_a_policy_error_listing_names(tiny_model_path: Path, spec: str, bad: str) -> None:
    with pytest.raises(PolicyError, match=f"unknown codec '{bad}'") as exc:
        MemoryPool(tiny_model_path, park_codec=spec, **POOL)
    for valid in ("f16", "q8_0", "q4_0"):
        assert valid in str(exc.value), str(exc.value)


@pytest.mark.parametrize("spec", ["f16/", "q8_0/q4_0/f16"])
def test_malformed_codec_spec_is_a_policy_error(tiny_model_path: Path, spec: str) -> None:
    with pytest.raises(PolicyError, match="KEYS/VALUES"):
        MemoryPool(tiny_model_path, park_codec=spec, **POOL)


def test_unknown_cold_codec_is_a_policy_error(tiny_model_path: Path, tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="q8_0"):
        MemoryPool(tiny_model_path, cold_codec="q5_k", archive_path=str(tmp_path / "a.db"), **POOL)


# --------------------------------------------------------------------------- lower layer: logits
PROMPTS = [
    "the cat sat on the mat and looked at the bird outside the window",
    "one two three four five six seven eight nine ten eleven twelve",
    "<start_of_turn>user\nwrite a short poem about the sea<end_of_turn>\n<start_of_turn>model\n",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "la ville s'éveillait lentement, et les boulangers avaient déjà sorti le pain",
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu",
]


@pytest.fixture()
def tiny_ctx(tiny_path: Path) -> Iterator[LlamaContext]:
    with LlamaModel(tiny_path) as model:
        with LlamaContext(model, ContextParams(n_ctx=512, n_seq_max=2, n_threads=1)) as ctx:
            yield ctx


@pytest.mark.parametrize("spec", SPECS)
def test_restored_logits_close_to_never_parked(tiny_ctx: LlamaContext, spec: str) -> None:
    """The next token after a round trip: f16 bit-identical, q8_0 KL < 0.01, 4-bit KL < 0.1.

    A blob holds no logits, so both sequences decode the prompt's last token, in one
    batch (same arithmetic for both).
    """
    k, v = (spec.split("/") * 2)[:2]
    kls, top1 = [], []
    for text in PROMPTS:
        toks = tiny_ctx.model.tokenize(text, add_special=True)
        n = len(toks)
        tiny_ctx.clear()
        tiny_ctx.decode_run(0, toks[:-1], 0)
        blob = tiny_ctx.state_get(0)
        restored = decode_state(encode_state(blob, k_codec=k, v_codec=v))
        assert tiny_ctx.state_set(1, restored) > 0
        assert tiny_ctx.seq_pos_max(1) == n - 2
        i0, i1 = tiny_ctx.decode_multi([(0, [toks[-1]], n - 1), (1, [toks[-1]], n - 1)])
        ref, got = tiny_ctx.logits(i0), tiny_ctx.logits(i1)
        if spec == "f16":
            np.testing.assert_array_equal(got, ref)
        kls.append(_kl(ref, got))
        top1.append(int(np.argmax(got)) == int(np.argmax(ref)))
    bound = {"f16": 0.0, "q8_0": 0.01}.get(spec, 0.1)
    assert max(kls) <= bound, f"{spec}: {kls=}"
    if spec in ("f16", "q8_0"):
        assert all(top1), f"{spec}: {top1=}"


def test_q8_0_pool_continuation_matches_never_parked_on_most_prompts(tiny_path: Path) -> None:
    """Greedy replies after a q8_0 park/restore equal the never-parked ones on most prompts."""
    prompts = PROMPTS[:4]
    restored, never = [], []
    with MemoryPool(tiny_path, **{**POOL, "park_codec": "q8_0"}) as p:
        for i, text in enumerate(prompts):
            p.chat(f"a{i}", conv(text), max_tokens=1)
            p.chat(f"b{i}", OTHER, max_tokens=1)  # one sequence: parks a{i}
            r = p.chat(f"a{i}", conv(text, "ok", "and then"), max_tokens=8)
            assert r.kv == "restored"
            restored.append(r.tokens)
    with MemoryPool(tiny_path, **POOL) as p:
        for i, text in enumerate(prompts):
            p.chat(f"a{i}", conv(text), max_tokens=1)
            never.append(p.chat(f"a{i}", conv(text, "ok", "and then"), max_tokens=8).tokens)
    same = sum(a == b for a, b in zip(restored, never))
    assert same >= len(prompts) // 2 + 1, f"{same}/{len(prompts)} identical"


# --------------------------------------------------------------------------- live quantized cache
@pytest.fixture(scope="module", params=["llama", "gemma3"])
def wide_head_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with 32-value heads (2 heads, 2 KV heads, n_embd 64).

    llama.cpp quantizes a KV cache in 32-value blocks along each head, so a q8_0 cache
    needs head dimensions divisible by 32; the shared tiny fixtures have 16 (context
    creation then fails with "K cache type q8_0 with block size 32 does not divide
    n_embd_head_k=16").
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiny_gguf, "_N_HEAD", 2)
        mp.setattr(tiny_gguf, "_N_HEAD_KV", 2)
        mp.setattr(tiny_gguf, "_HEAD_DIM", 32)
        path = tmp_path_factory.mktemp(f"wide-{request.param}") / f"wide-{request.param}.gguf"
        return tiny_gguf.build_tiny_gguf(path, arch=request.param)


@pytest.mark.parametrize("park_codec", ["f16", "q8_0"])
def test_live_q8_0_cache_chats_parks_and_restores(wide_head_path: Path, park_codec: str) -> None:
    """A q8_0 live cache: the state is already q8_0 (about half of f16) and restores exactly.

    A parked q8_0 blob passes through any park codec unchanged (only f16 tensors are
    quantized), so the restored agent continues exactly as if never parked.
    """
    tiny_path = wide_head_path
    live = dict(type_k="q8_0", type_v="q8_0", flash_attn=True)
    out = _park_and_restore(tiny_path, park_codec=park_codec, **live)
    f16_bytes = _park_and_restore(tiny_path, park_codec="f16")["parked"]["bytes"]
    assert out["r2"].kv == "restored"
    assert out["after"]["agents"]["a"]["codec"] == "q8_0"  # a hot agent reports the live cache type
    assert out["parked"]["tier"] == "warm"
    assert out["parked"]["bytes"] <= 0.6 * f16_bytes, (out["parked"]["bytes"], f16_bytes)
    layout = parse_state(decode_state(out["state"].data) if park_codec != "f16" else out["state"].data)
    assert {t.type_name for t in layout.tensors()} == {"q8_0"}
    with MemoryPool(tiny_path, **{**POOL, **live}) as p:
        r1 = p.chat("a", FIRST, max_tokens=1)
        never = p.chat("a", follow(r1.text), max_tokens=8)
    assert out["r2"].tokens == never.tokens


def test_quantized_v_cache_without_flash_attention_is_a_config_error(tiny_model_path: Path) -> None:
    with pytest.raises(ConfigError, match="flash_attn"):
        PoolConfig(type_v="q8_0", flash_attn=False)
    with pytest.raises(ConfigError, match="flash_attn"):
        MemoryPool(tiny_model_path, type_k="q8_0", type_v="q8_0", flash_attn=False, **POOL)
    with LlamaModel(tiny_model_path) as model:
        with pytest.raises(ConfigError, match="flash_attn"):
            LlamaContext(model, ContextParams(n_ctx=256, type_v="q8_0", flash_attn=False))



def test_quantized_k_cache_alone_works_without_flash_attention(wide_head_path: Path) -> None:
    with MemoryPool(wide_head_path, type_k="q8_0", flash_attn=False, **POOL) as p:
        assert p.chat("a", FIRST, max_tokens=2).usage.completion_tokens > 0
