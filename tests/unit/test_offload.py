"""Offload settings (`AGENTMEM_N_GPU_LAYERS`, `--n-gpu-layers`) and the backend in a state's fingerprint.

Issue #31: offload is reachable from every entry point, and a state names the backend it was
computed on; a state made on one backend restores on another because its bytes are the same
(`agentmem.engine.native_first.backend_name`), while a change of KV type is still refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agentmem import ConfigError, FingerprintMismatch, MemoryPool, PoolConfig
from agentmem.archive import Archive
from agentmem.config import GPU_LAYERS_ENV
from agentmem.engine.native_first import backend_name
from agentmem.server.cli import add_arguments, build

OPTS = dict(n_ctx=1024, resident_agents=2, n_batch=64, prefetch=False, n_threads=1)


def conv(*turns: str) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


def test_env_var_sets_the_default_and_an_explicit_value_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GPU_LAYERS_ENV, raising=False)
    assert PoolConfig().n_gpu_layers == 0
    monkeypatch.setenv(GPU_LAYERS_ENV, "-1")
    assert PoolConfig().n_gpu_layers == -1
    assert PoolConfig(n_gpu_layers=0).n_gpu_layers == 0
    assert PoolConfig.from_dict(PoolConfig(n_gpu_layers=7).to_dict()).n_gpu_layers == 7
    for bad in ("all", "-2", "1.5"):
        monkeypatch.setenv(GPU_LAYERS_ENV, bad)
        with pytest.raises(ConfigError, match=GPU_LAYERS_ENV):
            PoolConfig()
    monkeypatch.delenv(GPU_LAYERS_ENV)
    for bad in (-2, True, "3"):
        with pytest.raises(ConfigError, match="n_gpu_layers"):
            PoolConfig(n_gpu_layers=bad)  # type: ignore[arg-type]


def test_serve_flag_reaches_the_pool_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GPU_LAYERS_ENV, raising=False)
    p = argparse.ArgumentParser()
    add_arguments(p)
    config, _, _ = build(p.parse_args(["--model", "m.gguf", "--n-gpu-layers", "-1"]))
    assert config.n_gpu_layers == -1
    config, _, _ = build(p.parse_args(["--model", "m.gguf"]))
    assert config.n_gpu_layers == 0
    monkeypatch.setenv(GPU_LAYERS_ENV, "12")
    config, _, _ = build(p.parse_args(["--model", "m.gguf"]))
    assert config.n_gpu_layers == 12


def test_fingerprint_names_backend_and_kv_types(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, type_k="f32", n_gpu_layers=0, **OPTS) as p:
        fp = p.engine().fingerprint
    assert fp["backend"] == "CPU" and fp["type_k"] == "f32" and fp["type_v"] == "f16"
    assert backend_name(0) == "CPU"


def test_a_state_from_another_backend_restores_exactly(tiny_model_path: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Saved on the GPU (every layer offloaded; on a CPU build a `CUDA` fingerprint is faked), restored on
    the CPU: accepted, since the blob's bytes are backend independent. Where the save really ran on the
    CPU the continuation equals the never-saved one's. A KV type change is still refused."""
    import llama_cpp

    import agentmem.pool.opening as opening

    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    db = str(tmp_path / "a.db")
    follow = conv("tell me about cats", "ok", "more please")
    if not gpu:
        monkeypatch.setattr(opening, "backend_name", lambda n: "CUDA")
    with MemoryPool(tiny_model_path, archive_path=db, cold_codec="f16", n_gpu_layers=-1, **OPTS) as p:
        p.chat("a", conv("tell me about cats"), max_tokens=6)
        p.park("a", "cold")
        made = dict(p.engine().fingerprint)
    monkeypatch.undo()
    assert made["backend"] not in ("CPU", None)
    with MemoryPool(tiny_model_path, archive_path=db, cold_codec="f16", n_gpu_layers=0, **OPTS) as p:
        assert p.engine().fingerprint["backend"] == "CPU"
        r = p.chat("a", follow, max_tokens=6)
        assert r.kv == "restored" and r.usage.cached_tokens > 0
    if not gpu:  # the same arithmetic made the state: the continuation is the never-saved one's
        with MemoryPool(tiny_model_path, n_gpu_layers=0, **OPTS) as p:
            p.chat("a", conv("tell me about cats"), max_tokens=6)
            assert p.chat("a", follow, max_tokens=6).text == r.text
    with Archive(db) as arc:
        other = {**made, "backend": "Metal"}
        assert arc.get_state("a", fingerprint=other) is not None
        with pytest.raises(FingerprintMismatch, match="type_k"):
            arc.get_state("a", fingerprint={**other, "type_k": "q8_0"})


@pytest.mark.gpu
def test_the_gpu_lane_offloads_every_layer(request: pytest.FixtureRequest, tiny_model_path: Path) -> None:
    """`pytest -m gpu` (tests/fixtures/gpu_lane.py): pools offload all layers and the fingerprint names the GPU."""
    import llama_cpp

    from agentmem.engine.native_first import gpu_backends
    from tests.fixtures import gpu_lane

    if not gpu_lane.lane_on(request.config):
        pytest.skip("the GPU lane is off (pytest -m gpu, or AGENTMEM_TEST_GPU=1)")
    assert PoolConfig().n_gpu_layers == -1
    with MemoryPool(tiny_model_path, **OPTS) as p:
        backend = p.engine().fingerprint["backend"]
        r = p.chat("a", conv("hello"), max_tokens=4)
    assert r.usage.completion_tokens > 0
    assert backend == ("+".join(gpu_backends()) if llama_cpp.llama_supports_gpu_offload() else "CPU")


def test_benchmark_flag_exports_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--n-gpu-layers` on a benchmark reaches every pool of the run and every server it starts (the environment)."""
    from benchmarks._report import add_gpu_layers, gpu_layers

    monkeypatch.setenv(GPU_LAYERS_ENV, "0")  # restored after the test
    ap = argparse.ArgumentParser()
    add_gpu_layers(ap)
    assert ap.parse_args([]).n_gpu_layers is None and gpu_layers() == 0
    assert ap.parse_args(["--n-gpu-layers", "-1"]).n_gpu_layers == -1
    assert gpu_layers() == -1 and PoolConfig().n_gpu_layers == -1
    with pytest.raises(SystemExit):
        ap.parse_args(["--n-gpu-layers", "-2"])
