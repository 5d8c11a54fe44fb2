"""The state-blob parser: the validated structure of a llama.cpp sequence state.

A parked agent's KV state is the blob `llama_state_seq_get_data` returns.
`parse_state` reads it into a `StateLayout` (with `SectionLayout`,
`StreamLayout` and `TensorLayout`): cache sections, per-stream cells and
positions, per-layer K/V tensors with their offsets. Every read is bounds-checked
and every failure is a `CodecError` naming the field.

Blob format (llama.cpp, `llama-context.cpp` / `llama-kv-cache.cpp`), little-endian:

```text
u32 magic 0xAF143CD8, i32 source seq_id
one or more cache sections (an iSWA model writes its base cache, then its SWA cache):
  u32 n_stream
  per stream: u32 cell_count; if cell_count > 0:
    cell_count x (i32 pos, u32 n_seq_id, [cell ext, M-RoPE models only], n_seq_id x i32 seq_id)
    u32 v_trans, u32 n_layer
    n_layer x K:  i32 type, u64 row_size, cell_count * row_size bytes
    n_layer x V:  v_trans == 0: i32 type, u64 row_size, cell_count * row_size bytes
                  v_trans == 1: i32 type, u32 el_size, u32 n_embd_v_gqa,
                                n_embd_v_gqa * cell_count * el_size bytes
```

Example:
    >>> from agentmem.codec import parse_state
    >>> parse_state(blob).n_cells  # doctest: +SKIP
    2000
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, NamedTuple

import numpy as np

from agentmem.errors import CodecError

__all__ = [
    "BLOB_MAGIC",
    "GGML_F16",
    "GGML_Q4_0",
    "GGML_Q8_0",
    "LLAMA_MAX_SEQ",
    "Buffer",
    "SectionLayout",
    "StateLayout",
    "StreamLayout",
    "TensorLayout",
    "parse_state",
]

Buffer = Any
"""Anything exposing the buffer protocol: bytes, bytearray, memoryview, numpy, ctypes."""

BLOB_MAGIC: Final[int] = 0xAF143CD8
"""First u32 of every `llama_state_seq_get_data` blob (`io_magic` in llama.cpp)."""

LLAMA_MAX_SEQ: Final[int] = 256  # llama.cpp's hard limit on sequence ids and streams
_MAX_SECTIONS: Final[int] = 8  # kv cache: 1, iSWA: 2; more means the blob is not understood

GGML_F16: Final[int] = 1
GGML_Q4_0: Final[int] = 2
GGML_Q8_0: Final[int] = 8

# ggml type id -> (name, elements per block, bytes per block), from ggml_type_traits.
_GGML_TYPES: Final[Mapping[int, tuple[str, int, int]]] = MappingProxyType(
    {
        0: ("f32", 1, 4),
        1: ("f16", 1, 2),
        2: ("q4_0", 32, 18),
        3: ("q4_1", 32, 20),
        6: ("q5_0", 32, 22),
        7: ("q5_1", 32, 24),
        8: ("q8_0", 32, 34),
        9: ("q8_1", 32, 36),
        10: ("q2_K", 256, 84),
        11: ("q3_K", 256, 110),
        12: ("q4_K", 256, 144),
        13: ("q5_K", 256, 176),
        14: ("q6_K", 256, 210),
        15: ("q8_K", 256, 292),
        16: ("iq2_xxs", 256, 66),
        17: ("iq2_xs", 256, 74),
        18: ("iq3_xxs", 256, 98),
        19: ("iq1_s", 256, 50),
        20: ("iq4_nl", 32, 18),
        21: ("iq3_s", 256, 110),
        22: ("iq2_s", 256, 82),
        23: ("iq4_xs", 256, 136),
        24: ("i8", 1, 1),
        25: ("i16", 1, 2),
        26: ("i32", 1, 4),
        27: ("i64", 1, 8),
        28: ("f64", 1, 8),
        29: ("iq1_m", 256, 56),
        30: ("bf16", 1, 2),
        34: ("tq1_0", 256, 54),
        35: ("tq2_0", 256, 66),
        39: ("mxfp4", 32, 17),
        40: ("nvfp4", 64, 36),
        41: ("q1_0", 128, 18),
        42: ("q2_0", 64, 18),
    }
)


class TensorLayout(NamedTuple):
    """One layer's K or V data inside a blob (offsets relative to the blob start).

    Attributes:
        kind: `"k"` or `"v"`.
        layer: index of the layer within its cache section (0-based).
        ggml_type: ggml type id of the data (1 = f16).
        transposed: V stored channel-major (`v_trans`, no flash attention).
        n_embd: values per cell (K/V row length; `n_embd_v_gqa` when transposed).
        n_cells: cells in the stream.
        row_size: bytes per cell row; the element size when transposed.
        header_offset: offset of the tensor's type field.
        data_offset: offset of its first data byte.
        data_size: bytes of data in this blob (an encoded size in an encoded payload).
    """

    kind: Literal["k", "v"]
    layer: int
    ggml_type: int
    transposed: bool
    n_embd: int
    n_cells: int
    row_size: int
    header_offset: int
    data_offset: int
    data_size: int

    @property
    def type_name(self) -> str:
        """ggml name of the data type (`"f16"`, `"q8_0"`, ...)."""
        return _GGML_TYPES[self.ggml_type][0]

    @property
    def n_values(self) -> int:
        """Number of values in the tensor (`n_embd * n_cells`)."""
        return self.n_embd * self.n_cells

    @property
    def raw_size(self) -> int:
        """Bytes of the data in llama.cpp's own format."""
        name, blck, size = _GGML_TYPES[self.ggml_type]
        del name
        return self.n_values // blck * size


