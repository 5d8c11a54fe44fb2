"""One llama.cpp context with several sequences, and the token batches it decodes.

(The model it runs, `LlamaModel`, is in `agentmem.engine.llama_model`; both are
importable from here.)

* `LlamaContext` is one `llama_context` with several sequences in a
  unified KV cache: batched decode of token runs, sequence operations
  (`seq_rm`/`seq_cp`/`seq_add`) and per-sequence state get/set. All calls that
  touch the context go through one re-entrant lock; a context is not thread-safe.
* `TokenBatch` is a `llama_batch` whose arrays are numpy buffers, so
  filling a batch of N tokens costs a few numpy assignments, not N Python steps.

Handles free themselves deterministically on `close()`/`__exit__` (idempotent)
and, as a last resort, on garbage collection; a context keeps its model alive.
Every C return code is checked at once and turned into `EngineError`
naming the call.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from agentmem.engine.threads import default_threads
from agentmem.errors import ConfigError, EngineError

try:  # gated: llama-cpp-python is a hard dependency, but give a clear message
    import llama_cpp as _ll
except ImportError as exc:  # pragma: no cover - exercised only without the dependency
    raise ImportError(
        "agentmem needs llama-cpp-python: pip install 'llama-cpp-python>=0.3.36,<0.4'"
    ) from exc

from agentmem.engine import llama_log  # after the gate: it imports llama_cpp too
from agentmem.engine.llama_model import KVType, LlamaModel, llama_build_info

__all__ = ["KVType", "LlamaContext", "LlamaModel", "TokenBatch", "llama_build_info"]

logger = logging.getLogger(__name__)

_SWA_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_SWA_ONLY / PARTIAL_ONLY
class TokenBatch:
    """A `llama_batch` backed by numpy arrays (one sequence id per token).

    Filling it is vectorized: `fill(tokens, pos0, seq)` writes the token ids,
    positions and sequence ids with numpy, no per-token Python loop.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        # seq_id is int32** in C: one pointer per token into self.seq_ids
        base = self.seq_ids.ctypes.data
        self._seq_ptrs = (np.arange(capacity, dtype=np.uint64) * 4 + np.uint64(base)).astype(np.uint64)
        self.batch = _ll.llama_batch()
        self.batch.token = self.tokens.ctypes.data_as(ctypes.POINTER(_ll.llama_token))
        self.batch.embd = ctypes.POINTER(ctypes.c_float)()
        self.batch.pos = self.pos.ctypes.data_as(ctypes.POINTER(_ll.llama_pos))
        self.batch.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.batch.seq_id = ctypes.cast(
            ctypes.c_void_p(self._seq_ptrs.ctypes.data), ctypes.POINTER(ctypes.POINTER(_ll.llama_seq_id))
        )
        self.batch.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.n = 0

    def clear(self) -> None:
        self.n = 0

    def add_run(self, tokens: Sequence[int] | np.ndarray, pos0: int, seq: int, *, logits_last: bool) -> int:
        """Append a run of tokens of one sequence at positions `pos0...`.

        Returns the batch index of the run's last token (where its logits land).
        """
        k = len(tokens)
        i = self.n
        if i + k > self.capacity:
            raise EngineError(f"batch overflow: {i}+{k} > {self.capacity}")
        self.tokens[i : i + k] = tokens
        self.pos[i : i + k] = np.arange(pos0, pos0 + k, dtype=np.int32)
        self.seq_ids[i : i + k] = seq
        self.logits[i : i + k] = 0
        if logits_last and k:
            self.logits[i + k - 1] = 1
        self.n = i + k
        return i + k - 1

    def finish(self) -> _ll.llama_batch:
        self.batch.n_tokens = self.n
        return self.batch


@dataclass(frozen=True, slots=True)
class ContextParams:
    """Low-level settings of one `LlamaContext` (see `PoolConfig` for docs)."""

    n_ctx: int = 8192
    n_seq_max: int = 4
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = True
    kv_unified: bool = True


