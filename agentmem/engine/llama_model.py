"""A loaded GGUF model: weights, vocabulary, chat template, tokenization.

`LlamaModel` loads a GGUF file once and tokenizes / detokenizes; tokenization keeps
message text apart from control tokens (`tokenize_pieces`): only a chat template's
own markup may become turn markers. The handle frees itself on `close()`/`__exit__`
(idempotent) and, as a last resort, on garbage collection; every C return code is
checked at once and turned into `EngineError` or `ModelError` naming the call.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import Sequence

from agentmem.errors import EngineError, ModelError, ModelNotFoundError

try:  # gated: llama-cpp-python is a hard dependency, but give a clear message
    import llama_cpp as _ll
except ImportError as exc:  # pragma: no cover - exercised only without the dependency
    raise ImportError(
        "agentmem needs llama-cpp-python: pip install 'llama-cpp-python>=0.3.36,<0.4'"
    ) from exc

from agentmem.engine import llama_log  # after the gate: it imports llama_cpp too
from agentmem.engine.native_first import check_load_order

__all__ = ["KVType", "LlamaModel", "ensure_backend", "llama_build_info"]

logger = logging.getLogger(__name__)

#: KV cache element types accepted by `type_k`/`type_v` (name -> ggml type id).
KVType = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}

_backend_lock = threading.Lock()
_backend_ready = False


def ensure_backend() -> None:
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

    Raises:
        ModelNotFoundError: no file at `path`.
        ModelError: llama.cpp refused the file.
        ImportOrderError: numpy was imported before agentmem and, on this GPU build, a load
            in that order crashes (`agentmem.engine.native_first`).
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
        check_load_order(self.path, n_gpu_layers=n_gpu_layers)  # ImportOrderError, not a segfault
        ensure_backend()
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
