"""Codecs, kernels and the encoded format of agentmem.codec.

* contract tests over every registered codec (round trip, sizes, pass-through);
* the native kernels (AVX2 and portable C) against the numpy kernels, bit for bit,
  on random and adversarial values (zeros, -0, ties, subnormals, inf, NaN);
* the q8_0/q4_0 blocks against ggml's own reference quantizers, loaded from the
  libggml-base shipped with llama-cpp-python;
* the encoded container: header, checksum verified before decode, ``out=`` buffers.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from agentmem.errors import CodecError, ConfigError, PolicyError
from agentmem import codec as C
from agentmem.codec import container as codec_container
from agentmem.codec import kernels as codec_kernels
from agentmem.codec import (
    CODECS,
    CodecSpec,
    decode_state,
    encode_state,
    encoded_info,
    get_codec,
    get_kernels,
    parse_state,
)
from tests.unit.test_codec_blobs import SectionSpec, StreamSpec, iswa_blob, make_blob

HAS_NATIVE = "native" in C.KERNELS
needs_native = pytest.mark.skipif(not HAS_NATIVE, reason="agentmem._native is not built")
QUANT = [(C.GGML_Q8_0, 34), (C.GGML_Q4_0, 18)]
SPECS = ["f16", "q8_0", "q4_0", "q8_0/q4_0", "q4_0/q8_0", "f16/q4_0", "q4_0+rot", "q8_0+rot32", "q8_0/q4_0+rot"]


# --------------------------------------------------------------------------- helpers


def adversarial_f16(n: int, seed: int) -> np.ndarray:
    """f16 values mixing scales, exact zeros and -0, +/- ties, subnormals, inf and NaN."""
    rng = np.random.default_rng(seed)
    scales = rng.choice([0.0, 1e-7, 1e-4, 0.01, 1.0, 30.0, 3000.0, 60000.0], size=-(-n // 32)).repeat(32)[:n]
    x = np.clip(rng.standard_normal(n) * scales, -65504, 65504).astype(np.float16)
    bits = x.view(np.uint16)
    pick = rng.random(n)
    bits[pick < 0.01] = 0x8000  # -0
    bits[(pick >= 0.01) & (pick < 0.02)] = rng.integers(1, 0x400, size=int(((pick >= 0.01) & (pick < 0.02)).sum()))
    x[(pick >= 0.02) & (pick < 0.025)] = np.float16(np.inf)
    x[(pick >= 0.025) & (pick < 0.03)] = np.float16(-np.inf)
    x[(pick >= 0.03) & (pick < 0.035)] = np.float16(np.nan)
    bits[(pick >= 0.035) & (pick < 0.04)] = 0x7C01  # a signalling NaN
    if n >= 64:  # a block whose largest magnitude appears with both signs (q4_0 tie rule)
        x[32:64] = np.float16(0.5)
        x[40] = np.float16(-3.0)
        x[50] = np.float16(3.0)
    return x


def quantize_with(kernels: str, type_id: int, x: np.ndarray, rot: int) -> np.ndarray:
    n = x.size
    out = np.full(codec_kernels._encoded_size(type_id, n, rot), 0xAA, dtype=np.uint8)
    get_kernels(kernels).quantize(type_id, x.view(np.uint8), out, n, rot)
    return out


def dequantize_with(kernels: str, type_id: int, q: np.ndarray, n: int, rot: int) -> np.ndarray:
    out = np.full(2 * n, 0xAA, dtype=np.uint8)
    get_kernels(kernels).dequantize(type_id, q, out, n, rot)
    return out


# --------------------------------------------------------------------------- registry / spec


def test_registry_names_and_errors() -> None:
    assert list(CODECS) == ["f16", "q8_0", "q4_0"]
    assert get_codec("q8_0") is CODECS["q8_0"]
    assert get_codec(CODECS["q4_0"]) is CODECS["q4_0"]
    with pytest.raises(PolicyError, match="valid codecs: f16, q8_0, q4_0"):
        get_codec("q5_0")
    assert issubclass(PolicyError, ValueError)


@pytest.mark.parametrize(
    ("text", "k", "v", "rot", "name"),
    [
        ("f16", "f16", "f16", 0, "f16"),
        ("q8_0", "q8_0", "q8_0", 0, "q8_0"),
        ("q8_0/q4_0", "q8_0", "q4_0", 0, "q8_0/q4_0"),
        (" Q4_0+ROT ", "q4_0", "q4_0", 64, "q4_0+rot"),
        ("q4_0+rot64", "q4_0", "q4_0", 64, "q4_0+rot"),
        ("q8_0/q4_0+rot32", "q8_0", "q4_0", 32, "q8_0/q4_0+rot32"),
    ],
)
def test_codec_spec_parse(text: str, k: str, v: str, rot: int, name: str) -> None:
    spec = CodecSpec.parse(text)
    assert (spec.k, spec.v, spec.rotate, spec.name) == (k, v, rot, name)
    assert CodecSpec.parse(spec.name) == spec


@pytest.mark.parametrize("text", ["", "q8", "q8_0/", "q8_0/q4_0/f16", "q4_0+rot16", "q4_0+", "int8", None])
def test_codec_spec_rejects(text: object) -> None:
    with pytest.raises(PolicyError, match="f16, q8_0, q4_0"):
        CodecSpec.parse(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("kernels", list(C.KERNELS))
def test_codec_strategy_contract(name: str, kernels: str) -> None:
    """Every registered codec sizes, encodes and decodes one tensor's f16 values."""
    codec = get_codec(name)
    x = (np.random.default_rng(8).standard_normal(300) * 3).astype("<f2")
    for rot in (0, 32, 64):
        size = codec.encoded_size(x.size, rot)
        assert size == (2 * x.size if not codec.quantized else codec_kernels._encoded_size(codec.codec_id, x.size, rot))
        enc = np.zeros(size, np.uint8)
        codec.encode(get_kernels(kernels), x.view(np.uint8), enc, x.size, rot)
        out = np.zeros(2 * x.size, np.uint8)
        codec.decode(get_kernels(kernels), enc, out, x.size, rot)
        y = out.view("<f2").astype(np.float32)
        err = np.abs(y - x.astype(np.float32)).max()
        assert err <= {"f16": 0.0, "q8_0": 0.1, "q4_0": 2.0}[name], (name, rot, err)
    assert codec.bits_per_value == {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5}[name]
    assert repr(codec) == f"{type(codec).__name__}({name!r})"