class LlamaContext:
    """One `llama_context` with `n_seq_max` sequences in a unified KV cache.

    All methods take the context's lock; callers that chain several calls
    (restore, then decode) may hold `ctx.lock` themselves (it is re-entrant).

    Example:

    Example:
        >>> ctx = LlamaContext(model, ContextParams(n_ctx=2048, n_seq_max=2))  # doctest: +SKIP
        >>> idx = ctx.decode_run(seq=0, tokens=model.tokenize("Hi", add_special=True), pos0=0)  # doctest: +SKIP
        >>> blob = ctx.state_get(0); ctx.state_set(1, blob)                      # doctest: +SKIP
    """

    def __init__(self, model: LlamaModel, params: ContextParams) -> None:
        if params.n_seq_max < 1:
            raise ConfigError(f"n_seq_max must be >= 1, got {params.n_seq_max}")
        for field in ("type_k", "type_v"):
            if getattr(params, field) not in KVType:
                raise ConfigError(f"{field}={getattr(params, field)!r} is not one of {sorted(KVType)}")
        if params.type_v != "f16" and params.type_v != "f32" and not params.flash_attn:
            raise ConfigError(f"type_v={params.type_v!r} (a quantized V cache) needs flash_attn=True")
        self.model = model
        self.params = params
        self.lock = threading.RLock()
        cp = _ll.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.n_ubatch
        cp.n_seq_max = params.n_seq_max
        threads = params.n_threads or default_threads()
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn_type = 1 if params.flash_attn else 0
        cp.type_k = KVType[params.type_k]
        cp.type_v = KVType[params.type_v]
        cp.swa_full = params.swa_full
        cp.kv_unified = params.kv_unified
        cp.no_perf = True
        ptr = _ll.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise EngineError(
                f"llama_init_from_model failed (n_ctx={params.n_ctx}, n_seq_max={params.n_seq_max}, "
                f"type_k={params.type_k}, type_v={params.type_v}, flash_attn={params.flash_attn})"
            )
        self._ptr = ptr
        self._closed = False
        self._mem = _ll.llama_get_memory(ptr)
        self.n_ctx: int = _ll.llama_n_ctx(ptr)
        self.n_ctx_seq: int = _ll.llama_n_ctx_seq(ptr)
        self.n_batch = params.n_batch
        self.can_shift: bool = bool(_ll.llama_memory_can_shift(self._mem))
        self._batch = TokenBatch(params.n_batch)
        self.n_vocab = model.n_vocab

    # -- lifetime -----------------------------------------------------------
    @property
    def ptr(self) -> int:
        if self._closed:
            raise EngineError("context is closed")
        return self._ptr

    def close(self) -> None:
        """Free the context (idempotent). Every later operation raises `EngineError`."""
        if not getattr(self, "_closed", True):
            with self.lock:
                self._closed = True
                _ll.llama_free(self._ptr)

    def _memory(self) -> Any:
        """The KV memory handle (lock held); `EngineError` once closed, never a freed pointer."""
        if self._closed:
            raise EngineError("context is closed")
        return self._mem

    def __enter__(self) -> LlamaContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover
            pass

    # -- decode -----------------------------------------------------------------
    def _check_seq(self, seq: int) -> None:
        # A seq id >= n_seq_max aborts the whole process inside llama.cpp.
        if not 0 <= seq < self.params.n_seq_max:
            raise EngineError(f"sequence id {seq} out of range [0, {self.params.n_seq_max})")

    def decode_run(self, seq: int, tokens: Sequence[int] | np.ndarray, pos0: int) -> int:
        """Decode `tokens` into `seq` at positions `pos0...` (chunked by `n_batch`).

        Logits are computed for the last token only. Returns the batch index to
        pass to `logits` / the sampler (valid until the next decode).
        Raises `EngineError` (`code` attribute 1 = no KV slot).
        """
        self._check_seq(seq)
        n = len(tokens)
        if n == 0:
            raise EngineError("decode_run called with no tokens")
        arr = np.asarray(tokens, dtype=np.int32)
        last = -1
        with self.lock:
            b = self._batch
            for start in range(0, n, self.n_batch):
                chunk = arr[start : start + self.n_batch]
                b.clear()
                last = b.add_run(chunk, pos0 + start, seq, logits_last=start + len(chunk) == n)
                self._decode(b)
        return last

    def decode_multi(self, runs: Sequence[tuple[int, Sequence[int], int]]) -> list[int]:
        """Decode several sequences' runs in one batch: `[(seq, tokens, pos0), ...]`.

        Each run gets logits for its last token; returns their batch indices.
        The total must fit in `n_batch`.
        """
        with self.lock:
            b = self._batch
            b.clear()
            out = []
            for seq, toks, pos0 in runs:
                self._check_seq(seq)
                out.append(b.add_run(toks, pos0, seq, logits_last=True))
            self._decode(b)
            return out

    def _decode(self, b: TokenBatch) -> None:
        rc = _ll.llama_decode(self.ptr, b.finish())
        if rc != 0:
            err = EngineError(
                f"llama_decode returned {rc}"
                + (" (no free KV slot: the context is full)" if rc == 1 else "")
            )
            err.code = rc  # type: ignore[attr-defined]
            raise err

    def logits(self, idx: int) -> np.ndarray:
        """A copy of the logits row at batch index `idx` (float32, n_vocab)."""
        with self.lock:
            p = _ll.llama_get_logits_ith(self.ptr, idx)
            if not p:
                raise EngineError(f"llama_get_logits_ith({idx}) returned NULL")
            return np.ctypeslib.as_array(p, shape=(self.n_vocab,)).copy()

    # -- sequence operations -----------------------------------------------------
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """Remove cells of `seq` with positions in `[p0, p1)` (-1 = open end)."""
        self._check_seq(seq)
        with self.lock:
            if not _ll.llama_memory_seq_rm(self._memory(), seq, p0, p1):
                raise EngineError(f"llama_memory_seq_rm(seq={seq}, {p0}, {p1}) failed (partial removal unsupported?)")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Share `src`'s cells in `[p0, p1)` with `dst` (tags cells in a unified cache)."""
        self._check_seq(src)
        self._check_seq(dst)
        with self.lock:
            _ll.llama_memory_seq_cp(self._memory(), src, dst, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions of `seq` in `[p0, p1)` by `delta` (needs `can_shift`)."""
        self._check_seq(seq)
        if not self.can_shift:
            raise EngineError("this KV cache cannot shift positions (swa_full=False?)")
        with self.lock:
            _ll.llama_memory_seq_add(self._memory(), seq, p0, p1, delta)

    def seq_pos_min(self, seq: int) -> int:
        self._check_seq(seq)
        with self.lock:
            return _ll.llama_memory_seq_pos_min(self._memory(), seq)

    def seq_pos_max(self, seq: int) -> int:
        self._check_seq(seq)
        with self.lock:
            return _ll.llama_memory_seq_pos_max(self._memory(), seq)

    def clear(self) -> None:
        """Drop every cell of every sequence."""
        with self.lock:
            _ll.llama_memory_clear(self._memory(), True)

    # -- state ------------------------------------------------------------------
    def state_size(self, seq: int) -> int:
        """Bytes of `seq`'s state blob."""
        self._check_seq(seq)
        with self.lock:
            return _ll.llama_state_seq_get_size(self.ptr, seq)

    def cells_size(self) -> int:
        """Bytes of *all* used KV cells, each counted once (shared cells too).

        This is the sequence-state size of `seq_id = -1` (every sequence), so
        comparing it with the sum of per-sequence sizes measures what prefix
        sharing saves.
        """
        with self.lock:
            return _ll.llama_state_seq_get_size(self.ptr, -1)

    def state_get(self, seq: int) -> np.ndarray:
        """Copy `seq`'s KV state out as a uint8 array (one copy, no Python bytes)."""
        self._check_seq(seq)
        with self.lock:
            size = _ll.llama_state_seq_get_size(self.ptr, seq)
            buf = np.empty(size, dtype=np.uint8)
            n = _ll.llama_state_seq_get_data(
                self.ptr, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq
            )
            if n != size:
                raise EngineError(f"llama_state_seq_get_data(seq={seq}) wrote {n} of {size} bytes")
            return buf

    def swa_state_get(self, seq: int) -> np.ndarray:
        """Copy out only the sliding-window layers of `seq` (`PARTIAL_ONLY` state).

        A state blob keeps those layers only for the last window before the
        sequence's end; capturing them at an earlier end (a *checkpoint*) lets a
        restored sequence roll back to it. Empty for models without SWA.
        """
        self._check_seq(seq)
        with self.lock:
            size = _ll.llama_state_seq_get_size_ext(self.ptr, seq, _SWA_ONLY)
            buf = np.empty(size, dtype=np.uint8)
            n = _ll.llama_state_seq_get_data_ext(self.ptr, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq, _SWA_ONLY)
            if n != size:
                raise EngineError(f"llama_state_seq_get_data_ext(seq={seq}, SWA_ONLY) wrote {n} of {size} bytes")
            return buf

    def swa_state_set(self, seq: int, blob: np.ndarray) -> int:
        """Replace only the sliding-window layers of `seq` from `swa_state_get` (0 = rejected)."""
        self._check_seq(seq)
        with self.lock, llama_log.restore_attempt():
            return _ll.llama_state_seq_set_data_ext(
                self.ptr, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), blob.nbytes, seq, _SWA_ONLY
            )

    def state_set(self, seq: int, blob: np.ndarray | bytes | bytearray | memoryview) -> int:
        """Load a state blob into `seq` (its old cells are dropped first).

        Returns the number of bytes read; `0` means llama.cpp rejected the blob
        (wrong layout or not enough free cells) and `seq` is now empty.
        """
        self._check_seq(seq)
        arr = np.frombuffer(blob, dtype=np.uint8) if not isinstance(blob, np.ndarray) else blob
        if arr.dtype != np.uint8 or not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr, dtype=np.uint8)
        with self.lock, llama_log.restore_attempt():
            _ll.llama_memory_seq_rm(self._memory(), seq, -1, -1)
            return _ll.llama_state_seq_set_data(
                self.ptr, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), arr.nbytes, seq
            )