@dataclass(frozen=True, slots=True)
class StreamLayout:
    """One KV stream of a cache section: its cells and, when it has any, its tensors.

    Attributes:
        index: stream index within the section.
        n_cells: cells the stream holds for the sequence (0 for an empty stream).
        cells_offset: offset of the first cell record.
        cells_size: bytes of cell records.
        positions: per-cell positions (int32, read-only).
        v_trans: V layout (None for an empty stream).
        k: per-layer K tensors.
        v: per-layer V tensors.
    """

    index: int
    n_cells: int
    cells_offset: int
    cells_size: int
    positions: np.ndarray = field(repr=False)
    v_trans: bool | None
    k: tuple[TensorLayout, ...]
    v: tuple[TensorLayout, ...]

    @property
    def n_layer(self) -> int:
        """Number of layers the stream stores."""
        return len(self.k)


@dataclass(frozen=True, slots=True)
class SectionLayout:
    """One cache section (a `llama_kv_cache`): a plain model has one, iSWA two.

    Attributes:
        index: section index (iSWA: 0 = base / full attention, 1 = sliding window).
        offset: offset of the section's `n_stream` field.
        size: bytes of the section.
        streams: its streams.
    """

    index: int
    offset: int
    size: int
    streams: tuple[StreamLayout, ...]

    @property
    def n_cells(self) -> int:
        """Cells over all streams."""
        return sum(s.n_cells for s in self.streams)

    @property
    def positions(self) -> np.ndarray:
        """Positions of all cells, stream after stream (int32)."""
        parts = [s.positions for s in self.streams if s.n_cells]
        if not parts:
            return np.empty(0, dtype=np.int32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclass(frozen=True, slots=True)
class StateLayout:
    """The validated structure of a llama.cpp sequence state blob.

    Attributes:
        n_bytes: length of the blob.
        seq_id: the sequence the blob was taken from (its header field).
        cell_ext_size: bytes of per-cell extension the blob was parsed with.
        sections: cache sections in blob order.
    """

    n_bytes: int
    seq_id: int
    cell_ext_size: int
    sections: tuple[SectionLayout, ...]

    @property
    def n_cells(self) -> int:
        """Cells of the largest section: the tokens the state holds.

        In an iSWA model the base (full-attention) section holds every cell while
        the sliding-window section holds only the window.
        """
        return max((s.n_cells for s in self.sections), default=0)

    @property
    def positions(self) -> np.ndarray:
        """Per-cell positions (int32) of the largest section (first one on ties)."""
        if not self.sections:
            return np.empty(0, dtype=np.int32)
        best = max(self.sections, key=lambda s: (s.n_cells, -s.index))
        return best.positions

    def tensors(self) -> Iterator[TensorLayout]:
        """All K and V tensors in blob order."""
        for section in self.sections:
            for stream in section.streams:
                yield from stream.k
                yield from stream.v

    @property
    def kv_bytes(self) -> int:
        """Bytes of K/V data (the rest is headers and cell metadata)."""
        return sum(t.data_size for t in self.tensors())


class _Reader:
    """Bounds-checked little-endian reads from a buffer; every failure is a CodecError."""

    __slots__ = ("buf", "n", "pos", "what")

    def __init__(self, buf: memoryview, what: str) -> None:
        self.buf = buf
        self.n = len(buf)
        self.pos = 0
        self.what = what

    # `name % args` names the field in the error; it is formatted only on failure.
    def need(self, n_bytes: int, name: str, *args: object) -> None:
        if n_bytes < 0 or self.pos + n_bytes > self.n:
            raise CodecError(
                f"{self.what} truncated: {name % args} needs {n_bytes} bytes at offset {self.pos}, "
                f"{self.n - self.pos} left"
            )

    def unpack(self, st: struct.Struct, name: str, *args: object) -> tuple[Any, ...]:
        if self.pos + st.size > self.n:
            self.need(st.size, name, *args)
        values = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return values

    def skip(self, n_bytes: int, name: str, *args: object) -> int:
        if n_bytes < 0 or self.pos + n_bytes > self.n:
            self.need(n_bytes, name, *args)
        start = self.pos
        self.pos += n_bytes
        return start


_U32: Final = struct.Struct("<I")
_I32: Final = struct.Struct("<i")
_U32_I32: Final = struct.Struct("<Ii")
_U32_U32: Final = struct.Struct("<II")
_CELL: Final = struct.Struct("<iI")
_K_HDR: Final = struct.Struct("<iQ")
_VT_HDR: Final = struct.Struct("<iII")

_SizeFn = Callable[[str, int, int, int], int]
"""`size_fn(kind, ggml_type, n_values, raw_size)` -> bytes stored for that tensor."""


def _raw_size(kind: str, ggml_type: int, n_values: int, raw_size: int) -> int:
    del kind, ggml_type, n_values
    return raw_size


def _check_type(r: _Reader, ggml_type: int, kind: str, layer: int) -> tuple[str, int, int]:
    traits = _GGML_TYPES.get(ggml_type)
    if traits is None:
        raise CodecError(f"{r.what}: {kind} of layer {layer} has unknown ggml type {ggml_type} at offset {r.pos - 12}")
    return traits


def _parse_cells(r: _Reader, n_cells: int, ext: int) -> np.ndarray:
    """Read `n_cells` cell records; return their positions (int32, read-only)."""
    min_cell = 8 + ext + 4
    r.need(n_cells * min_cell, "%s cell records", n_cells)
    start = r.pos
    positions: np.ndarray | None = None
    if ext % 4 == 0:
        # Fast path: a sequence blob has exactly one seq id per cell -> fixed stride.
        stride = min_cell // 4
        rec = np.frombuffer(r.buf, dtype="<i4", count=n_cells * stride, offset=start).reshape(n_cells, stride)
        if n_cells == 0 or bool(np.all(rec[:, 1] == 1)):
            seq = rec[:, stride - 1]
            if n_cells and (int(seq.min()) < 0 or int(seq.max()) >= LLAMA_MAX_SEQ):
                raise CodecError(f"{r.what}: a cell's seq_id is outside [0, {LLAMA_MAX_SEQ})")
            positions = rec[:, 0].astype(np.int32)
            r.pos = start + n_cells * min_cell
    if positions is None:
        positions = np.empty(n_cells, dtype=np.int32)
        for i in range(n_cells):
            pos, n_seq = r.unpack(_CELL, "cell %s", i)
            if ext:
                r.skip(ext, "cell %s extension", i)
            if n_seq > LLAMA_MAX_SEQ:
                raise CodecError(f"{r.what}: cell {i} claims {n_seq} sequence ids")
            r.need(4 * n_seq, "cell %s seq ids", i)
            ids = np.frombuffer(r.buf, dtype="<i4", count=n_seq, offset=r.pos)
            if n_seq and (int(ids.min()) < 0 or int(ids.max()) >= LLAMA_MAX_SEQ):
                raise CodecError(f"{r.what}: cell {i} has a seq_id outside [0, {LLAMA_MAX_SEQ})")
            r.pos += 4 * n_seq
            positions[i] = pos
    if n_cells and int(positions.min()) < 0:
        raise CodecError(f"{r.what}: negative cell position {int(positions.min())}")
    positions.setflags(write=False)
    return positions


def _parse_tensors(
    r: _Reader, n_cells: int, v_trans: bool, n_layer: int, size_fn: _SizeFn
) -> tuple[tuple[TensorLayout, ...], tuple[TensorLayout, ...]]:
    r.need(n_layer * 24, "%s layer headers", n_layer)  # >= 12 bytes of header per K and per V
    ks: list[TensorLayout] = []
    for il in range(n_layer):
        hdr = r.pos
        ggml_type, row_size = r.unpack(_K_HDR, "K header of layer %s", il)
        name, blck, tsize = _check_type(r, ggml_type, "K", il)
        if row_size == 0 or row_size % tsize:
            raise CodecError(f"{r.what}: K row size {row_size} of layer {il} is not a whole number of {name} blocks")
        n_embd = row_size // tsize * blck
        raw = n_cells * row_size
        size = size_fn("k", ggml_type, n_embd * n_cells, raw)
        start = r.skip(size, "K data of layer %s", il)
        ks.append(TensorLayout("k", il, ggml_type, False, n_embd, n_cells, row_size, hdr, start, size))
    vs: list[TensorLayout] = []
    for il in range(n_layer):
        hdr = r.pos
        if not v_trans:
            ggml_type, row_size = r.unpack(_K_HDR, "V header of layer %s", il)
            name, blck, tsize = _check_type(r, ggml_type, "V", il)
            if row_size == 0 or row_size % tsize:
                raise CodecError(
                    f"{r.what}: V row size {row_size} of layer {il} is not a whole number of {name} blocks"
                )
            n_embd = row_size // tsize * blck
            raw = n_cells * row_size
        else:
            ggml_type, el_size, n_embd = r.unpack(_VT_HDR, "transposed V header of layer %s", il)
            name, blck, tsize = _check_type(r, ggml_type, "V", il)
            if blck != 1 or el_size != tsize:
                raise CodecError(f"{r.what}: transposed V of layer {il} has type {name} with element size {el_size}")
            if n_embd == 0:
                raise CodecError(f"{r.what}: transposed V of layer {il} has n_embd_v_gqa 0")
            row_size = el_size
            raw = n_embd * n_cells * el_size
        size = size_fn("v", ggml_type, n_embd * n_cells, raw)
        start = r.skip(size, "V data of layer %s", il)
        vs.append(TensorLayout("v", il, ggml_type, v_trans, n_embd, n_cells, row_size, hdr, start, size))
    return tuple(ks), tuple(vs)


def _parse(buf: memoryview, *, cell_ext_size: int, size_fn: _SizeFn, what: str) -> StateLayout:
    if sys.byteorder != "little":
        raise CodecError("state blobs are only understood on little-endian hosts")
    if not 0 <= cell_ext_size <= 1024 or cell_ext_size % 4:
        raise CodecError(f"cell_ext_size must be a multiple of 4 in [0, 1024], got {cell_ext_size}")
    r = _Reader(buf, what)
    magic, seq_id = r.unpack(_U32_I32, "header")
    if magic != BLOB_MAGIC:
        raise CodecError(f"{what}: magic {magic:#010x} is not a llama.cpp sequence state ({BLOB_MAGIC:#010x})")
    if not 0 <= seq_id < LLAMA_MAX_SEQ:
        raise CodecError(f"{what}: source seq_id {seq_id} outside [0, {LLAMA_MAX_SEQ})")
    sections: list[SectionLayout] = []
    while r.pos < r.n:
        if len(sections) == _MAX_SECTIONS:
            raise CodecError(f"{what}: more than {_MAX_SECTIONS} cache sections (or trailing bytes)")
        s_off = r.pos
        (n_stream,) = r.unpack(_U32, "n_stream of section %s", len(sections))
        if not 1 <= n_stream <= LLAMA_MAX_SEQ:
            raise CodecError(f"{what}: section {len(sections)} has n_stream {n_stream}")
        r.need(4 * n_stream, "%s stream headers", n_stream)
        streams: list[StreamLayout] = []
        for si in range(n_stream):
            (n_cells,) = r.unpack(_U32, "cell_count of stream %s", si)
            cells_off = r.pos
            if n_cells == 0:
                empty = np.empty(0, dtype=np.int32)
                empty.setflags(write=False)
                streams.append(StreamLayout(si, 0, cells_off, 0, empty, None, (), ()))
                continue
            positions = _parse_cells(r, n_cells, cell_ext_size)
            cells_size = r.pos - cells_off
            v_trans, n_layer = r.unpack(_U32_U32, "v_trans/n_layer of stream %s", si)
            if v_trans > 1:
                raise CodecError(f"{what}: v_trans is {v_trans}, expected 0 or 1")
            if n_layer == 0:
                raise CodecError(f"{what}: stream {si} of section {len(sections)} has 0 layers")
            ks, vs = _parse_tensors(r, n_cells, bool(v_trans), n_layer, size_fn)
            streams.append(StreamLayout(si, n_cells, cells_off, cells_size, positions, bool(v_trans), ks, vs))
        sections.append(SectionLayout(len(sections), s_off, r.pos - s_off, tuple(streams)))
    if not sections:
        raise CodecError(f"{what}: no cache section after the header ({r.n} bytes)")
    return StateLayout(r.n, seq_id, cell_ext_size, tuple(sections))


def _as_u8(data: Buffer, what: str) -> np.ndarray:
    """A zero-copy 1-D uint8 view of any contiguous buffer."""
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise CodecError(f"{what} must be a contiguous buffer")
        if data.dtype != np.uint8 or data.ndim != 1:
            data = data.reshape(-1).view(np.uint8)
        return data
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except (TypeError, ValueError, BufferError) as exc:
        raise CodecError(f"{what} is not a contiguous bytes-like object: {exc}") from exc


def parse_state(blob: Buffer, *, cell_ext_size: int = 0) -> StateLayout:
    """Parse and validate a `llama_state_seq_get_data` blob.

    Args:
        blob: the blob (any contiguous buffer; not copied).
        cell_ext_size: bytes of per-cell extension (`llama_kv_cell_ext`, 12 bytes)
            the cache writes; only M-RoPE (vision) models have one.

    Returns:
        The layout: sections, streams with positions, K/V tensors with offsets.

    Raises:
        CodecError: the blob is not a sequence state this parser understands
            (wrong magic, unknown type, inconsistent sizes, truncated, trailing bytes).
    """
    arr = _as_u8(blob, "state blob")
    return _parse(arr.data, cell_ext_size=cell_ext_size, size_fn=_raw_size, what="state blob")
