"""The codec strategies: how the data of one f16 K or V tensor is stored at rest.

`Codec` is the interface; `F16Codec` stores the f16 rows as they are (identity),
`QuantCodec` with its subclasses `Q8_0Codec` and `Q4_0Codec` stores them in
ggml's exact `q8_0` / `q4_0` block formats (about a half or a quarter of the f16
bytes). Each is registered by name in `CODECS`; `get_codec` raises
`PolicyError` listing the valid names.

Example:
    >>> from agentmem.codec import get_codec
    >>> get_codec("q8_0").bits_per_value, get_codec("q4_0").encoded_size(64, 0)
    (8.5, 36)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar, Final

import numpy as np

from agentmem.codec.kernels import Kernels, _block_bytes, _encoded_size
from agentmem.codec.layout import GGML_F16, GGML_Q4_0, GGML_Q8_0
from agentmem.errors import PolicyError

__all__ = ["CODECS", "Codec", "F16Codec", "Q4_0Codec", "Q8_0Codec", "QuantCodec", "get_codec"]


class Codec(ABC):
    """Strategy: how the data of one f16 K or V tensor is stored at rest."""

    name: ClassVar[str]
    codec_id: ClassVar[int]
    """Id in the encoded header (the ggml type id of the stored format)."""
    bits_per_value: ClassVar[float]
    quantized: ClassVar[bool]

    @abstractmethod
    def encoded_size(self, n_values: int, rot: int) -> int:
        """Bytes this codec stores for `n_values` f16 values."""

    @abstractmethod
    def encode(self, kernels: Kernels, src: np.ndarray, dst: np.ndarray, n_values: int, rot: int) -> None:
        """Write the encoding of `n_values` f16 values (`src`, uint8) into `dst`."""

    @abstractmethod
    def decode(self, kernels: Kernels, src: np.ndarray, dst: np.ndarray, n_values: int, rot: int) -> None:
        """Write `n_values` f16 values decoded from `src` into `dst` (uint8)."""

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
    """ggml block quantization (`q8_0`: 8.5 bits per value, `q4_0`: 4.5)."""

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
    """ggml `q8_0`: blocks of 32 values, an f16 scale `amax/127` and 32 int8."""

    name = "q8_0"
    codec_id = GGML_Q8_0
    bits_per_value = 8.5


class Q4_0Codec(QuantCodec):
    """ggml `q4_0`: blocks of 32 values, an f16 scale `max/-8` and 32 nibbles."""

    name = "q4_0"
    codec_id = GGML_Q4_0
    bits_per_value = 4.5


CODECS: Final[Mapping[str, Codec]] = MappingProxyType({c.name: c for c in (F16Codec(), Q8_0Codec(), Q4_0Codec())})
"""Registered codecs by name."""

_CODECS_BY_ID: Final[Mapping[int, Codec]] = MappingProxyType({c.codec_id: c for c in CODECS.values()})


def get_codec(name: str | Codec) -> Codec:
    """The codec registered as `name` (a `Codec` is returned as is).

    Raises:
        PolicyError: no such codec; the message lists the valid names.
    """
    if isinstance(name, Codec):
        return name
    try:
        return CODECS[name]
    except (KeyError, TypeError):
        raise PolicyError(f"unknown codec {name!r}; valid codecs: {', '.join(CODECS)}") from None
