"""State-blob codec: parse llama.cpp sequence states and store their K/V rows as q8_0/q4_0.

A parked agent's KV state is the blob ``llama_state_seq_get_data`` returns. This
module reads that blob's layout and re-encodes its f16 K and V rows with the exact
ggml ``q8_0`` / ``q4_0`` block formats (optionally after a Hadamard rotation), so a
background agent costs about a half or a quarter of its f16 bytes; decoding gives
back a blob that ``llama_state_seq_set_data`` accepts in an f16 context.

Classes and their jobs:

* :class:`StateLayout` (with :class:`SectionLayout`, :class:`StreamLayout`,
  :class:`TensorLayout`): the parsed, validated structure of a state blob: cache
  sections, per-stream cells and positions, per-layer K/V tensors with offsets.
  Built by :func:`parse_state`.
* :class:`Codec` and its subclasses :class:`F16Codec` (identity) and
  :class:`QuantCodec` (``q8_0``, ``q4_0``): small strategy objects, one per storage
  format of an f16 tensor, registered by name in :data:`CODECS`
  (:func:`get_codec` raises :class:`~agentmem.errors.PolicyError` listing the names).
* :class:`CodecSpec`: the choice for keys, values and rotation, parsed from
  strings such as ``"q8_0/q4_0"`` or ``"q4_0+rot"``.
* :class:`Kernels` with :class:`NativeKernels` (the C extension
  ``agentmem._native``) and :class:`NumpyKernels`: the number crunching. Both
  produce identical bytes; numpy is used when the extension is missing or when
  the environment variable ``AGENTMEM_NO_NATIVE=1`` is set.
* :class:`EncodedInfo`: what :func:`encoded_info` reads from an encoded header.

Blob format (llama.cpp, ``llama-context.cpp`` / ``llama-kv-cache.cpp``), little-endian::

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

Encoded format (this module, version 1), little-endian::

    0   4s  magic b"AMKV"
    4   u16 format version (1)
    6   u8  key codec id      (ggml type id: 1 = f16, 8 = q8_0, 2 = q4_0)
    7   u8  value codec id
    8   u8  rotation block    (0 = none, 32 or 64)
    9   u8  checksum algorithm (1 = mulfold64)
    10  u16 cell ext size     (bytes of per-cell extension; 0 except M-RoPE models)
    12  u32 reserved (0)
    16  u64 length of the original blob
    24  u64 payload length
    32  payload: the original blob with the data of every f16 K (V) tensor replaced
        by its key (value) codec's encoding; cell metadata and all other bytes verbatim
    end u64 checksum of everything before it, verified before anything is decoded

Quantization treats a tensor's data as one flat run of f16 values, in groups of
``max(32, rotation)`` values (the last group zero-padded): for K and
non-transposed V that is 32-value blocks along each cell's row; for transposed V
(no flash attention) blocks run along the cells of one channel.

Example::

    >>> from agentmem.memory.codec import encode_state, decode_state, parse_state
    >>> enc = encode_state(blob, k_codec="q8_0", v_codec="q4_0")   # doctest: +SKIP
    >>> restored = decode_state(enc)                                # doctest: +SKIP
    >>> parse_state(restored).n_cells                               # doctest: +SKIP
    2000
"""

from __future__ import annotations

import functools
import logging
import os
import re
import struct
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal, NamedTuple, Protocol

import numpy as np

from agentmem.errors import CodecError, ConfigError, PolicyError

__all__ = [
    "BLOB_MAGIC",
    "CODECS",
    "ENCODED_MAGIC",
    "FORMAT_VERSION",
    "KERNELS",
    "Codec",
    "CodecSpec",
    "EncodedInfo",
    "F16Codec",
    "Kernels",
    "NativeKernels",
    "NumpyKernels",
    "QuantCodec",
    "SectionLayout",
    "StateLayout",
    "StreamLayout",
    "TensorLayout",
    "checksum",
    "decode_state",
    "encode_state",
    "encoded_info",
    "get_codec",
    "get_kernels",
    "hadamard",
    "is_encoded",
    "parse_state",
]

logger = logging.getLogger(__name__)

Buffer = Any
"""Anything exposing the buffer protocol: bytes, bytearray, memoryview, numpy, ctypes."""

BLOB_MAGIC: Final[int] = 0xAF143CD8
"""First u32 of every ``llama_state_seq_get_data`` blob (``io_magic`` in llama.cpp)."""

ENCODED_MAGIC: Final[bytes] = b"AMKV"
FORMAT_VERSION: Final[int] = 1

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