def test_rotate_argument_validation() -> None:
    with pytest.raises(ConfigError):
        encode_state(make_blob(), k_codec="f16", rotate=7)
    with pytest.raises(ConfigError):
        encode_state(make_blob(), k_codec="q4_0", rotate=16)
    with pytest.raises(ConfigError):
        CodecSpec("q4_0", "q4_0", 48)
    with pytest.raises(ConfigError):
        C.hadamard(np.zeros(64, np.float32), 16)


def test_env_var_forces_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTMEM_NO_NATIVE", "1")
    assert get_kernels().name == "numpy"
    monkeypatch.setenv("AGENTMEM_NO_NATIVE", "0")
    assert get_kernels().name == ("native" if HAS_NATIVE else "numpy")
    with pytest.raises(PolicyError, match="numpy"):
        get_kernels("cuda")


# --------------------------------------------------------------------------- kernels


SIZES = [0, 1, 31, 32, 33, 64, 100, 255, 256, 257, 511, 1000, 4099]


@needs_native
@pytest.mark.parametrize("simd", [True, False], ids=["simd", "portable"])
@pytest.mark.parametrize("rot", [0, 32, 64])
@pytest.mark.parametrize(("type_id", "bb"), QUANT, ids=["q8_0", "q4_0"])
def test_native_equals_numpy(type_id: int, bb: int, rot: int, simd: bool) -> None:
    native = C.KERNELS["native"]._m  # type: ignore[attr-defined]
    prev = native.set_simd(simd)
    try:
        for i, n in enumerate(SIZES):
            x = adversarial_f16(n, seed=i + 10 * rot + type_id)
            qn = quantize_with("native", type_id, x, rot)
            qp = quantize_with("numpy", type_id, x, rot)
            assert qn.size == codec_kernels._encoded_size(type_id, n, rot)
            np.testing.assert_array_equal(qn, qp, err_msg=f"quantize n={n}")
            dn = dequantize_with("native", type_id, qn, n, rot)
            dp = dequantize_with("numpy", type_id, qn, n, rot)
            np.testing.assert_array_equal(dn, dp, err_msg=f"dequantize n={n}")
    finally:
        native.set_simd(prev)


