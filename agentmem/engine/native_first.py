"""llama.cpp's native libraries, loaded before numpy (the first thing `import agentmem` does), and their backends.

Why (issue #31): on a CUDA build of llama-cpp-python 0.3.36 (one NVIDIA H200, CUDA 13.0,
Python 3.12, numpy 2.5 with scipy-openblas), a process that imports numpy *before*
llama.cpp's shared libraries are loaded segfaults in its first `llama_model_load_from_file`,
with `n_gpu_layers=-1` and with `0`; the same load after `import llama_cpp` first, numpy
second, works. The field knows the symptom (llama-cpp-python #1581, "import llama_cpp before
pandas"). `import llama_cpp` is the right order by construction: `llama_cpp/__init__.py`
imports `llama_cpp.llama_cpp` first, which loads libllama/libggml (and, on a CUDA build,
libggml-cuda, the CUDA runtime and OpenMP) through ctypes, and only then `llama_cpp.llama`,
which imports numpy. agentmem used to import numpy first (its codec and memory modules), so
nothing of agentmem ran on a CUDA build.

The mechanism: `agentmem/__init__.py` imports this module before anything else, and this
module imports `llama_cpp`. Every code path of agentmem, the CLI, `python -m agentmem.server`,
the integrations (whose `__init__` imports agentmem first) and the scripts in `examples/` and
`benchmarks/`, goes through that import, so numpy initialises after llama.cpp's libraries
(`tests/unit/test_import_order.py` pins it for every entry point, with `/proc/self/maps`).

When the application imported numpy, pandas, torch... *before* agentmem, the order is already
decided when this module runs. `ORDER` records what came first; then `check_load_order`, called
by `LlamaModel` before its first load, decides:

* a CPU build (no GPU backend library beside libllama): nothing to do. Numpy first is harmless
  there (the whole CPU test suite imports numpy first), so agentmem keeps working.
* a GPU build (`gpu_backends()` finds libggml-cuda/-hip/-metal/-vulkan/-sycl... in llama_cpp's
  library folder; no model is loaded to find out): once per process, a subprocess reproduces the
  order (the same modules, then `llama_cpp`, then a `vocab_only` load of the same model). If it
  dies of a signal, `ImportOrderError` names the fix ("import agentmem before numpy/...")
  instead of a segfault; if it loads, so does this process. `AGENTMEM_ORDER_PROBE=off` skips
  the probe (a warning is logged); `=full` makes the probe load the weights too (slower, for the
  case that only a full load crashes).

What is still unknown: the root cause. The crash was measured on the CUDA build only and could
not be reproduced on a CPU build, so whether it is the OpenMP runtime (libgomp) and
scipy-openblas's threads initialising in the wrong order, or a CUDA-runtime/TLS conflict, is not
settled; whether a `vocab_only` load crashes in the bad order as the full load does is not
measured either (hence `=full`). An application that imported `llama_cpp` itself before agentmem
is trusted: its order is its own and is not probed.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from agentmem.errors import ConfigError, ImportOrderError

__all__ = ["ORDER", "ImportOrder", "PROBE_ENV", "backend_name", "backends_in", "check_load_order", "gpu_backends"]

logger = logging.getLogger(__name__)

#: Modules that load numpy (and with it OpenBLAS/OpenMP) when an application imports them first.
NUMPY_LOADERS = ("numpy", "pandas", "scipy", "torch", "sklearn", "tensorflow", "jax")

PROBE_ENV = "AGENTMEM_ORDER_PROBE"
"""`on` (default): probe a GPU build once when numpy came first; `off`: do not; `full`: probe with the weights."""

#: Backend libraries of llama.cpp that mean a GPU build (file-name stems in llama_cpp's lib folder).
_GPU_LIBS = {"cuda": "CUDA", "hip": "HIP", "metal": "Metal", "vulkan": "Vulkan", "sycl": "SYCL", "musa": "MUSA",
             "opencl": "OpenCL", "cann": "CANN"}


@dataclass(frozen=True, slots=True)
class ImportOrder:
    """What the process had imported when agentmem loaded llama.cpp's libraries.

    Attributes:
        numpy_first: the `NUMPY_LOADERS` already imported then (empty: the right order).
        llama_cpp_first: `llama_cpp` was imported before agentmem (the application's own order).
    """

    numpy_first: tuple[str, ...]
    llama_cpp_first: bool


def _load_native() -> ImportOrder:
    """Import `llama_cpp` (its libraries load before it imports numpy) and record what came before."""
    already = "llama_cpp" in sys.modules
    first = () if already else tuple(m for m in NUMPY_LOADERS if m in sys.modules)
    try:
        import llama_cpp  # noqa: F401 - loads libllama/libggml through ctypes, then imports numpy
    except ImportError as exc:  # pragma: no cover - exercised only without the dependency
        raise ImportError(
            "agentmem needs llama-cpp-python: pip install 'llama-cpp-python>=0.3.36,<0.4'"
        ) from exc
    return ImportOrder(numpy_first=first, llama_cpp_first=already)


ORDER: ImportOrder = _load_native()
"""The order this process loaded llama.cpp in (set once, when agentmem is first imported)."""


def gpu_backends() -> tuple[str, ...]:
    """The GPU backends llama-cpp-python was built with, from the libraries it ships (no model loaded).

    Returns:
        E.g. `("CUDA",)`; `()` for a CPU-only build.

    >>> gpu_backends()  # doctest: +SKIP
    ()
    """
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return ()
    return backends_in([Path(f) / "lib" for f in spec.submodule_search_locations]
                       + [Path(f) for f in spec.submodule_search_locations])


def backends_in(folders: list[Path]) -> tuple[str, ...]:
    """The GPU backends whose ggml libraries (`libggml-cuda.so`, `ggml-vulkan.dll`...) lie in `folders`."""
    found: list[str] = []
    for d in folders:
        try:
            names = [p.name.lower() for p in d.iterdir()]
        except OSError:
            continue
        for name in names:
            stem = name.removeprefix("lib").split(".")[0]
            backend = _GPU_LIBS.get(stem[5:]) if stem.startswith("ggml-") else None
            if backend and backend not in found:
                found.append(backend)
    return tuple(sorted(found))


def backend_name(n_gpu_layers: int) -> str:
    """Where a model loaded with `n_gpu_layers` runs: `"CPU"`, or the build's GPU backends (`"CUDA"`).

    The layers offloaded, and with llama.cpp's default `offload_kqv` their KV cache, live
    there. A state's fingerprint carries it (`agentmem.pool.opening`) so a stored state says
    where it was computed, but a restore does not require it to match
    (`agentmem.archive.values.PORTABLE_FINGERPRINT_KEYS`): a state blob holds the cache's K/V
    rows in the cache's element type (`type_k`/`type_v`, both in the fingerprint) and its cells'
    positions, copied by `ggml_backend_tensor_get`/`_set`, which move a tensor's bytes unchanged
    whatever device holds it; the V layout (`v_trans`) follows `flash_attn`, also in the
    fingerprint. So a state saved on a CUDA build restores byte for byte on a CPU build and back:
    the conversion is the identity. What differs between backends is the arithmetic that
    produced the rows (float rounding in the kernels), as it does between thread counts.

    Call it after a model is loaded: it asks llama.cpp whether it can offload, which on a GPU
    build initialises the GPU runtime (see `check_load_order`).
    """
    import llama_cpp

    if n_gpu_layers == 0 or not llama_cpp.llama_supports_gpu_offload():
        return "CPU"
    return "+".join(gpu_backends()) or "GPU"


_PROBE = r"""
import sys
for name in sys.argv[1].split(","):
    try:
        __import__(name)
    except ImportError:
        pass
import llama_cpp as ll
ll.llama_backend_init()
p = ll.llama_model_default_params()
p.n_gpu_layers = int(sys.argv[3])
p.vocab_only = sys.argv[4] != "full"
m = ll.llama_model_load_from_file(sys.argv[2].encode(), p)
if m:
    ll.llama_model_free(m)
sys.stdout.write("probe-loaded\n" if m else "probe-refused\n")  # the child process's answer to the parent
"""

_probe_lock = threading.Lock()
_probe_result: str | None = None  # "ok", "skipped", "inconclusive" or "crashed: SIGSEGV"


def _probe_mode() -> str:
    raw = os.environ.get(PROBE_ENV, "on").strip().lower() or "on"
    if raw not in ("on", "off", "full"):
        raise ConfigError(f"{PROBE_ENV} must be on, off or full, got {raw!r}")
    return raw


def _probe_command(path: Path, n_gpu_layers: int, mode: str, modules: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-c", _PROBE, ",".join(modules), str(path), str(n_gpu_layers), mode]


def _run_probe(path: Path, n_gpu_layers: int, mode: str, modules: tuple[str, ...]) -> str:
    cmd = _probe_command(path, n_gpu_layers, mode, modules)
    try:
        # the probe imports what this process imports: its sys.path, not only the inherited PYTHONPATH
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cp = subprocess.run(cmd, capture_output=True, timeout=300, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("import-order probe did not finish (%s); loading anyway", exc)
        return "inconclusive"
    if cp.returncode < 0:
        try:
            name = signal.Signals(-cp.returncode).name
        except ValueError:
            name = f"signal {-cp.returncode}"
        return f"crashed: {name}"
    if cp.returncode != 0:
        tail = cp.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        logger.warning("import-order probe failed with status %d (%s); loading anyway", cp.returncode, tail[0])
        return "inconclusive"
    return "ok"


def check_load_order(path: str | os.PathLike[str], *, n_gpu_layers: int) -> str:
    """Refuse a model load that would crash because numpy was initialised before llama.cpp.

    Called by `LlamaModel` before every load; the work happens at most once per process, and
    only on a GPU build whose process imported a `NUMPY_LOADERS` module before agentmem (see
    the module docstring).

    Args:
        path: the GGUF about to be loaded (the probe loads its vocabulary).
        n_gpu_layers: the layers the load offloads (the probe uses the same).

    Returns:
        `"ok"` (right order, a CPU build, or the probe loaded), `"skipped"`
        (`AGENTMEM_ORDER_PROBE=off`) or `"inconclusive"` (the probe failed without a crash).

    Raises:
        ImportOrderError: the probe crashed: this process would crash at the load.
        ConfigError: `AGENTMEM_ORDER_PROBE` is not `on`, `off` or `full`.
    """
    global _probe_result
    if not ORDER.numpy_first:
        return "ok"
    backends = gpu_backends()
    if not backends:
        return "ok"
    with _probe_lock:
        if _probe_result is None:
            mode = _probe_mode()
            if mode == "off":
                logger.warning("%s imported before agentmem on a %s build; %s=off, loading unprobed "
                               "(llama-cpp-python #1581)", "/".join(ORDER.numpy_first), "/".join(backends), PROBE_ENV)
                _probe_result = "skipped"
            else:
                _probe_result = _run_probe(Path(path), n_gpu_layers, mode, ORDER.numpy_first)
                logger.info("import-order probe (%s first, %s build): %s", "/".join(ORDER.numpy_first),
                            "/".join(backends), _probe_result)
        result = _probe_result
    if result.startswith("crashed"):
        raise ImportOrderError(
            f"{'/'.join(ORDER.numpy_first)} was imported before agentmem, and on this {'/'.join(backends)} build of "
            f"llama-cpp-python a model load in that order crashed a probe process ({result.split(': ', 1)[1]}; "
            f"llama-cpp-python #1581): "
            f"import agentmem (or llama_cpp) before numpy/pandas/torch, e.g. as the first import of your program; "
            f"{PROBE_ENV}=off skips this check"
        )
    return result

