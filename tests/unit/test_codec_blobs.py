"""Synthetic llama.cpp sequence-state blobs, and the parser tests that use them.

:func:`make_blob` writes a blob in the exact format of ``llama_state_seq_get_data``
(see ``agentmem/codec/layout.py``), with any number of sections, streams, layers,
V layouts and tensor types, so the parser and codecs can be tested without a model.
The other codec test modules import it from here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

BLOB_MAGIC = 0xAF143CD8

# ggml type id -> (elements per block, bytes per block)
TYPES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 30: (1, 2)}


@dataclass
class StreamSpec:
    """One stream: cells, layers and their types."""

    n_cells: int = 8
    n_layer: int = 2
    n_embd: int = 64
    v_trans: bool = False
    k_type: int = 1
    v_type: int = 1
    seq_ids: list[list[int]] | None = None  # per cell; default [[seq_id]]
    pos0: int = 0
    ext: int = 0  # bytes of per-cell extension


@dataclass
class SectionSpec:
    streams: list[StreamSpec] = field(default_factory=lambda: [StreamSpec()])


def _tensor_data(rng: np.random.Generator, ggml_type: int, n_values: int, scale: float) -> bytes:
    if ggml_type == 1:
        return (rng.standard_normal(n_values) * scale).astype("<f2").tobytes()
    if ggml_type == 0:
        return (rng.standard_normal(n_values) * scale).astype("<f4").tobytes()
    blck, size = TYPES[ggml_type]
    return rng.integers(0, 256, n_values // blck * size, dtype=np.uint8).tobytes()


def make_blob(
    sections: list[SectionSpec] | None = None, *, seq_id: int = 0, seed: int = 0, scale: float = 1.0
) -> bytes:
    """A synthetic sequence-state blob (defaults: one section, one stream, 2 layers)."""
    rng = np.random.default_rng(seed)
    sections = sections if sections is not None else [SectionSpec()]
    out = bytearray(struct.pack("<Ii", BLOB_MAGIC, seq_id))
    for sec in sections:
        out += struct.pack("<I", len(sec.streams))
        for st in sec.streams:
            out += struct.pack("<I", st.n_cells)
            if st.n_cells == 0:
                continue
            for i in range(st.n_cells):
                ids = st.seq_ids[i] if st.seq_ids is not None else [seq_id]
                out += struct.pack("<iI", st.pos0 + i, len(ids))
                out += bytes(range(st.ext))
                out += struct.pack(f"<{len(ids)}i", *ids)
            out += struct.pack("<II", int(st.v_trans), st.n_layer)
            for _ in range(st.n_layer):
                blck, size = TYPES[st.k_type]
                row = st.n_embd // blck * size
                out += struct.pack("<iQ", st.k_type, row)
                out += _tensor_data(rng, st.k_type, st.n_embd * st.n_cells, scale)
            for _ in range(st.n_layer):
                blck, size = TYPES[st.v_type]
                if st.v_trans:
                    out += struct.pack("<iII", st.v_type, size, st.n_embd)
                else:
                    out += struct.pack("<iQ", st.v_type, st.n_embd // blck * size)
                out += _tensor_data(rng, st.v_type, st.n_embd * st.n_cells, scale)
    return bytes(out)


def iswa_blob(n_cells: int = 40, window: int = 16, *, v_trans: bool = False, seed: int = 0) -> bytes:
    """Like Gemma 3: a base section (all cells, 1 layer) and an SWA section (the window, 2 layers)."""
    base = SectionSpec([StreamSpec(n_cells=n_cells, n_layer=1, n_embd=64, v_trans=v_trans)])
    swa = SectionSpec([StreamSpec(n_cells=window, n_layer=2, n_embd=64, v_trans=v_trans, pos0=n_cells - window)])
    return make_blob([base, swa], seed=seed)


# --------------------------------------------------------------------------- parser tests

import pytest

from agentmem.errors import CodecError
from agentmem.codec import parse_state


def test_parse_default_blob_layout() -> None:
    blob = make_blob()
    layout = parse_state(blob)
    assert layout.n_bytes == len(blob)
    assert layout.seq_id == 0
    assert len(layout.sections) == 1
    (stream,) = layout.sections[0].streams
    assert stream.n_cells == 8 and stream.n_layer == 2 and stream.v_trans is False
    assert layout.n_cells == 8
    assert layout.positions.tolist() == list(range(8))
    tensors = list(layout.tensors())
    assert [(t.kind, t.layer) for t in tensors] == [("k", 0), ("k", 1), ("v", 0), ("v", 1)]
    for t in tensors:
        assert t.type_name == "f16" and t.n_embd == 64 and t.n_values == 64 * 8
        assert t.data_size == t.raw_size == 64 * 8 * 2
        assert blob[t.header_offset : t.header_offset + 4] == struct.pack("<i", 1)
    assert layout.kv_bytes == 4 * 1024


def test_parse_iswa_positions_come_from_the_largest_section() -> None:
    layout = parse_state(iswa_blob(n_cells=40, window=16))
    assert [s.n_cells for s in layout.sections] == [40, 16]
    assert layout.n_cells == 40
    assert layout.positions.tolist() == list(range(40))
    assert layout.sections[1].positions.tolist() == list(range(24, 40))
    assert not layout.positions.flags.writeable


def test_parse_transposed_v() -> None:
    layout = parse_state(iswa_blob(v_trans=True))
    v = layout.sections[0].streams[0].v[0]
    assert v.transposed and v.row_size == 2 and v.n_embd == 64 and v.data_size == 64 * 40 * 2


def test_parse_multi_seq_cells_and_streams() -> None:
    """Whole-cache style cells (several seq ids per cell) take the slow path."""
    st = StreamSpec(n_cells=5, seq_ids=[[0], [0, 1], [1], [0, 1, 2], [3]])
    blob = make_blob([SectionSpec([StreamSpec(n_cells=0), st, StreamSpec(n_cells=3)])])
    layout = parse_state(blob)
    s0, s1, s2 = layout.sections[0].streams
    assert (s0.n_cells, s1.n_cells, s2.n_cells) == (0, 5, 3)
    assert s0.v_trans is None and s0.k == ()
    assert layout.n_cells == 8
    assert layout.positions.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]


def test_parse_cell_extension() -> None:
    blob = make_blob([SectionSpec([StreamSpec(ext=12)])])
    assert parse_state(blob, cell_ext_size=12).n_cells == 8
    with pytest.raises(CodecError):
        parse_state(blob)  # without the extension the sizes do not add up


def test_parse_other_types_and_empty_sequence() -> None:
    blob = make_blob([SectionSpec([StreamSpec(k_type=8, v_type=0)])])
    types = [t.type_name for t in parse_state(blob).tensors()]
    assert types == ["q8_0", "q8_0", "f32", "f32"]
    empty = make_blob([SectionSpec([StreamSpec(n_cells=0)]), SectionSpec([StreamSpec(n_cells=0)])])
    layout = parse_state(empty)
    assert layout.n_cells == 0 and layout.positions.size == 0 and list(layout.tensors()) == []


def test_parse_accepts_every_buffer_kind() -> None:
    blob = make_blob()
    for obj in (blob, bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8)):
        assert parse_state(obj).n_cells == 8


def _patch(blob: bytes, offset: int, fmt: str, *values: int) -> bytes:
    out = bytearray(blob)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b"", "truncated"),
        (lambda b: b[:6], "truncated"),
        (lambda b: _patch(b, 0, "<I", 0x12345678), "magic"),
        (lambda b: _patch(b, 4, "<i", -1), "seq_id"),
        (lambda b: _patch(b, 4, "<i", 256), "seq_id"),
        (lambda b: b[:8], "no cache section"),
        (lambda b: b[:-1], "truncated"),
        (lambda b: b + b"\0", "truncated"),
        (lambda b: b + b"\1\0\0\0\1\0\0\0", "truncated"),
        (lambda b: _patch(b, 8, "<I", 0), "n_stream 0"),
        (lambda b: _patch(b, 8, "<I", 100000), "n_stream"),
        (lambda b: _patch(b, 12, "<I", 1000), "truncated"),
        (lambda b: _patch(b, 16, "<i", -5), "negative cell position"),
        (lambda b: _patch(b, 20, "<I", 300), "sequence ids"),
        (lambda b: _patch(b, 24, "<i", -3), "seq_id is outside"),
    ],
)
def test_parse_rejects_malformed_blobs(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CodecError, match=message):
        parse_state(mutate(make_blob()))


def _first_k(blob: bytes) -> int:
    return parse_state(blob).sections[0].streams[0].k[0].header_offset


def test_parse_rejects_bad_tensor_headers() -> None:
    blob = make_blob()
    k0 = _first_k(blob)
    vt = k0 - 8  # v_trans, n_layer
    with pytest.raises(CodecError, match="v_trans"):
        parse_state(_patch(blob, vt, "<I", 2))
    with pytest.raises(CodecError, match="0 layers"):
        parse_state(_patch(blob, vt + 4, "<I", 0))
    with pytest.raises(CodecError, match="truncated"):
        parse_state(_patch(blob, vt + 4, "<I", 3))
    with pytest.raises(CodecError, match="unknown ggml type 4"):
        parse_state(_patch(blob, k0, "<i", 4))
    with pytest.raises(CodecError, match="not a whole number"):
        parse_state(_patch(blob, k0 + 4, "<Q", 127))
    with pytest.raises(CodecError, match="not a whole number"):
        parse_state(_patch(blob, k0 + 4, "<Q", 0))
    with pytest.raises(CodecError):
        parse_state(_patch(blob, k0 + 4, "<Q", 1 << 62))
    tb = iswa_blob(v_trans=True)
    v0 = parse_state(tb).sections[0].streams[0].v[0].header_offset
    with pytest.raises(CodecError, match="element size"):
        parse_state(_patch(tb, v0 + 4, "<I", 4))
    with pytest.raises(CodecError, match="n_embd_v_gqa 0"):
        parse_state(_patch(tb, v0 + 8, "<I", 0))
    with pytest.raises(CodecError, match="element size"):
        parse_state(_patch(tb, v0, "<i", 8))  # a block type cannot be transposed


def test_parse_rejects_too_many_sections() -> None:
    empty = SectionSpec([StreamSpec(n_cells=0)])
    assert len(parse_state(make_blob([empty] * 8)).sections) == 8
    with pytest.raises(CodecError, match="sections"):
        parse_state(make_blob([empty] * 9))


def test_parse_rejects_non_contiguous_input() -> None:
    arr = np.frombuffer(make_blob() * 2, np.uint8)[::2]
    with pytest.raises(CodecError, match="contiguous"):
        parse_state(arr)