@needs_native
@pytest.mark.parametrize("simd", [True, False], ids=["simd", "portable"])
def test_dequantize_arbitrary_blocks_native_equals_numpy(simd: bool) -> None:
    """Blocks that no encoder writes (huge, infinite or NaN scales, q8_0 value -128)
    still decode to the same, finite bytes on every path (saturated to +/-65504)."""
    native = C.KERNELS["native"]._m  # type: ignore[attr-defined]
    prev = native.set_simd(simd)
    try:
        rng = np.random.default_rng(11)
        for type_id, bb in QUANT:
            for rot in (0, 32, 64):
                n = 64 * 20 + 17
                q = rng.integers(0, 256, codec_kernels._encoded_size(type_id, n, rot), dtype=np.uint8)
                scales = q.reshape(-1, bb)[:, :2].view("<u2")
                # inf, NaN, the largest f16, and both sides of the kernels' no-saturation limits
                special = [0x7C00, 0xFC00, 0x7E00, 0x7BFF, 0xFBFF, 0x0001, 0x3C00, 0x5FFF, 0x6000, 0x6FFF, 0xF000]
                scales[::2, 0] = rng.choice(special, size=scales[::2].shape[0])
                a = dequantize_with("native", type_id, q, n, rot)
                b = dequantize_with("numpy", type_id, q, n, rot)
                np.testing.assert_array_equal(a, b, err_msg=f"{type_id=} {rot=}")
                assert np.all(np.isfinite(a.view("<f2")))
    finally:
        native.set_simd(prev)


