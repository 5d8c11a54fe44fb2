"""Property-based fuzzing of the state-blob parser and the encoded-state decoder.

Truncated, bit-flipped, resized and field-overwritten blobs must either parse (and
then encode and decode without error) or raise :class:`CodecError`: never another
exception, never a crash in the native kernels. Encoded states are fuzzed twice:
as they are (the checksum must catch the damage) and re-sealed with a valid
checksum, so the mutations reach the header and payload validation behind it.

About 12,000 cases in total (see ``N_*``); the module runs in well under a minute.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agentmem.errors import CodecError
from agentmem import codec as C
from agentmem.codec import CodecSpec, decode_state, encode_state, parse_state
from tests.unit.test_codec_blobs import SectionSpec, StreamSpec, iswa_blob, make_blob

N_PARSE = 4000
N_ENCODED = 3000
N_RESEALED = 4000
N_FIELDS = 1500

CORPUS = [
    make_blob([SectionSpec([StreamSpec(n_cells=4, n_layer=2, n_embd=32)])], seed=1),
    iswa_blob(n_cells=6, window=3, seed=2),
    iswa_blob(n_cells=5, window=5, v_trans=True, seed=3),
    make_blob([SectionSpec([StreamSpec(n_cells=3, n_embd=32, seq_ids=[[0, 1], [1], [2]]), StreamSpec(n_cells=0)])]),
    make_blob([SectionSpec([StreamSpec(n_cells=2, n_embd=64, k_type=8, v_type=0)])], seed=4),
]
SPECS = ["q8_0", "q4_0+rot", "q8_0/q4_0", "f16"]
ENCODED = [CodecSpec.parse(SPECS[i % len(SPECS)]).encode(b).tobytes() for i, b in enumerate(CORPUS)]


def fuzz(n: int) -> settings:
    return settings(
        max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
    )


@st.composite
def mutated(draw: st.DrawFn, corpus: list[bytes]) -> bytes:
    """A corpus item after one to three truncations, bit flips, insertions or deletions."""
    data = bytearray(draw(st.sampled_from(corpus)))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "flip", "insert", "delete", "duplicate"]))
        n = len(data)
        if kind == "truncate":
            del data[draw(st.integers(0, max(0, n - 1))) :]
        elif kind == "flip" and n:
            i = draw(st.integers(0, n - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            i = draw(st.integers(0, n))
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete" and n:
            i = draw(st.integers(0, n - 1))
            del data[i : i + draw(st.integers(1, 16))]
        elif kind == "duplicate" and n:
            i = draw(st.integers(0, n - 1))
            data[i:i] = data[i : i + draw(st.integers(1, 64))]
    return bytes(data)


INTERESTING = [0, 1, 2, 3, 4, 8, 16, 31, 32, 33, 64, 255, 256, 2**31 - 1, 2**31, 2**32 - 1]


@st.composite
def field_overwritten(draw: st.DrawFn) -> bytes:
    """A corpus blob with one aligned u32 or u64 field set to a boundary value."""
    data = bytearray(draw(st.sampled_from(CORPUS)))
    i = draw(st.integers(0, len(data) - 8)) & ~3
    value = draw(st.sampled_from(INTERESTING) | st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        struct.pack_into("<I", data, i, value)
    else:
        struct.pack_into("<Q", data, i, value if value < 2**32 else value << 20)
    return bytes(data)


def _exercise_blob(blob: bytes) -> None:
    """Parse; if the blob parses, it must also encode and decode back."""
    try:
        layout = parse_state(blob)
    except CodecError:
        event("rejected")
        return
    event("parsed")
    assert layout.n_bytes == len(blob)
    enc = encode_state(blob, k_codec="q8_0", v_codec="q4_0", rotate=True)
    out = decode_state(enc)
    assert out.size == len(blob)
    np.testing.assert_array_equal(decode_state(encode_state(blob)), np.frombuffer(blob, np.uint8))


@fuzz(N_PARSE)
@given(mutated(CORPUS))
def test_fuzz_parser_only_raises_codec_error(blob: bytes) -> None:
    _exercise_blob(blob)


@fuzz(N_FIELDS)
@given(field_overwritten())
def test_fuzz_parser_field_values(blob: bytes) -> None:
    _exercise_blob(blob)


@fuzz(N_ENCODED)
@given(mutated(ENCODED))
def test_fuzz_decoder_rejects_damage(data: bytes) -> None:
    """Any change to an encoded state is caught (by the checksum at the latest)."""
    if data in ENCODED:
        return
    with pytest.raises(CodecError):
        decode_state(data)


def _reseal(data: bytes) -> bytes:
    if len(data) < 8:
        return data
    buf = bytearray(data)
    struct.pack_into("<Q", buf, len(buf) - 8, C.checksum(bytes(buf[:-8])))
    return bytes(buf)


@fuzz(N_RESEALED)
@given(mutated(ENCODED))
def test_fuzz_decoder_resealed(data: bytes) -> None:
    """With a valid checksum the header and payload validation must still hold."""
    sealed = _reseal(data)
    try:
        out = decode_state(sealed)
    except CodecError:
        event("rejected")
        return
    event("decoded")
    assert out.size == C.encoded_info(sealed).original_bytes
