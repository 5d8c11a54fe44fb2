"""Parked states: an agent's KV state copied out of its sequence into RAM.

`ParkedState` holds the (possibly quantized) bytes; a *park codec*
(`make_park_codec`) turns llama.cpp's f16 state blob into them and back.
`f16` keeps llama.cpp's bytes untouched (zero work on the restore path);
`q8_0`/`q4_0`/`K/V` specs go through `agentmem.codec`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentmem.errors import PolicyError

__all__ = ["ParkCodec", "ParkedState", "make_park_codec"]


@dataclass(frozen=True, slots=True)
class ParkedState:
    """A parked KV state: `data` in `codec` format, `n_tokens` cells.

    With `block` set, `data` holds only the agent's private cells: the
    shared prefix's cells are in that `agentmem.memory.shared.KVBlock`
    and `order` joins the two (`agentmem.codec.join_state`).
    With `window_order` set, `window_ckpt` holds only the checkpoint's cells that the
    state's own sliding-window layers lack (the reply's), joined on use.
    """

    data: np.ndarray
    codec: str
    n_tokens: int
    #: sliding-window layers as of the last prompt's end (see MemoryPool), kept in RAM only
    window_ckpt: np.ndarray | None = None
    block: str | None = None
    order: np.ndarray | None = None
    window_order: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        n = int(self.data.nbytes)
        for extra in (self.window_ckpt, self.order, self.window_order):
            if extra is not None:
                n += int(extra.nbytes)
        return n


class ParkCodec:
    """Encode/decode whole state blobs for parking (identity for `f16`)."""

    def __init__(self, spec: str, *, rotate: bool = False) -> None:
        self.spec = spec
        self.rotate = rotate
        parts = spec.split("/")
        if len(parts) == 1:
            parts = [parts[0], parts[0]]
        if len(parts) != 2 or not all(parts):
            raise PolicyError(f"park_codec {spec!r} must be NAME or KEYS/VALUES, e.g. 'q8_0' or 'q8_0/q4_0'")
        self.k, self.v = parts
        self.identity = self.k == "f16" and self.v == "f16"
        if not self.identity:
            from agentmem import codec as _codec

            for name in (self.k, self.v):
                _codec.get_codec(name)  # raises PolicyError listing the valid names
            self._codec = _codec

    def encode(self, blob: np.ndarray, *, n_tokens: int) -> ParkedState:
        if self.identity:
            return ParkedState(blob, "f16", n_tokens)
        enc = self._codec.encode_state(blob, k_codec=self.k, v_codec=self.v, rotate=self.rotate)
        return ParkedState(np.frombuffer(enc, dtype=np.uint8) if not isinstance(enc, np.ndarray) else enc, self.spec, n_tokens)

    def decode(self, parked: ParkedState) -> np.ndarray:
        if parked.codec == "f16":
            return parked.data
        out = self._codec.decode_state(parked.data)
        return out if isinstance(out, np.ndarray) else np.frombuffer(out, dtype=np.uint8)


def make_park_codec(spec: str, *, rotate: bool = False) -> ParkCodec:
    """The park codec for a spec such as `"f16"`, `"q8_0"` or `"q8_0/q4_0"`."""
    return ParkCodec(spec, rotate=rotate)