@needs_native
def test_native_random_blocks_equal_numpy_bulk() -> None:
    """A larger random run through the chunked (8 blocks at a time) SIMD path."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(64 * 1024 + 77) * 4).astype(np.float16)
    for type_id, _ in QUANT:
        for rot in (0, 64):
            qn = quantize_with("native", type_id, x, rot)
            np.testing.assert_array_equal(qn, quantize_with("numpy", type_id, x, rot))
            np.testing.assert_array_equal(
                dequantize_with("native", type_id, qn, x.size, rot),
                dequantize_with("numpy", type_id, qn, x.size, rot),
            )


def _libggml() -> ctypes.CDLL | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    libdir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (libdir / name).exists():
            lib = ctypes.CDLL(str(libdir / name))
            for fn in ("quantize_row_q8_0_ref", "quantize_row_q4_0_ref", "dequantize_row_q8_0", "dequantize_row_q4_0"):
                getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
                getattr(lib, fn).restype = None
            return lib
    return None


@pytest.mark.parametrize("kernels", ["numpy", pytest.param("native", marks=needs_native)])
@pytest.mark.parametrize(("type_id", "bb"), QUANT, ids=["q8_0", "q4_0"])
def test_blocks_match_ggml_reference(type_id: int, bb: int, kernels: str) -> None:
    """Finite inputs give exactly ggml's quantize_row_*_ref blocks and dequantize_row_* values."""
    lib = _libggml()
    if lib is None:
        pytest.skip("libggml-base from llama-cpp-python not found")
    x = adversarial_f16(32 * 600, seed=3)
    x[~np.isfinite(x)] = 0  # ggml leaves non-finite input undefined
    x32 = x.astype(np.float32)
    ref = np.zeros(x.size // 32 * bb, np.uint8)
    name = "q8_0" if type_id == C.GGML_Q8_0 else "q4_0"
    getattr(lib, f"quantize_row_{name}_ref")(x32.ctypes.data, ref.ctypes.data, x.size)
    ours = quantize_with(kernels, type_id, x, 0)
    np.testing.assert_array_equal(ours, ref)
    back = np.zeros(x.size, np.float32)
    getattr(lib, f"dequantize_row_{name}")(ref.ctypes.data, back.ctypes.data, x.size)
    expected = np.clip(back, -65504, 65504).astype("<f2")  # ours saturates where f16 would overflow
    np.testing.assert_array_equal(dequantize_with(kernels, type_id, ours, x.size, 0), expected.view(np.uint8))


def test_quantization_error_is_bounded() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(32 * 512).astype(np.float16)
    xf = x.astype(np.float32)
    for type_id, rel in ((C.GGML_Q8_0, 0.01), (C.GGML_Q4_0, 0.15)):
        for rot in (0, 32, 64):
            q = quantize_with("numpy", type_id, x, rot)
            y = dequantize_with("numpy", type_id, q, x.size, rot).view("<f2").astype(np.float32)
            err = np.sqrt(np.mean((y - xf) ** 2)) / np.sqrt(np.mean(xf**2))
            assert err < rel, f"{type_id=} {rot=} {err=}"


def test_non_finite_inputs_quantize_as_zero() -> None:
    x = np.zeros(32, np.float16)
    x[:4] = [np.inf, -np.inf, np.nan, 2.0]
    for kernels in C.KERNELS:
        for type_id, _ in QUANT:
            y = dequantize_with(kernels, type_id, quantize_with(kernels, type_id, x, 0), 32, 0).view("<f2")
            assert np.all(np.isfinite(y)) and y[3] == 2.0 and np.all(y[:3] == 0) and np.all(y[4:] == 0)


@pytest.mark.parametrize("kernels", ["numpy", pytest.param("native", marks=needs_native)])
def test_hadamard_is_orthonormal_and_self_inverse(kernels: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(64 * 50).astype(np.float32)
    for block in (32, 64):
        y = C.hadamard(x, block, kernels=kernels)
        assert np.allclose(np.linalg.norm(y), np.linalg.norm(x), rtol=1e-5)
        assert np.allclose(C.hadamard(y, block, kernels=kernels), x, atol=1e-5)
        e = np.zeros(block, np.float32)
        e[0] = 1
        assert np.allclose(C.hadamard(e, block, kernels=kernels), 1 / np.sqrt(block))
    with pytest.raises(ConfigError):
        C.hadamard(np.zeros(40, np.float32), 32)


@needs_native
@pytest.mark.parametrize("simd", [True, False], ids=["simd", "portable"])
def test_hadamard_native_equals_numpy(simd: bool) -> None:
    native = C.KERNELS["native"]._m  # type: ignore[attr-defined]
    prev = native.set_simd(simd)
    try:
        x = (np.random.default_rng(2).standard_normal(64 * 100) * 100).astype(np.float32)
        for block in (32, 64):
            np.testing.assert_array_equal(
                C.hadamard(x, block, kernels="native").view(np.uint32),
                C.hadamard(x, block, kernels="numpy").view(np.uint32),
            )
    finally:
        native.set_simd(prev)


@needs_native
def test_native_argument_checks() -> None:
    native = C.KERNELS["native"]._m  # type: ignore[attr-defined]
    src = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="unknown quantized type"):
        native.quantize(1, src, np.zeros(100, np.uint8), 32, 0)
    with pytest.raises(ValueError, match="rotation"):
        native.quantize(8, src, np.zeros(100, np.uint8), 32, 16)
    with pytest.raises(ValueError, match="source holds"):
        native.quantize(8, src, np.zeros(100, np.uint8), 33, 0)
    with pytest.raises(ValueError, match="destination holds"):
        native.quantize(8, src, np.zeros(33, np.uint8), 32, 0)
    with pytest.raises(ValueError, match="source holds"):
        native.dequantize(2, np.zeros(17, np.uint8), np.zeros(64, np.uint8), 32, 0)
    with pytest.raises(TypeError):
        native.dequantize(2, np.zeros(18, np.uint8), b"\0" * 64, 32, 0)  # read-only destination
    assert native.encoded_size(8, 33, 0) == 68 and native.encoded_size(2, 33, 64) == 36
    assert native.simd() in ("avx2+f16c", "portable")


# --------------------------------------------------------------------------- checksum


@pytest.mark.parametrize("simd", [True, False], ids=["simd", "portable"])
def test_checksum_native_equals_numpy(simd: bool) -> None:
    if not HAS_NATIVE:
        pytest.skip("agentmem._native is not built")
    native = C.KERNELS["native"]._m  # type: ignore[attr-defined]
    prev = native.set_simd(simd)
    try:
        data = np.random.default_rng(4).integers(0, 256, 5000, dtype=np.uint8)
        for n in [*range(80), 1000, 4097, 5000]:
            assert C.checksum(data[:n], kernels="native") == C.checksum(data[:n], kernels="numpy"), n
        big = np.random.default_rng(6).integers(0, 256, 8 * 150_000 + 5, dtype=np.uint8)  # > 2 numpy chunks
        assert C.checksum(big, kernels="native") == C.checksum(big, kernels="numpy")
        assert C.checksum(big[1:], kernels="native") == C.checksum(big[1:], kernels="numpy")  # unaligned
    finally:
        native.set_simd(prev)


def test_checksum_detects_every_single_bit_flip_and_swaps() -> None:
    data = bytearray(np.random.default_rng(5).integers(0, 256, 300, dtype=np.uint8).tobytes())
    base = C.checksum(data)
    seen = {base}
    for i in range(len(data) * 8):
        data[i // 8] ^= 1 << (i % 8)
        h = C.checksum(data)
        data[i // 8] ^= 1 << (i % 8)
        assert h != base, f"bit {i} undetected"
        seen.add(h)
    assert len(seen) == len(data) * 8 + 1
    swapped = bytes(data[8:16] + data[0:8] + data[16:])
    assert C.checksum(swapped) != base
    assert C.checksum(bytes(data) + b"\0") != base  # length is mixed in
    assert C.checksum(b"") != C.checksum(b"\0")


# --------------------------------------------------------------------------- encode / decode


BLOBS = {
    "plain": lambda: make_blob(),
    "iswa": lambda: iswa_blob(),
    "iswa_vtrans": lambda: iswa_blob(v_trans=True),
    "odd_sizes": lambda: make_blob(
        [SectionSpec([StreamSpec(n_cells=7, n_layer=3, n_embd=48), StreamSpec(n_cells=0)])], seed=2
    ),
    "vtrans_odd": lambda: make_blob([SectionSpec([StreamSpec(n_cells=13, n_embd=40, v_trans=True)])], seed=3),
    "mixed_types": lambda: make_blob([SectionSpec([StreamSpec(k_type=8, v_type=1), StreamSpec(k_type=1, v_type=0)])]),
    "bf16": lambda: make_blob([SectionSpec([StreamSpec(k_type=30, v_type=30)])]),
    "multi_seq": lambda: make_blob([SectionSpec([StreamSpec(n_cells=3, seq_ids=[[0, 1], [1], [0, 2]])])]),
    "ext": lambda: make_blob([SectionSpec([StreamSpec(ext=12)])]),
    "empty": lambda: make_blob([SectionSpec([StreamSpec(n_cells=0)])]),
}


def _ext(name: str) -> int:
    return 12 if name == "ext" else 0


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("blob_name", list(BLOBS))
def test_round_trip_every_codec(blob_name: str, spec: str) -> None:
    """Contract test: every codec spec round-trips every blob shape."""
    blob = BLOBS[blob_name]()
    cs = CodecSpec.parse(spec)
    enc = cs.encode(blob, cell_ext_size=_ext(blob_name))
    info = encoded_info(enc)
    assert info.original_bytes == len(blob) and info.n_bytes == len(enc)
    assert info.k_codec == cs.k and info.v_codec == cs.v and info.codec == cs.name
    out = decode_state(enc)
    assert out.dtype == np.uint8 and out.size == len(blob)
    before = parse_state(blob, cell_ext_size=_ext(blob_name))
    after = parse_state(out, cell_ext_size=_ext(blob_name))
    assert [t.header_offset for t in before.tensors()] == [t.header_offset for t in after.tensors()]
    raw = np.frombuffer(blob, np.uint8)
    gaps_equal = np.ones(raw.size, bool)
    for t in before.tensors():
        codec = get_codec(cs.k if t.kind == "k" else cs.v)
        seg = slice(t.data_offset, t.data_offset + t.data_size)
        if t.ggml_type == C.GGML_F16 and codec.quantized:
            gaps_equal[seg] = False
            a = raw[seg].view("<f2").astype(np.float32)
            b = out[seg].view("<f2").astype(np.float32)
            tol = 0.02 if codec.name == "q8_0" else 0.3
            assert np.sqrt(np.mean((a - b) ** 2)) <= tol * max(1e-3, float(np.sqrt(np.mean(a**2))))
    # headers, cell metadata and every non-quantized tensor come back byte for byte
    np.testing.assert_array_equal(out[gaps_equal], raw[gaps_equal])
    if cs.k == "f16" and cs.v == "f16":
        assert out.tobytes() == blob


@pytest.mark.parametrize("spec", SPECS)
def test_native_and_numpy_encodings_are_identical(spec: str) -> None:
    if not HAS_NATIVE:
        pytest.skip("agentmem._native is not built")
    for make in BLOBS.values():
        blob = make()
        ext = 12 if make is BLOBS["ext"] else 0
        a = CodecSpec.parse(spec).encode(blob, cell_ext_size=ext, kernels="native")
        b = CodecSpec.parse(spec).encode(blob, cell_ext_size=ext, kernels="numpy")
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(decode_state(a, kernels="native"), decode_state(a, kernels="numpy"))


def test_encoded_sizes_track_bits_per_value() -> None:
    blob = make_blob([SectionSpec([StreamSpec(n_cells=256, n_layer=2, n_embd=256)])])
    kv = parse_state(blob).kv_bytes
    for spec, ratio in (("q8_0", 34 / 64), ("q4_0", 18 / 64), ("q8_0/q4_0", 26 / 64)):
        enc = encode_state(blob, k_codec=spec.split("/")[0], v_codec=spec.split("/")[-1])
        overhead = len(blob) - kv + codec_container._HEADER.size + codec_container._TRAILER.size
        assert len(enc) == overhead + kv * ratio, spec


def test_encode_returns_read_only_array_and_decode_into_out() -> None:
    blob = iswa_blob()
    enc = encode_state(blob, k_codec="q8_0", v_codec="q4_0")
    assert isinstance(enc, np.ndarray) and not enc.flags.writeable
    buf = np.zeros(len(blob) + 100, np.uint8)
    res = decode_state(enc, out=buf)
    assert res.base is buf or np.shares_memory(res, buf)
    np.testing.assert_array_equal(res, decode_state(enc))
    arena = np.zeros(enc.size + 10, np.uint8)
    enc2 = encode_state(blob, k_codec="q8_0", v_codec="q4_0", out=arena)
    assert np.shares_memory(enc2, arena) and not enc2.flags.writeable and arena.flags.writeable
    np.testing.assert_array_equal(enc2, enc)
    with pytest.raises(CodecError, match="out holds"):
        encode_state(blob, k_codec="q8_0", out=arena[:100])
    with pytest.raises(CodecError, match="contiguous"):
        decode_state(enc, out=np.zeros(2 * len(blob), np.uint8)[::2])
    with pytest.raises(CodecError, match="out holds"):
        decode_state(enc, out=np.zeros(len(blob) - 1, np.uint8))
    with pytest.raises(CodecError, match="writable"):
        decode_state(enc, out=np.zeros(len(blob), np.float32))
    for obj in (enc.tobytes(), bytearray(enc.tobytes()), memoryview(enc.tobytes())):
        np.testing.assert_array_equal(decode_state(obj), res)


def test_encode_rejects_bad_blob_and_codec() -> None:
    with pytest.raises(CodecError, match="magic"):
        encode_state(b"\0" * 64, k_codec="q8_0")
    with pytest.raises(PolicyError):
        encode_state(make_blob(), k_codec="q3_k")


def test_is_encoded() -> None:
    enc = encode_state(make_blob(), k_codec="q8_0")
    assert C.is_encoded(enc) and C.is_encoded(enc.tobytes())
    assert not C.is_encoded(make_blob()) and not C.is_encoded(b"AM") and not C.is_encoded(object())


def _encoded(spec: str = "q8_0/q4_0") -> bytearray:
    return bytearray(CodecSpec.parse(spec).encode(iswa_blob()).tobytes())


def _reseal(buf: bytearray) -> bytearray:
    """Recompute the trailing checksum, so a test reaches the checks behind it."""
    struct.pack_into("<Q", buf, len(buf) - 8, C.checksum(bytes(buf[:-8])))
    return buf


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:20], "truncated"),
        (lambda b: b"XXXX" + b[4:], "not an agentmem encoded state"),
        (lambda b: b[:4] + struct.pack("<H", 2) + b[6:], "version 2"),
        (lambda b: b[:6] + bytes([9]) + b[7:], "unknown codec ids"),
        (lambda b: b[:8] + bytes([16]) + b[9:], "rotation"),
        (lambda b: b[:9] + bytes([7]) + b[10:], "checksum algorithm"),
        (lambda b: b[:12] + b"\1\0\0\0" + b[16:], "reserved"),
        (lambda b: b[:-1], "does not match its header"),
        (lambda b: b + b"\0", "does not match its header"),
        (lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], "checksum mismatch"),
        (lambda b: b[:-3] + bytes([b[-3] ^ 0x10]) + b[-2:], "checksum mismatch"),
        (lambda b: _reseal(b[:16] + struct.pack("<Q", 5) + b[24:]), "header says 5"),
        (lambda b: _reseal(b[:6] + bytes([2, 2]) + b[8:]), "encoded payload"),
        (lambda b: _reseal(b[:32] + b"\0\0\0\0" + b[36:]), "magic"),
    ],
)
def test_decode_rejects_corrupted_or_foreign_data(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    bad = bytes(mutate(_encoded()))
    with pytest.raises(CodecError, match=message):
        decode_state(bad)


def test_encoded_info_is_cheap_and_checks_the_header() -> None:
    enc = _encoded("q4_0+rot32")
    info = encoded_info(enc)
    assert (info.k_codec, info.v_codec, info.rotate, info.format_version) == ("q4_0", "q4_0", 32, 1)
    assert info.codec == "q4_0+rot32" and 0 < info.ratio < 0.5
    with pytest.raises(CodecError):
        encoded_info(enc[:10])


def test_f16_only_spec_does_not_record_rotation() -> None:
    enc = encode_state(make_blob(), k_codec="f16", rotate=True)
    assert encoded_info(enc).rotate == 0
    assert decode_state(enc).tobytes() == make_blob()


def test_module_docstring_names_the_classes() -> None:
    doc = C.__doc__ or ""
    for name in ("StateLayout", "Codec", "CodecSpec", "Kernels", "EncodedInfo", "AGENTMEM_NO_NATIVE"):
        assert name in doc
    assert os.environ.get("AGENTMEM_NO_NATIVE", "") in ("", "0", "1")
