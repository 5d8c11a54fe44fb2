"""KV-state codec: parse llama.cpp sequence states, store their K/V rows as q8_0/q4_0, cut and join shared blocks.

* `layout` parses and validates a `llama_state_seq_get_data` blob into a `StateLayout`
  (sections, streams, cell positions, per-layer K/V tensors with offsets) with `parse_state`.
* `kernels` does the number crunching behind the `Kernels` interface, in the C extension
  `agentmem._native` or in numpy (identical bytes; `AGENTMEM_NO_NATIVE=1` forces numpy).
* `formats` holds the `Codec` strategies (`F16Codec`, `Q8_0Codec`, `Q4_0Codec`), registered
  by name in `CODECS` and looked up with `get_codec`.
* `container` frames an encoded state (header, payload, checksum) with `encode_state` and
  `decode_state`, reads its header into an `EncodedInfo` with `encoded_info`, and parses
  `CodecSpec`, the choice of codecs for keys and values and of rotation.
* `surgery` cuts a state blob into a shared block's cells and its own with `split_state`
  and rebuilds it byte for byte with `join_state`.

Example:
    >>> from agentmem.codec import CodecSpec, decode_state, encode_state, parse_state
    >>> enc = CodecSpec.parse("q8_0/q4_0").encode(blob)  # doctest: +SKIP
    >>> parse_state(decode_state(enc)).n_cells  # doctest: +SKIP
    2000
"""

from agentmem.codec.container import (
    ENCODED_MAGIC,
    FORMAT_VERSION,
    CodecSpec,
    EncodedInfo,
    decode_state,
    encode_state,
    encoded_info,
    is_encoded,
)
from agentmem.codec.formats import CODECS, Codec, F16Codec, Q4_0Codec, Q8_0Codec, QuantCodec, get_codec
from agentmem.codec.kernels import KERNELS, Kernels, NativeKernels, NumpyKernels, checksum, get_kernels, hadamard
from agentmem.codec.layout import (
    BLOB_MAGIC,
    GGML_F16,
    GGML_Q4_0,
    GGML_Q8_0,
    SectionLayout,
    StateLayout,
    StreamLayout,
    TensorLayout,
    parse_state,
)
from agentmem.codec.surgery import join_state, split_state

__all__ = [
    "BLOB_MAGIC",
    "CODECS",
    "ENCODED_MAGIC",
    "FORMAT_VERSION",
    "GGML_F16",
    "GGML_Q4_0",
    "GGML_Q8_0",
    "KERNELS",
    "Codec",
    "CodecSpec",
    "EncodedInfo",
    "F16Codec",
    "Kernels",
    "NativeKernels",
    "NumpyKernels",
    "Q4_0Codec",
    "Q8_0Codec",
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
    "join_state",
    "parse_state",
    "split_state",
]
