"""The number crunching behind the codecs: quantize, dequantize, rotate, checksum.

`Kernels` is the interface; `NativeKernels` runs the C extension
`agentmem._native` (AVX2+F16C when the CPU has them) and `NumpyKernels` is the
pure-numpy reference. Both produce identical bytes; numpy is used when the
extension is missing or when the environment variable `AGENTMEM_NO_NATIVE=1` is
set (`get_kernels`).

Quantization treats a tensor's data as one flat run of f16 values, in groups of
`max(32, rotation)` values (the last group zero-padded): for K and
non-transposed V that is 32-value blocks along each cell's row; for transposed V
(no flash attention) blocks run along the cells of one channel. A rotation
applies a normalized Hadamard transform (`hadamard`) to each group first.

A transcode plan (`Kernels.run_plan`) is an int64 array of rows
`(op, type, src_off, src_len, dst_off, dst_len)`, the layout of
`native/kernels.h`: op 0 copies, 1 quantizes f16 values, 2 dequantizes them.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, Protocol

import numpy as np

from agentmem.codec.layout import GGML_Q8_0, Buffer, _as_u8
from agentmem.errors import CodecError, ConfigError, PolicyError

__all__ = ["KERNELS", "Kernels", "NativeKernels", "NumpyKernels", "checksum", "get_kernels", "hadamard"]

logger = logging.getLogger(__name__)

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

# transcode plan ops (native/kernels.h)
_OP_COPY: Final[int] = 0
_OP_QUANTIZE: Final[int] = 1
_OP_DEQUANTIZE: Final[int] = 2


class Kernels(Protocol):
    """The number crunching behind the codecs; implementations give identical bytes."""

    name: str

    def quantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        """Quantize `n` f16 values of `src` into ggml blocks written to `dst`."""

    def dequantize(self, type_id: int, src: np.ndarray, dst: np.ndarray, n: int, rot: int) -> None:
        """Dequantize the blocks of `src` into `n` f16 values written to `dst`."""

    def checksum(self, data: Buffer) -> int:
        """The 64-bit mulfold64 checksum of `data`."""

    def run_plan(self, plan: np.ndarray, src: np.ndarray, dst: np.ndarray, rot: int) -> None:
        """Run a transcode plan (rows `op, type, src_off, src_len, dst_off, dst_len`)."""


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
    """`(i + 1) * K1 mod 2**64` for the first 65,536 words (a chunk of the numpy checksum)."""
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
    """The C kernels of `agentmem._native` (AVX2+F16C when the CPU has them)."""

    name = "native"

    def __init__(self, module: Any) -> None:
        self._m = module

    @property
    def simd(self) -> str:
        """`"avx2+f16c"` or `"portable"`: which C code path runs."""
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
    """The C extension's kernels, or `None` where it was not built (numpy is used then)."""
    try:
        # The extension module by its own name, not `from agentmem import _native`: the
        # codec needs the C kernels (native/, the ground floor), nothing of the package face.
        import agentmem._native as _native  # type: ignore[import-not-found]
    except ImportError as exc:
        logger.debug("agentmem._native not available (%s); using numpy kernels", exc)
        return None
    return NativeKernels(_native)


_NATIVE: Final[NativeKernels | None] = _load_native()
_NUMPY: Final[NumpyKernels] = NumpyKernels()

KERNELS: Final[Mapping[str, Kernels]] = MappingProxyType(
    {"numpy": _NUMPY, **({"native": _NATIVE} if _NATIVE is not None else {})}
)
"""Available kernel implementations by name (`"native"` only when the extension built)."""


def get_kernels(name: str | None = None) -> Kernels:
    """The kernels to use: `name` if given, else native unless `AGENTMEM_NO_NATIVE=1`.

    Raises:
        PolicyError: `name` is not in `KERNELS`.
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
    """Normalized Hadamard transform of float32 values in groups of `block` (a new array).

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


def _log_backend() -> None:
    if _NATIVE is not None:
        logger.debug("codec kernels: native (%s)", _NATIVE.simd)
    else:
        logger.debug("codec kernels: numpy")


_log_backend()
