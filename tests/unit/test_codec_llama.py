"""Real llama.cpp state blobs through the codec and back into a context.

On the tiny synthetic models (both a plain ``llama`` KV cache and a ``gemma3`` iSWA
cache, with and without flash attention, i.e. both V layouts): the parser reads
llama.cpp's own blobs, every codec's decoded blob is accepted by
``llama_state_seq_set_data``, an f16 round trip restores the exact bytes, and the
restored sequence continues with logits equal (f16) or close (quantized) to the
original's, and the native and numpy kernels encode the real blobs identically. The last test does the same on the real default model (integration).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel
from agentmem import codec as C
from agentmem.codec import CodecSpec, decode_state, parse_state

SPECS = ["f16", "q8_0", "q4_0", "q8_0/q4_0", "q4_0+rot"]
TEXT = (
    "The parked agent's memory is quantized to eight or four bits per value and restored "
    "into a free sequence, where it continues exactly where it stopped. " * 4
)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p, q = _softmax(p_logits.astype(np.float64)), _softmax(q_logits.astype(np.float64))
    return float(np.sum(p * (np.log(p + 1e-30) - np.log(q + 1e-30))))


@pytest.fixture(params=["llama", "gemma3"])
def tiny_path(request: pytest.FixtureRequest, tiny_model_path: Path, tiny_gemma3_path: Path) -> Path:
    return tiny_model_path if request.param == "llama" else tiny_gemma3_path


@pytest.fixture(params=[True, False], ids=["flash", "no_flash"])
def tiny_ctx(request: pytest.FixtureRequest, tiny_path: Path) -> Iterator[LlamaContext]:
    with LlamaModel(tiny_path) as model:
        params = ContextParams(n_ctx=256, n_seq_max=2, n_threads=1, flash_attn=request.param)
        with LlamaContext(model, params) as ctx:
            yield ctx


def _prefill(ctx: LlamaContext, n: int) -> tuple[list[int], np.ndarray]:
    tokens = ctx.model.tokenize(TEXT, add_special=True)[:n]
    assert len(tokens) == n, len(tokens)
    ctx.decode_run(0, tokens, 0)
    return tokens, ctx.state_get(0)


def test_tiny_blobs_parse_and_round_trip(tiny_ctx: LlamaContext) -> None:
    n = 40
    tokens, blob = _prefill(tiny_ctx, n)
    layout = parse_state(blob)
    gemma = "gemma" in tiny_ctx.model.description().lower() or len(layout.sections) == 2
    assert len(layout.sections) == (2 if gemma else 1)
    assert layout.n_cells == n and layout.positions.tolist() == list(range(n))
    assert layout.seq_id == 0
    v_trans = {s.v_trans for sec in layout.sections for s in sec.streams if s.n_cells}
    assert v_trans == {not tiny_ctx.params.flash_attn}
    assert all(t.type_name == "f16" for t in layout.tensors())

    if "native" in C.KERNELS:  # identical bytes from both implementations on a real blob
        for spec in SPECS:
            a = CodecSpec.parse(spec).encode(blob, kernels="native")
            np.testing.assert_array_equal(a, CodecSpec.parse(spec).encode(blob, kernels="numpy"))
            np.testing.assert_array_equal(decode_state(a, kernels="native"), decode_state(a, kernels="numpy"))

    probe = tokens[-1]
    ref = tiny_ctx.logits(tiny_ctx.decode_run(0, [probe], n))
    for spec in SPECS:
        restored = decode_state(CodecSpec.parse(spec).encode(blob))
        if spec == "f16":
            assert restored.tobytes() == blob.tobytes()
        assert tiny_ctx.state_set(1, restored) > 0, spec
        assert tiny_ctx.seq_pos_max(1) == n - 1
        got = tiny_ctx.logits(tiny_ctx.decode_run(1, [probe], n))
        if spec == "f16":
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        else:
            assert np.all(np.isfinite(got))
            assert _kl(ref, got) < (0.05 if spec == "q8_0" else 0.5), spec
        tiny_ctx.seq_rm(1)


@pytest.mark.integration
def test_default_model_restore_continues() -> None:
    """Gemma 3 270M: a q8_0 restore keeps the next-token distribution (KL < 0.02, same top-1)."""
    from agentmem.model import resolve_model_path

    with LlamaModel(resolve_model_path()) as model:
        params = ContextParams(n_ctx=1024, n_seq_max=2, n_threads=2, flash_attn=True)
        with LlamaContext(model, params) as ctx:
            tokens = model.tokenize(TEXT, add_special=True)
            n = len(tokens)
            ctx.decode_run(0, tokens, 0)
            blob = ctx.state_get(0)
            layout = parse_state(blob)
            assert len(layout.sections) == 2 and layout.n_cells == n
            probe = tokens[-1]
            ref = ctx.logits(ctx.decode_run(0, [probe], n))
            kls = {}
            for spec in SPECS:
                enc = CodecSpec.parse(spec).encode(blob)
                assert ctx.state_set(1, decode_state(enc)) > 0
                got = ctx.logits(ctx.decode_run(1, [probe], n))
                kls[spec] = _kl(ref, got)
                if spec in ("f16", "q8_0"):
                    assert int(np.argmax(got)) == int(np.argmax(ref)), spec
                ctx.seq_rm(1)
            assert kls["f16"] < 1e-6 and kls["q8_0"] < 0.02, kls
            assert min(kls["q4_0"], kls["q4_0+rot"], kls["q8_0/q4_0"]) < 0.2, kls
