"""Pools of one process on one GGUF file share its loaded weights (`agentmem.engine.shared_weights`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agentmem import MemoryPool
from agentmem.engine import shared_weights
from agentmem.errors import EngineError, ModelNotFoundError

MSGS = [{"role": "user", "content": "Say something about the sea."}]


def weights(pool: MemoryPool):
    """The loaded model under the pool's engine."""
    return pool.engine().model


def test_two_pools_on_one_file_share_the_weights_until_the_last_closes(tiny_model_path: Path) -> None:
    a = MemoryPool(tiny_model_path, n_ctx=512, resident_agents=1, n_threads=1)
    b = MemoryPool(tiny_model_path, n_ctx=1024, resident_agents=2, n_threads=1)
    try:
        wa, wb = weights(a), weights(b)
        assert wa is wb and shared_weights.holders(wa) == 2
        want = a.chat("x", MSGS, max_tokens=6).tokens
        assert b.chat("x", MSGS, max_tokens=6).tokens == want  # own contexts on one set of weights
        a.close()
        assert shared_weights.holders(wb) == 1 and not wb._closed
        assert b.chat("y", MSGS, max_tokens=6).tokens == want  # the survivor runs on after the other closed
    finally:
        a.close()
        b.close()
    assert wb._closed and shared_weights.holders(wb) == 0  # the last close freed them


def test_a_new_pool_after_the_last_close_loads_the_file_again(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=1, n_threads=1) as p:
        first = weights(p)
    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=1, n_threads=1) as p:
        assert weights(p) is not first and not weights(p)._closed
    assert first._closed


def test_a_file_rewritten_in_place_is_loaded_anew(tiny_model_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    shutil.copyfile(tiny_model_path, path)
    old = shared_weights.acquire(path, n_gpu_layers=0)
    try:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        new = shared_weights.acquire(path, n_gpu_layers=0)
        assert new is not old
        shared_weights.release(new)
    finally:
        shared_weights.release(old)
    assert old._closed


def test_release_of_a_model_not_held_is_refused(tiny_model_path: Path) -> None:
    model = shared_weights.acquire(tiny_model_path, n_gpu_layers=0)
    shared_weights.release(model)
    with pytest.raises(EngineError, match="not held"):
        shared_weights.release(model)


def test_a_missing_file_is_model_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        shared_weights.acquire(tmp_path / "nope.gguf", n_gpu_layers=0)


def test_a_pool_that_fails_while_it_is_built_gives_the_weights_back(
        tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression guard: before the weights were shared, a half-built pool's model was freed by the
    garbage collector; held by `shared_weights`, it would stay loaded for good unless the failure path gives it back."""
    from agentmem.pool.persist import Persister

    def broken(self: Persister) -> None:
        raise OSError("the archive could not be read")

    monkeypatch.setattr(Persister, "resume", broken)
    held = shared_weights.acquire(tiny_model_path, n_gpu_layers=0)
    try:
        with pytest.raises(OSError, match="could not be read"):
            MemoryPool(tiny_model_path, n_ctx=512, resident_agents=1, n_threads=1, archive_path=str(tmp_path / "a.db"))
        assert shared_weights.holders(held) == 1  # the failed pool's hold is given back
    finally:
        shared_weights.release(held)
    assert held._closed
