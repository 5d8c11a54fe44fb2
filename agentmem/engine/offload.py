"""Layers offloaded to the GPU when nobody says (`default_gpu_layers`), and the backend a model runs on.

`PoolConfig(n_gpu_layers=None)`, the default, takes `AGENTMEM_N_GPU_LAYERS` (an integer,
`-1` = every layer, `0` = CPU only), else `0`; an explicit value wins, as `n_threads` does
over `AGENTMEM_THREADS`. On a CPU-only build of llama-cpp-python any value runs on the CPU
(llama.cpp offloads nothing it has no device for).

`backend_name` says where a loaded model's layers (and, with llama.cpp's default
`offload_kqv`, their KV cache) live: `"CPU"`, or the GPU backends the build ships, such as
`"CUDA"`. A state's fingerprint carries it (`agentmem.pool.opening`) so a stored state says
where it was computed, but a restore does not require it to match
(`agentmem.archive.values.PORTABLE_FINGERPRINT_KEYS`):
a state blob holds the cache's K/V rows in the cache's element type (`type_k`/`type_v`, both in
the fingerprint) and its cells' positions, copied with `ggml_backend_tensor_get`/`_set`, which
move the tensor's bytes unchanged whatever device holds them; the V layout (`v_trans`) follows
`flash_attn`, also in the fingerprint. So a state saved on a CUDA build restores byte for byte on
a CPU build and back: the conversion is the identity. What differs between backends is the
arithmetic that produced the rows (float rounding in the kernels), as it does between thread counts.

Example:
    >>> import os; os.environ["AGENTMEM_N_GPU_LAYERS"] = "-1"
    >>> default_gpu_layers()
    -1
    >>> del os.environ["AGENTMEM_N_GPU_LAYERS"]; default_gpu_layers()
    0
"""

from __future__ import annotations

import logging
import os

import llama_cpp as _ll

from agentmem.engine.native_first import gpu_backends
from agentmem.errors import ConfigError

__all__ = ["ENV_VAR", "backend_name", "check_gpu_layers", "default_gpu_layers"]

logger = logging.getLogger(__name__)

ENV_VAR = "AGENTMEM_N_GPU_LAYERS"
"""Environment variable that sets `n_gpu_layers` when a config leaves it `None`."""

def check_gpu_layers(value: object, *, name: str = "n_gpu_layers") -> int:
    """`value` as a layer count: an int >= -1 (`-1` = all layers).

    Raises:
        ConfigError: anything else; the message names `name`.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ConfigError(f"{name} must be an integer >= -1 (-1 = every layer, 0 = CPU only), got {value!r}")
    return value


def default_gpu_layers() -> int:
    """`n_gpu_layers` for a config that left it `None`: `AGENTMEM_N_GPU_LAYERS`, else `0`.

    Raises:
        ConfigError: the variable is set but is not an integer >= -1.
    """
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV_VAR} must be an integer >= -1 (-1 = every layer), got {raw!r}") from None
    return check_gpu_layers(n, name=ENV_VAR)


def backend_name(n_gpu_layers: int) -> str:
    """Where a model loaded with `n_gpu_layers` runs: `"CPU"`, or the build's GPU backends (`"CUDA"`).

    Call it after a model is loaded (it asks llama.cpp whether it can offload; before a
    load that may initialise the GPU runtime in the wrong order, see `native_first`).
    """
    if n_gpu_layers == 0 or not _ll.llama_supports_gpu_offload():
        return "CPU"
    return "+".join(gpu_backends()) or "GPU"
