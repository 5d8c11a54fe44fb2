"""One set of weights for every pool of a process that opens the same GGUF file.

llama.cpp keeps a model's weights (`llama_model`) apart from its contexts: any number of
contexts may run on one loaded model, each with its own KV cache. `acquire` hands out a
`LlamaModel` per GGUF file and offload setting, counting its users; `release` frees it when
its last user lets go. So two pools on one model take its memory once, and a pool opened
while another holds the model skips the load (about a second for Gemma 3 270M on a CPU:
the vocabulary and the repacked Q4 weights).

The file is identified by its real path and its `stat` (device, inode, size, modification
time): a GGUF rewritten in place is loaded anew, not served from the old weights.

Example:

    >>> model = acquire("gemma-3-270m-it-Q4_K_M.gguf", n_gpu_layers=0)   # doctest: +SKIP
    >>> acquire("gemma-3-270m-it-Q4_K_M.gguf", n_gpu_layers=0) is model   # doctest: +SKIP
    True
    >>> release(model); release(model)  # the second frees the weights    # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agentmem.engine.llama_model import LlamaModel
from agentmem.errors import EngineError, ModelNotFoundError

__all__ = ["acquire", "holders", "release"]

_Key = tuple[str, int, int, int, int, int]

_lock = threading.Lock()
_models: dict[_Key, LlamaModel] = {}
_users: dict[int, int] = {}  # id(model) -> users
_keys: dict[int, _Key] = {}  # id(model) -> its key


def _key(path: str | os.PathLike[str], n_gpu_layers: int) -> _Key:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"model file not found: {path}") from exc
    return (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, n_gpu_layers)


def acquire(path: str | os.PathLike[str], *, n_gpu_layers: int) -> LlamaModel:
    """The loaded model of `path`, loaded now unless another user holds it already.

    Args:
        path: the `.gguf` file.
        n_gpu_layers: layers to offload (part of the identity: another value loads another copy).

    Returns:
        A `LlamaModel` to give back with `release` (never `close` it: other users may hold it).

    Raises:
        ModelNotFoundError: no file at `path`.
        ModelError: llama.cpp refused the file.
    """
    key = _key(path, n_gpu_layers)
    with _lock:  # a load under the lock: two pools opening one file at once load it once
        model = _models.get(key)
        if model is None:
            model = LlamaModel(Path(path), n_gpu_layers=n_gpu_layers)
            _models[key] = model
            _keys[id(model)] = key
            _users[id(model)] = 0
        _users[id(model)] += 1
        return model


def release(model: LlamaModel) -> None:
    """Give back a model from `acquire`; the last user's release frees its weights.

    Close the contexts that run on it first.

    Raises:
        EngineError: `model` is not held (not from `acquire`, or released once too often).
    """
    with _lock:
        users = _users.get(id(model))
        if not users or _models.get(_keys[id(model)]) is not model:
            raise EngineError("release of a model that is not held (from acquire, released once per acquire)")
        if users > 1:
            _users[id(model)] = users - 1
            return
        del _models[_keys.pop(id(model))], _users[id(model)]
    model.close()


def holders(model: LlamaModel) -> int:
    """How many users hold `model` (0 once its weights are freed, or for a model not from `acquire`)."""
    with _lock:
        return _users.get(id(model), 0)
