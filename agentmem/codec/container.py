"""The encoded container: a state blob with its f16 K/V data re-encoded, framed and checksummed.

`encode_state` turns a llama.cpp sequence state into the container and
`decode_state` verifies and turns it back; `CodecSpec` names the choice for keys,
values and rotation (`"q8_0/q4_0"`, `"q4_0+rot"`); `encoded_info` reads an
`EncodedInfo` from the header alone and `is_encoded` checks the magic. Both
directions run as one transcode plan over the blob's layout (`_plan`), executed
by the kernels.

Encoded format (version 1), little-endian:

```text
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
```

Example:
    >>> from agentmem.codec import CodecSpec, decode_state, encode_state, parse_state
    >>> CodecSpec.parse("q8_0/q4_0+rot").name
    'q8_0/q4_0+rot'
    >>> enc = encode_state(blob, k_codec="q8_0", v_codec="q4_0")  # doctest: +SKIP
    >>> restored = decode_state(enc)  # doctest: +SKIP
    >>> parse_state(restored).n_cells  # doctest: +SKIP
    2000
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Final

import numpy as np

from agentmem.codec.formats import _CODECS_BY_ID, CODECS, Codec, get_codec
from agentmem.codec.kernels import _OP_COPY, _OP_DEQUANTIZE, _OP_QUANTIZE, get_kernels
from agentmem.codec.layout import GGML_F16, Buffer, StateLayout, _as_u8, _parse, _raw_size, _SizeFn
from agentmem.errors import CodecError, ConfigError, PolicyError

__all__ = [
    "CHECKSUM_MULFOLD64",
    "ENCODED_MAGIC",
    "FORMAT_VERSION",
    "CodecSpec",
    "EncodedInfo",
    "decode_state",
    "encode_state",
    "encoded_info",
    "is_encoded",
]

ENCODED_MAGIC: Final[bytes] = b"AMKV"
FORMAT_VERSION: Final[int] = 1
CHECKSUM_MULFOLD64: Final[int] = 1

_HEADER: Final = struct.Struct("<4sHBBBBHIQQ")
_TRAILER: Final = struct.Struct("<Q")


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

    Build one from a string with `parse`: `"f16"`, `"q8_0"`, `"q4_0"`,
    `"q8_0/q4_0"` (keys/values), each optionally followed by `"+rot"`
    (Hadamard rotation in 64-value groups) or `"+rot32"`.
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
        """Parse `"<k>[/<v>][+rot[32|64]]"`.

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
        """`encode_state` with this spec."""
        return encode_state(
            blob,
            k_codec=self.k,
            v_codec=self.v,
            rotate=self.rotate,
            cell_ext_size=cell_ext_size,
            kernels=kernels,
            out=out,
        )


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
        """The spec string, e.g. `"q8_0/q4_0"` or `"q4_0+rot"`."""
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
    """True when `data` starts with the encoded-state magic (no other check)."""
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


def _plan(layout: StateLayout, dst_base: int, k: Codec, v: Codec, rot: int, *, encode: bool) -> tuple[np.ndarray, int]:
    """The steps that turn a blob into a payload (or back), and the bytes they write.

    Rows are `(op, type, src_off, src_len, dst_off, dst_len)` (the layout of
    `native/kernels.h`): runs of verbatim bytes (headers, cell metadata, tensors
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
    """A fresh uint8 array of `n_bytes`, or the first `n_bytes` of a caller's buffer."""
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
        blob: a `llama_state_seq_get_data` blob (any contiguous buffer).
        k_codec: codec for keys (`"f16"`, `"q8_0"`, `"q4_0"`) or a `Codec`.
        v_codec: codec for values; defaults to `k_codec`.
        rotate: Hadamard-rotate quantized tensors in groups of 64 (`True`) or
            32/64 values; f16 tensors are never rotated.
        cell_ext_size: per-cell extension bytes (M-RoPE models: 12).
        kernels: `"native"` or `"numpy"`; default: native when available.
        out: optional writable 1-D uint8 array to encode into (e.g. a slot of a
            preallocated arena); the result is then a view of its first bytes.

    Returns:
        The encoded state (header, payload, checksum) as a read-only 1-D uint8
            array: any bytes-like consumer (sqlite3, `bytes(x)`, file writes) takes it
            without a copy; `x.tobytes()` gives `bytes`.

    Raises:
        CodecError: the blob cannot be parsed.
        PolicyError: unknown codec name.
        ConfigError: invalid `rotate`.
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
    """Verify and decode an encoded state back to a blob for `llama_state_seq_set_data`.

    The checksum over header and payload is verified before anything is decoded;
    the payload is then parsed with the same validation as `parse_state`.

    Args:
        encoded: output of `encode_state` (any contiguous buffer).
        out: optional writable uint8 array of at least the original length to
            decode into (avoids page-faulting a fresh 37 MB buffer on every restore).
        kernels: `"native"` or `"numpy"`; default: native when available.

    Returns:
        A uint8 array of exactly the original blob's length (a view of `out` when given).
            For f16 tensors of an `"f16"` codec the bytes are identical to the original.

    Raises:
        CodecError: not an encoded state, unsupported version, checksum mismatch,
            inconsistent payload, or `out` too small.
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
