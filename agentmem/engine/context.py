"""The only code in agentmem that talks to llama.cpp.

Three owners of native handles live here:

* `LlamaModel` loads a GGUF file once (weights, vocabulary, chat template)
  and tokenizes / detokenizes.
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
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from agentmem.engine.threads import default_threads
from agentmem.errors import ConfigError, EngineError, ModelError, ModelNotFoundError

try:  # gated: llama-cpp-python is a hard dependency, but give a clear message
    import llama_cpp as _ll
except ImportError as exc:  # pragma: no cover - exercised only without the dependency
    raise ImportError(
        "agentmem needs llama-cpp-python: pip install 'llama-cpp-python>=0.3.36,<0.4'"
    ) from exc

from agentmem.engine import llama_log  # after the gate: it imports llama_cpp too

__all__ = ["KVType", "LlamaContext", "LlamaModel", "TokenBatch", "llama_build_info"]

logger = logging.getLogger(__name__)

#: KV cache element types accepted by `type_k`/`type_v` (name -> ggml type id).
KVType = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}

_SWA_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_SWA_ONLY / PARTIAL_ONLY
_backend_lock = threading.Lock()
_backend_ready = False


def _ensure_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_log.install()
            _ll.llama_backend_init()
            _backend_ready = True


def llama_build_info() -> str:
    """Identify the llama.cpp build (used in state fingerprints).

    >>> llama_build_info()  # doctest: +SKIP
    'llama-cpp-python 0.3.36'
    """
    return f"llama-cpp-python {_ll.__version__}"


class LlamaModel:
    """A loaded GGUF model: weights, vocabulary, metadata.

    Args:
        path: the `.gguf` file.
        n_gpu_layers: layers to offload when llama.cpp was built with CUDA/Metal
            (`-1` = all, `0` = CPU only).
        use_mmap: map the file instead of reading it.

    Example:

        >>> m = LlamaModel("gemma-3-270m-it-Q4_K_M.gguf")   # doctest: +SKIP
        >>> m.tokenize("Hello", add_special=True)            # doctest: +SKIP
        [2, 9259]
    """

    def __init__(self, path: str | os.PathLike[str], *, n_gpu_layers: int = 0, use_mmap: bool = True) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelNotFoundError(f"model file not found: {self.path}")
        _ensure_backend()
        params = _ll.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.use_mmap = use_mmap
        ptr = _ll.llama_model_load_from_file(str(self.path).encode(), params)
        if not ptr:
            raise ModelError(f"llama_model_load_from_file failed for {self.path} (not a valid GGUF model?)")
        self._ptr = ptr
        self._closed = False
        self._vocab = _ll.llama_model_get_vocab(ptr)
        self.n_vocab: int = _ll.llama_vocab_n_tokens(self._vocab)
        self.n_layer: int = _ll.llama_model_n_layer(ptr)
        self.n_ctx_train: int = _ll.llama_model_n_ctx_train(ptr)
        self.n_swa: int = _ll.llama_model_n_swa(ptr)
        self.bos: int = _ll.llama_vocab_bos(self._vocab)
        self.eos: int = _ll.llama_vocab_eos(self._vocab)
        self.add_bos: bool = bool(_ll.llama_vocab_get_add_bos(self._vocab))
        self._piece_cache: dict[int, bytes] = {}
        self._eog_cache: dict[int, bool] = {}
        self._attr_cache: dict[int, int] = {}
        self._markup_cache: dict[str, tuple[tuple[int, int, int, int], ...]] = {}

    # -- lifetime -----------------------------------------------------------
    @property
    def ptr(self) -> int:
        if self._closed:
            raise EngineError("model is closed")
        return self._ptr

    @property
    def vocab(self) -> int:
        if self._closed:
            raise EngineError("model is closed")
        return self._vocab

    def close(self) -> None:
        """Free the model (idempotent). Close contexts using it first."""
        if not getattr(self, "_closed", True):
            self._closed = True
            _ll.llama_model_free(self._ptr)

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # last resort; close() is the contract
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    # -- metadata -------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as a string, or `None` when absent."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = _ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            _ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def chat_template(self) -> str | None:
        """The GGUF's own chat template (jinja2 source), if it ships one."""
        raw = _ll.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", "replace") if raw else None

    def kv_bytes_per_cell(self, type_k: str = "f16", type_v: str = "f16") -> int:
        """Bytes one KV cell takes over all layers (0 when the GGUF lacks the sizes).

        From the GGUF's attention metadata: layers × KV heads × (key_length ×
        size(type_k) + value_length × size(type_v)), plus llama.cpp's per-cell
        metadata in a state blob.
        """
        arch = self.meta("general.architecture") or ""
        try:
            n_layer = int(self.meta(f"{arch}.block_count") or 0)
            heads = int(self.meta(f"{arch}.attention.head_count_kv") or 0)
            head = int(self.meta(f"{arch}.attention.head_count") or 0)
            emb = int(self.meta(f"{arch}.embedding_length") or 0)
            k_len = int(self.meta(f"{arch}.attention.key_length") or (emb // head if head else 0))
            v_len = int(self.meta(f"{arch}.attention.value_length") or k_len)
        except ValueError:  # per-layer arrays (variable KV heads): no single figure
            return 0
        size = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                "q4_1": 20 / 32, "q4_0": 18 / 32}
        per_layer = heads * (k_len * size[type_k] + v_len * size[type_v])
        return int(round(n_layer * per_layer)) + 12 if n_layer and per_layer else 0

    def has_special(self, text: str) -> bool:
        """True when `text` is a single special token of this vocabulary."""
        return len(self.tokenize(text, add_special=False, parse_special=True)) == 1

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        _ll.llama_model_desc(self.ptr, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    # -- text <-> tokens ----------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Tokenize `text`.

        Args:
            text: the text.
            add_special: add BOS when the model wants one.
            parse_special: turn control-token strings such as `<start_of_turn>` into
                their tokens. Off by default: text from users, tools or web pages must
                not become turn markers; only a chat template's own markup may (see
                `tokenize_pieces`).

        Returns:
            The token ids.
        """
        data = text.encode("utf-8")
        # a buffer per call: prompts are rendered outside the pool lock, from many threads
        buf = (_ll.llama_token * (len(data) + 8))()
        n = _ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, parse_special)
        if n < 0:
            buf = (_ll.llama_token * (-n))()
            n = _ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, parse_special)
            if n < 0:
                raise EngineError(f"llama_tokenize failed with {n}")
        return buf[:n]

    def tokenize_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
        """Tokenize text in which only trusted pieces may produce control tokens.

        Args:
            pieces: `(text, trusted)` pairs in prompt order. In a trusted piece (a chat
                template's own markup) control-token strings such as `<start_of_turn>`
                become their tokens; in an untrusted piece (message content, names, tool
                calls) they stay plain text, so content cannot forge a turn.

        Returns:
            The token ids. The text between two control tokens is tokenized as one run
            across piece boundaries, as `tokenize` does, so the result equals
            `tokenize("".join(texts), parse_special=True)` whenever no untrusted piece
            contains a control-token string.

        Example:
            >>> m.tokenize_pieces([("<start_of_turn>user\\n", True), ("<end_of_turn>", False)])  # doctest: +SKIP
            [105, 2364, 107, 236820, 643, 236779, 1340, 236779, 887, 236813]
        """
        out: list[int] = []
        run: list[str] = []
        strip_next = False  # the last control token eats the whitespace after it (RSTRIP)

        def flush(strip_end: bool) -> None:
            text = "".join(run)
            run.clear()
            if strip_next:
                text = text.lstrip()
            if strip_end:
                text = text.rstrip()
            if text:
                out.extend(self.tokenize(text, parse_special=False))

        for text, trusted in pieces:
            if not trusted:
                run.append(text)
                continue
            pos = 0
            for j, end, tok, attr in self._markup_controls(text):
                run.append(text[pos:j])
                flush(bool(attr & _ll.LLAMA_TOKEN_ATTR_LSTRIP))
                strip_next = bool(attr & _ll.LLAMA_TOKEN_ATTR_RSTRIP)
                out.append(tok)
                pos = end
            run.append(text[pos:])
        flush(False)
        return out

    def _markup_controls(self, text: str) -> tuple[tuple[int, int, int, int], ...]:
        """`(start, end, token, attr)` of each control token in a trusted text (cached: markup repeats)."""
        hit = self._markup_cache.get(text)
        if hit is not None:
            return hit
        found = []
        pos = 0
        for tok in self.tokenize(text, parse_special=True):
            attr = self._control_attr(tok)
            if not attr:
                continue
            mark = self._piece(tok, special=True).decode("utf-8", "replace")
            j = text.find(mark, pos)
            if j < 0:  # llama.cpp matched it; so must we
                raise EngineError(f"control token {tok} ({mark!r}) not found in {text!r:.80}")
            found.append((j, j + len(mark), tok, attr))
            pos = j + len(mark)
        if len(self._markup_cache) > 4096:  # bounded; a dict store is atomic across threads
            self._markup_cache.clear()
        self._markup_cache[text] = result = tuple(found)
        return result

    def _control_attr(self, token: int) -> int:
        """The token's attribute bits when it is a control (or unknown) token, else 0."""
        attr = self._attr_cache.get(token)
        if attr is None:
            attr = int(_ll.llama_vocab_get_attr(self.vocab, token))
            if not attr & (_ll.LLAMA_TOKEN_ATTR_CONTROL | _ll.LLAMA_TOKEN_ATTR_UNKNOWN):
                attr = 0
            self._attr_cache[token] = attr
        return attr

    def control_strings(self, text: str) -> list[str]:
        """The control-token strings (`<end_of_turn>`, `<|im_end|>`...) that occur in `text`."""
        toks = self.tokenize(text, parse_special=True)
        return [self._piece(t, special=True).decode("utf-8", "replace") for t in toks if self._control_attr(t)]

    def _piece(self, token: int, *, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)  # per call: called from many threads
        n = _ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token renders to (special tokens render as nothing)."""
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece(token, special=False)
            self._piece_cache[token] = piece  # a dict store is atomic; a race only repeats work
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text of a token run (special tokens omitted)."""
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, `<end_of_turn>`, `<|im_end|>`...)."""
        v = self._eog_cache.get(token)
        if v is None:
            v = self._eog_cache[token] = bool(_ll.llama_vocab_is_eog(self.vocab, token))
        return v


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