_QK: Final[int] = 32
_F16_MAX: Final = np.float32(65504.0)
# 1/sqrt(32) rounded to binary32 (the C kernels use the same bits); 1/sqrt(64) is exact.
_HSCALE: Final[Mapping[int, np.float32]] = MappingProxyType(
    {32: np.array([0x3E3504F3], dtype=np.uint32).view(np.float32)[0], 64: np.float32(0.125)}
)

# mulfold64 checksum constants (see NumpyKernels.checksum and native/kernels.c).
_CK_K1: Final[int] = 0x9E3779B97F4A7C15
_CK_K2: Final[int] = 0xC2B2AE3D27D4EB4F
_M64: Final[int] = (1 << 64) - 1
CHECKSUM_MULFOLD64: Final[int] = 1

_HEADER: Final = struct.Struct("<4sHBBBBHIQQ")
_TRAILER: Final = struct.Struct("<Q")


# --------------------------------------------------------------------------- layout


class TensorLayout(NamedTuple):
    """One layer's K or V data inside a blob (offsets relative to the blob start).

    Attributes:
        kind: ``"k"`` or ``"v"``.
        layer: index of the layer within its cache section (0-based).
        ggml_type: ggml type id of the data (1 = f16).
        transposed: V stored channel-major (``v_trans``, no flash attention).
        n_embd: values per cell (K/V row length; ``n_embd_v_gqa`` when transposed).
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
        """ggml name of the data type (``"f16"``, ``"q8_0"``, ...)."""
        return _GGML_TYPES[self.ggml_type][0]

    @property
    def n_values(self) -> int:
        """Number of values in the tensor (``n_embd * n_cells``)."""
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
    """One cache section (a ``llama_kv_cache``): a plain model has one, iSWA two.

    Attributes:
        index: section index (iSWA: 0 = base / full attention, 1 = sliding window).
        offset: offset of the section's ``n_stream`` field.
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

    # ``name % args`` names the field in the error; it is formatted only on failure.
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

# data_size(kind, ggml_type, n_values, raw_size) -> bytes stored for that tensor
_SizeFn = Any


def _raw_size(kind: str, ggml_type: int, n_values: int, raw_size: int) -> int:
    del kind, ggml_type, n_values
    return raw_size


def _check_type(r: _Reader, ggml_type: int, kind: str, layer: int) -> tuple[str, int, int]:
    traits = _GGML_TYPES.get(ggml_type)
    if traits is None:
        raise CodecError(f"{r.what}: {kind} of layer {layer} has unknown ggml type {ggml_type} at offset {r.pos - 12}")
    return traits


def _parse_cells(r: _Reader, n_cells: int, ext: int) -> np.ndarray:
    """Read ``n_cells`` cell records; return their positions (int32, read-only)."""
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
    """Parse and validate a ``llama_state_seq_get_data`` blob.

    Args:
        blob: the blob (any contiguous buffer; not copied).
        cell_ext_size: bytes of per-cell extension (``llama_kv_cell_ext``, 12 bytes)
            the cache writes; only M-RoPE (vision) models have one.

    Returns:
        The layout: sections, streams with positions, K/V tensors with offsets.

    Raises:
        CodecError: the blob is not a sequence state this parser understands
            (wrong magic, unknown type, inconsistent sizes, truncated, trailing bytes).
    """
    arr = _as_u8(blob, "state blob")
    return _parse(arr.data, cell_ext_size=cell_ext_size, size_fn=_raw_size, what="state blob")


# --------------------------------------------------------------------------- kernels


class Kernels(Protocol):
    """The number crunching behind the codecs; implementations give identical bytes."""

    name: str

    def quantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        """Quantize ``n`` f16 values of ``src`` into ggml blocks written to ``dst``."""

    def dequantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        """Dequantize the blocks of ``src`` into ``n`` f16 values written to ``dst``."""

    def checksum(self, data: Buffer) -> int:
        """The 64-bit mulfold64 checksum of ``data``."""

    def run_plan(self, plan: np.ndarray, src: np.ndarray, dst: np.ndarray, rot: int) -> None:
        """Run a transcode plan (rows ``op, type, src_off, src_len, dst_off, dst_len``)."""


def _block_bytes(type_id: int) -> int:
    return 34 if type_id == GGML_Q8_0 else 18


def _encoded_size(type_id: int, n: int, rot: int) -> int:
    g = rot or _QK
    return -(-n // g) * (g // _QK) * _block_bytes(type_id)


def _np_fwht(x: np.ndarray) -> np.ndarray:
    """Normalized Hadamard transform along the last axis (32 or 64), same butterflies as C."""
    n_groups, size = x.shape
    h = 1
    while h < size:
        y = x.reshape(n_groups, size // (2 * h), 2, h)
        a = y[:, :, 0, :]
        b = y[:, :, 1, :]
        x = np.stack((a + b, a - b), axis=2).reshape(n_groups, size)
        h *= 2
    return x * _HSCALE[size]


class NumpyKernels:
    """Pure numpy kernels: always available, the reference for the C code."""

    name = "numpy"

    def quantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        with np.errstate(all="ignore"):  # division by zero is masked; inf/NaN are sanitized
            self._quantize(type_id, src, dst, n, rot)

    def dequantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        with np.errstate(all="ignore"):  # crafted scales may be inf/NaN; the result saturates
            self._dequantize(type_id, src, dst, n, rot)

    def _quantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        g = rot or _QK
        n_groups = -(-n // g)
        x = np.zeros(n_groups * g, dtype=np.float32)
        vals = src[: 2 * n].view("<f2").astype(np.float32)
        x[:n] = np.where(np.abs(vals) <= _F16_MAX, vals, np.float32(0))
        if rot:
            x = _np_fwht(x.reshape(n_groups, rot))
        blocks = x.reshape(-1, _QK)
        nb = blocks.shape[0]
        out = dst[: nb * _block_bytes(type_id)].reshape(nb, _block_bytes(type_id))
        if type_id == GGML_Q8_0:
            amax = np.max(np.abs(blocks), axis=1)
            d = amax / np.float32(127)
            inv = np.zeros_like(d)
            np.divide(np.float32(1), d, out=inv, where=d != 0)
            xs = blocks * inv[:, None]
            t = np.trunc(xs)
            step = np.where(np.abs(xs - t) >= np.float32(0.5), np.copysign(np.float32(1), xs), np.float32(0))
            out[:, 2:] = (t + step).astype(np.int8).view(np.uint8)
        else:
            ab = np.abs(blocks)
            amax = ab.max(axis=1)
            first = ab.argmax(axis=1)  # first index of the largest magnitude, like ggml's strict scan
            mx = np.where(amax == 0, np.float32(0), blocks[np.arange(nb), first])
            d = mx / np.float32(-8)
            inv = np.zeros_like(d)
            np.divide(np.float32(1), d, out=inv, where=d != 0)
            y = blocks * inv[:, None] + np.float32(8.5)
            q = np.clip(y.astype(np.int32), 0, 15).astype(np.uint8)
            out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
        out[:, :2] = d.astype("<f2").view(np.uint8).reshape(nb, 2)

    def _dequantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        g = rot or _QK
        n_groups = -(-n // g)
        nb = n_groups * (g // _QK)
        bb = _block_bytes(type_id)
        blocks = src[: nb * bb].reshape(nb, bb)
        d = np.ascontiguousarray(blocks[:, :2]).view("<f2").astype(np.float32)
        if type_id == GGML_Q8_0:
            q = blocks[:, 2:].view(np.int8).astype(np.float32)
        else:
            qs = blocks[:, 2:]
            q = (np.concatenate(((qs & 0x0F), (qs >> 4)), axis=1).astype(np.int8) - np.int8(8)).astype(np.float32)
        y = q * d
        if rot:
            y = _np_fwht(y.reshape(n_groups, rot))
        # saturate instead of rounding to inf; fmin/fmax map a NaN (only a crafted scale
        # can produce one) to +65504, exactly as the C kernels do
        y = np.fmax(np.fmin(y.reshape(-1)[:n], _F16_MAX), -_F16_MAX)
        dst[: 2 * n].view("<f2")[:] = y.astype(np.float16)

    def run_plan(self, plan: np.ndarray, src: np.ndarray, dst: np.ndarray, rot: int) -> None:
        for op, type_id, s_off, s_len, d_off, d_len in plan.tolist():
            if not (0 <= s_off <= s_off + s_len <= src.size and 0 <= d_off <= d_off + d_len <= dst.size):
                raise CodecError(f"transcode step out of bounds: {(op, s_off, s_len, d_off, d_len)}")
            s_view = src[s_off : s_off + s_len]
            d_view = dst[d_off : d_off + d_len]
            if op == _OP_COPY:
                d_view[:] = s_view
            elif op == _OP_QUANTIZE:
                self.quantize(type_id, s_view, d_view, s_len // 2, rot)
            else:
                self.dequantize(type_id, s_view, d_view, d_len // 2, rot)

    def checksum(self, data: Buffer) -> int:
        arr = _as_u8(data, "checksum input")
        n = arr.size
        n_words = n // 8
        words = arr[: 8 * n_words].view("<u8")
        acc = int(words.sum(dtype=np.uint64))  # the "+ w_i" terms
        keys = _checksum_keys()
        chunk = keys.size
        dk = np.empty(min(chunk, n_words), dtype=np.uint64)
        prod = np.empty_like(dk)
        for start in range(0, n_words, chunk):
            w = words[start : start + chunk]
            d = dk[: w.size]
            np.add(keys[: w.size], np.uint64(start * _CK_K1 & _M64), out=d)  # keys (i + 1) * K1
            np.bitwise_xor(d, w, out=d)
            halves = d.view(np.uint32)  # little-endian: low, high 32 bits of each word
            np.multiply(halves[0::2], halves[1::2], out=prod[: w.size], dtype=np.uint64)
            acc += int(prod[: w.size].sum(dtype=np.uint64))
        if n % 8:
            last = int.from_bytes(bytes(arr[8 * n_words :]), "little")
            dkl = last ^ ((n_words + 1) * _CK_K1 & _M64)
            acc += (dkl & 0xFFFFFFFF) * (dkl >> 32) + last
        return _fmix64((acc & _M64) ^ (n * _CK_K2 & _M64))


@functools.cache
def _checksum_keys() -> np.ndarray:
    """``(i + 1) * K1 mod 2**64`` for the first 65,536 words (a chunk of the numpy checksum)."""
    keys = np.arange(1, (1 << 16) + 1, dtype=np.uint64) * np.uint64(_CK_K1)
    keys.setflags(write=False)
    return keys


def _fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _M64
    h ^= h >> 33
    return h


class NativeKernels:
    """The C kernels of ``agentmem._native`` (AVX2+F16C when the CPU has them)."""

    name = "native"

    def __init__(self, module: Any) -> None:
        self._m = module

    @property
    def simd(self) -> str:
        """``"avx2+f16c"`` or ``"portable"``: which C code path runs."""
        return str(self._m.simd())

    def quantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        self._m.quantize(type_id, src, dst, n, rot)

    def dequantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        self._m.dequantize(type_id, src, dst, n, rot)

    def checksum(self, data: Buffer) -> int:
        return int(self._m.checksum(data))

    def run_plan(self, plan: np.ndarray, src: np.ndarray, dst: np.ndarray, rot: int) -> None:
        try:
            self._m.run_plan(plan, src, dst, rot)
        except ValueError as exc:  # a plan that does not fit its buffers: never run, report
            raise CodecError(f"native transcode refused: {exc}") from exc


def _load_native() -> NativeKernels | None:
    try:
        from agentmem import _native  # type: ignore[attr-defined]
    except ImportError as exc:
        logger.debug("agentmem._native not available (%s); using numpy kernels", exc)
        return None
    return NativeKernels(_native)


_NATIVE: Final[NativeKernels | None] = _load_native()
_NUMPY: Final[NumpyKernels] = NumpyKernels()

KERNELS: Final[Mapping[str, Kernels]] = MappingProxyType(
    {"numpy": _NUMPY, **({"native": _NATIVE} if _NATIVE is not None else {})}
)
"""Available kernel implementations by name (``"native"`` only when the extension built)."""


def get_kernels(name: str | None = None) -> Kernels:
    """The kernels to use: ``name`` if given, else native unless ``AGENTMEM_NO_NATIVE=1``.

    Raises:
        PolicyError: ``name`` is not in :data:`KERNELS`.
    """
    if name is None:
        if _NATIVE is not None and os.environ.get("AGENTMEM_NO_NATIVE", "") in ("", "0"):
            return _NATIVE
        return _NUMPY
    try:
        return KERNELS[name]
    except KeyError:
        raise PolicyError(f"unknown kernels {name!r}; available: {', '.join(sorted(KERNELS))}") from None


def checksum(data: Buffer, *, kernels: str | None = None) -> int:
    """The 64-bit mulfold64 checksum the encoded format uses (native or numpy, same value)."""
    return get_kernels(kernels).checksum(data)


def hadamard(x: np.ndarray, block: int = 64, *, kernels: str | None = None) -> np.ndarray:
    """Normalized Hadamard transform of float32 values in groups of ``block`` (a new array).

    The transform is its own inverse up to float32 rounding. Exposed for tests and
    for measuring what rotation does to a distribution.
    """
    if block not in (32, 64):
        raise ConfigError(f"rotation block must be 32 or 64, got {block}")
    out = np.array(x, dtype=np.float32, copy=True).reshape(-1)
    if out.size % block:
        raise ConfigError(f"{out.size} values are not a whole number of {block}-value groups")
    k = get_kernels(kernels)
    if isinstance(k, NativeKernels):
        k._m.hadamard(out, block)
        return out
    return _np_fwht(out.reshape(-1, block)).reshape(-1)


# --------------------------------------------------------------------------- codecs


class Codec(ABC):
    """Strategy: how the data of one f16 K or V tensor is stored at rest."""

    name: ClassVar[str]
    codec_id: ClassVar[int]
    """Id in the encoded header (the ggml type id of the stored format)."""
    bits_per_value: ClassVar[float]
    quantized: ClassVar[bool]

    @abstractmethod
    def encoded_size(self, n_values: int, rot: int) -> int:
        """Bytes this codec stores for ``n_values`` f16 values."""

    @abstractmethod
    def encode(self, kernels: Kernels, src: np.ndarray, dst: np.ndarray, n_values: int, rot: int) -> None:
        """Write the encoding of ``n_values`` f16 values (``src``, uint8) into ``dst``."""

    @abstractmethod
    def decode(self, kernels: Kernels, src: np.ndarray, dst: np.ndarray, n_values: int, rot: int) -> None:
        """Write ``n_values`` f16 values decoded from ``src`` into ``dst`` (uint8)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class F16Codec(Codec):
    """Identity: the f16 rows are stored as they are (round trip is byte-identical)."""

    name = "f16"
    codec_id = GGML_F16
    bits_per_value = 16.0
    quantized = False

    def encoded_size(self, n_values: int, rot: int) -> int:
        return 2 * n_values

    def encode(self, kernels: Kernels, src: np.ndarray, dst: np.ndarray, n_values: int, rot: int) -> None:
        dst[: 2 * n_values] = src[: 2 * n_values]

    def decode(self, kernels: Kernels, src: np.ndarray, dst: np.ndarray, n_values: int, rot: int) -> None:
        dst[: 2 * n_values] = src[: 2 * n_values]


class QuantCodec(Codec):
    """ggml block quantization (``q8_0``: 8.5 bits per value, ``q4_0``: 4.5)."""

    quantized = True

    def __init__(self) -> None:
        self._block_bytes = _block_bytes(self.codec_id)

    def encoded_size(self, n_values: int, rot: int) -> int:
        return _encoded_size(self.codec_id, n_values, rot)

    def encode(self, kernels: Kernels, src: np.ndarray, dst: np.ndarray, n_values: int, rot: int) -> None:
        kernels.quantize(self.codec_id, src, dst, n_values, rot)

    def decode(self, kernels: Kernels, src: np.ndarray, dst: np.ndarray, n_values: int, rot: int) -> None:
        kernels.dequantize(self.codec_id, src, dst, n_values, rot)


class Q8_0Codec(QuantCodec):
    """ggml ``q8_0``: blocks of 32 values, an f16 scale ``amax/127`` and 32 int8."""

    name = "q8_0"
    codec_id = GGML_Q8_0
    bits_per_value = 8.5


class Q4_0Codec(QuantCodec):
    """ggml ``q4_0``: blocks of 32 values, an f16 scale ``max/-8`` and 32 nibbles."""

    name = "q4_0"
    codec_id = GGML_Q4_0
    bits_per_value = 4.5


CODECS: Final[Mapping[str, Codec]] = MappingProxyType({c.name: c for c in (F16Codec(), Q8_0Codec(), Q4_0Codec())})
"""Registered codecs by name."""

_CODECS_BY_ID: Final[Mapping[int, Codec]] = MappingProxyType({c.codec_id: c for c in CODECS.values()})


def get_codec(name: str | Codec) -> Codec:
    """The codec registered as ``name`` (a :class:`Codec` is returned as is).

    Raises:
        PolicyError: no such codec; the message lists the valid names.
    """
    if isinstance(name, Codec):
        return name
    try:
        return CODECS[name]
    except (KeyError, TypeError):
        raise PolicyError(f"unknown codec {name!r}; valid codecs: {', '.join(CODECS)}") from None


def _rotation(rotate: bool | int) -> int:
    if rotate is True:
        return 64
    if rotate is False or rotate == 0:
        return 0
    if rotate in (32, 64):
        return int(rotate)
    raise ConfigError(f"rotate must be False, True, 32 or 64, got {rotate!r}")


_SPEC_RE: Final = re.compile(r"^(?P<k>[a-z0-9_]+)(?:/(?P<v>[a-z0-9_]+))?(?P<rotate>\+rot(?P<block>32|64)?)?$")


@dataclass(frozen=True, slots=True)
class CodecSpec:
    """Codecs for keys and values plus the rotation block (0 = no rotation).

    Build one from a string with :meth:`parse`: ``"f16"``, ``"q8_0"``, ``"q4_0"``,
    ``"q8_0/q4_0"`` (keys/values), each optionally followed by ``"+rot"``
    (Hadamard rotation in 64-value groups) or ``"+rot32"``.
    """

    k: str = "f16"
    v: str = "f16"
    rotate: int = 0

    def __post_init__(self) -> None:
        get_codec(self.k)
        get_codec(self.v)
        if self.rotate not in (0, 32, 64):
            raise ConfigError(f"CodecSpec.rotate must be 0, 32 or 64, got {self.rotate!r}")

    @classmethod
    def parse(cls, spec: str | CodecSpec) -> CodecSpec:
        """Parse ``"<k>[/<v>][+rot[32|64]]"``.

        Raises:
            PolicyError: unknown codec name or malformed string (lists valid names).
        """
        if isinstance(spec, CodecSpec):
            return spec
        m = _SPEC_RE.match(spec.strip().lower()) if isinstance(spec, str) else None
        if m is None:
            raise PolicyError(
                f"malformed codec spec {spec!r}; expected '<k>[/<v>][+rot[32|64]]' with codecs "
                f"{', '.join(CODECS)} (e.g. 'q8_0/q4_0', 'q4_0+rot')"
            )
        k = get_codec(m["k"]).name
        v = get_codec(m["v"] or m["k"]).name
        rot = int(m["block"] or 64) if m["rotate"] else 0
        return cls(k, v, rot)

    @property
    def name(self) -> str:
        """Canonical string form (parses back to an equal spec)."""
        base = self.k if self.k == self.v else f"{self.k}/{self.v}"
        if self.rotate:
            base += "+rot" if self.rotate == 64 else f"+rot{self.rotate}"
        return base

    def encode(
        self, blob: Buffer, *, cell_ext_size: int = 0, kernels: str | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """:func:`encode_state` with this spec."""
        return encode_state(
            blob,
            k_codec=self.k,
            v_codec=self.v,
            rotate=self.rotate,
            cell_ext_size=cell_ext_size,
            kernels=kernels,
            out=out,
        )


# --------------------------------------------------------------------------- encoded format


@dataclass(frozen=True, slots=True)
class EncodedInfo:
    """Header facts of an encoded state (read without verifying the checksum).

    Attributes:
        k_codec: codec of the keys.
        v_codec: codec of the values.
        rotate: rotation block (0 = none).
        n_bytes: length of the encoded state.
        original_bytes: length of the blob it decodes to.
        format_version: encoded format version.
        cell_ext_size: per-cell extension bytes of the blob.
    """

    k_codec: str
    v_codec: str
    rotate: int
    n_bytes: int
    original_bytes: int
    format_version: int
    cell_ext_size: int

    @property
    def codec(self) -> str:
        """The spec string, e.g. ``"q8_0/q4_0"`` or ``"q4_0+rot"``."""
        return CodecSpec(self.k_codec, self.v_codec, self.rotate).name

    @property
    def ratio(self) -> float:
        """Encoded bytes / original bytes."""
        return self.n_bytes / self.original_bytes if self.original_bytes else 1.0


def _read_header(arr: np.ndarray) -> tuple[EncodedInfo, int]:
    n = arr.size
    if n < _HEADER.size + _TRAILER.size:
        raise CodecError(f"encoded state truncated: {n} bytes, the header alone is {_HEADER.size + _TRAILER.size}")
    magic, version, k_id, v_id, rot, ck_alg, ext, reserved, orig_len, payload_len = _HEADER.unpack_from(arr.data, 0)
    if magic != ENCODED_MAGIC:
        raise CodecError(f"not an agentmem encoded state (magic {bytes(magic)!r}, expected {ENCODED_MAGIC!r})")
    if version != FORMAT_VERSION:
        raise CodecError(f"encoded state format version {version} is not supported (this build reads {FORMAT_VERSION})")
    k_codec = _CODECS_BY_ID.get(k_id)
    v_codec = _CODECS_BY_ID.get(v_id)
    if k_codec is None or v_codec is None:
        raise CodecError(f"encoded state names unknown codec ids k={k_id} v={v_id}")
    if rot not in (0, 32, 64):
        raise CodecError(f"encoded state has invalid rotation block {rot}")
    if ck_alg != CHECKSUM_MULFOLD64:
        raise CodecError(f"encoded state uses unknown checksum algorithm {ck_alg}")
    if reserved != 0 or ext % 4 or ext > 1024:
        raise CodecError("encoded state header has invalid reserved/extension fields")
    if _HEADER.size + payload_len + _TRAILER.size != n:
        raise CodecError(
            f"encoded state length {n} does not match its header (payload {payload_len} + {_HEADER.size + _TRAILER.size})"
        )
    info = EncodedInfo(k_codec.name, v_codec.name, rot, n, orig_len, version, ext)
    return info, payload_len


def is_encoded(data: Buffer) -> bool:
    """True when ``data`` starts with the encoded-state magic (no other check)."""
    try:
        arr = _as_u8(data, "data")
    except CodecError:
        return False
    return arr.size >= 4 and bytes(arr[:4]) == ENCODED_MAGIC


def encoded_info(encoded: Buffer) -> EncodedInfo:
    """Cheap header read of an encoded state (codecs, sizes) for stats.

    Raises:
        CodecError: not an encoded state, unsupported version, inconsistent length.
    """
    info, _ = _read_header(_as_u8(encoded, "encoded state"))
    return info


_OP_COPY: Final[int] = 0
_OP_QUANTIZE: Final[int] = 1
_OP_DEQUANTIZE: Final[int] = 2


def _plan(layout: StateLayout, dst_base: int, k: Codec, v: Codec, rot: int, *, encode: bool) -> tuple[np.ndarray, int]:
    """The steps that turn a blob into a payload (or back), and the bytes they write.

    Rows are ``(op, type, src_off, src_len, dst_off, dst_len)`` (the layout of
    ``native/kernels.h``): runs of verbatim bytes (headers, cell metadata, tensors
    that stay as they are) become one copy each; every f16 tensor whose codec
    quantizes becomes one quantize (or dequantize) step.
    """
    rows: list[tuple[int, int, int, int, int, int]] = []
    run_start = 0  # start of the pending verbatim run in src
    d = dst_base
    for t in layout.tensors():
        codec = k if t.kind == "k" else v
        if t.ggml_type != GGML_F16 or not codec.quantized:
            continue
        gap = t.data_offset - run_start
        if gap:
            rows.append((_OP_COPY, 0, run_start, gap, d, gap))
            d += gap
        out = codec.encoded_size(t.n_values, rot) if encode else 2 * t.n_values
        op = _OP_QUANTIZE if encode else _OP_DEQUANTIZE
        rows.append((op, codec.codec_id, t.data_offset, t.data_size, d, out))
        d += out
        run_start = t.data_offset + t.data_size
    tail = layout.n_bytes - run_start
    if tail:
        rows.append((_OP_COPY, 0, run_start, tail, d, tail))
        d += tail
    return np.array(rows, dtype=np.int64).reshape(-1, 6), d - dst_base


def _output_buffer(out: np.ndarray | None, n_bytes: int) -> np.ndarray:
    """A fresh uint8 array of ``n_bytes``, or the first ``n_bytes`` of a caller's buffer."""
    if out is None:
        return np.empty(n_bytes, dtype=np.uint8)
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.ndim != 1 or not out.flags.writeable:
        raise CodecError("out must be a writable 1-D uint8 numpy array")
    if not out.flags.c_contiguous:
        raise CodecError("out must be contiguous")
    if out.size < n_bytes:
        raise CodecError(f"out holds {out.size} bytes, {n_bytes} are needed")
    return out[:n_bytes]


def encode_state(
    blob: Buffer,
    *,
    k_codec: str | Codec = "f16",
    v_codec: str | Codec | None = None,
    rotate: bool | int = False,
    cell_ext_size: int = 0,
    kernels: str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Encode a sequence state blob for storage, quantizing its f16 K and V rows.

    Args:
        blob: a ``llama_state_seq_get_data`` blob (any contiguous buffer).
        k_codec: codec for keys (``"f16"``, ``"q8_0"``, ``"q4_0"``) or a :class:`Codec`.
        v_codec: codec for values; defaults to ``k_codec``.
        rotate: Hadamard-rotate quantized tensors in groups of 64 (``True``) or
            32/64 values; f16 tensors are never rotated.
        cell_ext_size: per-cell extension bytes (M-RoPE models: 12).
        kernels: ``"native"`` or ``"numpy"``; default: native when available.
        out: optional writable 1-D uint8 array to encode into (e.g. a slot of a
            preallocated arena); the result is then a view of its first bytes.

    Returns:
        The encoded state (header, payload, checksum) as a read-only 1-D uint8
        array: any bytes-like consumer (sqlite3, ``bytes(x)``, file writes) takes it
        without a copy; ``x.tobytes()`` gives ``bytes``.

    Raises:
        CodecError: the blob cannot be parsed.
        PolicyError: unknown codec name.
        ConfigError: invalid ``rotate``.
    """
    kc = get_codec(k_codec)
    vc = get_codec(v_codec if v_codec is not None else kc)
    rot = _rotation(rotate)
    if not (kc.quantized or vc.quantized):
        rot = 0  # rotation only ever applies to quantized tensors; keep f16 output canonical
    ker = get_kernels(kernels)
    src = _as_u8(blob, "state blob")
    layout = _parse(src.data, cell_ext_size=cell_ext_size, size_fn=_raw_size, what="state blob")
    payload_len = src.size
    for t in layout.tensors():
        codec = kc if t.kind == "k" else vc
        if t.ggml_type == GGML_F16 and codec.quantized:
            payload_len += codec.encoded_size(t.n_values, rot) - t.data_size
    total = _HEADER.size + payload_len + _TRAILER.size
    out = _output_buffer(out, total)
    _HEADER.pack_into(
        out.data, 0, ENCODED_MAGIC, FORMAT_VERSION, kc.codec_id, vc.codec_id, rot, CHECKSUM_MULFOLD64,
        cell_ext_size, 0, src.size, payload_len,
    )  # fmt: skip
    plan, written = _plan(layout, _HEADER.size, kc, vc, rot, encode=True)
    assert written == payload_len, f"{written=}, {payload_len=}"
    ker.run_plan(plan, src, out, rot)
    _TRAILER.pack_into(out.data, total - _TRAILER.size, ker.checksum(out[: total - _TRAILER.size]))
    out.setflags(write=False)
    return out


def _encoded_size_fn(kc: Codec, vc: Codec, rot: int) -> _SizeFn:
    def size(kind: str, ggml_type: int, n_values: int, raw_size: int) -> int:
        codec = kc if kind == "k" else vc
        if ggml_type == GGML_F16 and codec.quantized:
            return codec.encoded_size(n_values, rot)
        return raw_size

    return size


def decode_state(encoded: Buffer, *, out: np.ndarray | None = None, kernels: str | None = None) -> np.ndarray:
    """Verify and decode an encoded state back to a blob for ``llama_state_seq_set_data``.

    The checksum over header and payload is verified before anything is decoded;
    the payload is then parsed with the same validation as :func:`parse_state`.

    Args:
        encoded: output of :func:`encode_state` (any contiguous buffer).
        out: optional writable uint8 array of at least the original length to
            decode into (avoids page-faulting a fresh 37 MB buffer on every restore).
        kernels: ``"native"`` or ``"numpy"``; default: native when available.

    Returns:
        A uint8 array of exactly the original blob's length (a view of ``out`` when given).
        For f16 tensors of an ``"f16"`` codec the bytes are identical to the original.

    Raises:
        CodecError: not an encoded state, unsupported version, checksum mismatch,
            inconsistent payload, or ``out`` too small.
    """
    arr = _as_u8(encoded, "encoded state")
    info, payload_len = _read_header(arr)
    ker = get_kernels(kernels)
    body_end = arr.size - _TRAILER.size
    (stored,) = _TRAILER.unpack_from(arr.data, body_end)
    actual = ker.checksum(arr[:body_end])
    if actual != stored:
        raise CodecError(f"encoded state checksum mismatch (stored {stored:#018x}, computed {actual:#018x}): corrupted")
    kc, vc = CODECS[info.k_codec], CODECS[info.v_codec]
    payload = arr[_HEADER.size : body_end]
    layout = _parse(
        payload.data,
        cell_ext_size=info.cell_ext_size,
        size_fn=_encoded_size_fn(kc, vc, info.rotate),
        what="encoded payload",
    )
    expected = payload_len
    for t in layout.tensors():
        codec = kc if t.kind == "k" else vc
        if t.ggml_type == GGML_F16 and codec.quantized:
            expected += 2 * t.n_values - t.data_size
    if expected != info.original_bytes:
        raise CodecError(f"encoded state decodes to {expected} bytes but its header says {info.original_bytes}")
    dst = _output_buffer(out, expected)
    plan, written = _plan(layout, 0, kc, vc, info.rotate, encode=False)
    assert written == expected, f"{written=}, {expected=}"
    ker.run_plan(plan, payload, dst, info.rotate)
    return dst


def _log_backend() -> None:
    if _NATIVE is not None:
        logger.debug("codec kernels: native (%s)", _NATIVE.simd)
    else:
        logger.debug("codec kernels: numpy")


_log_backend()
