"""A stored state is restored only under the model and KV configuration it was made with (issue #35).

Each test stores agent `a`'s state in the archive (COLD) under one configuration,
reopens the archive with one setting changed, and calls `a` again. The restore must
be refused with a `FingerprintMismatch` naming the setting (the pool then re-prefills
from the ledger: exact) — never a silent restore of cells the new context reads
differently. "Exact" is checked on the logits of the first reply token: equal to a
fresh pool's with the new configuration that never saw the state.

Settings covered: the model file, `type_k`, `type_v`, `flash_attn`, `swa_full`,
`n_seq_max` (`resident_agents`), `kv_unified` (`kv_layout`), the llama.cpp build, and
llama.cpp's own KV rotation (`LLAMA_ATTN_ROT_DISABLE`: llama.cpp 0.3.36 Hadamard-rotates
a *quantized* K/V cache by default — there is no context parameter for it, only this
environment variable, read when a context is created; it changes the stored bytes
only for a quantized cache with head dim >= 64). agentmem's own codec rotation
(`park_rotate`) is recorded in each stored state's codec and undone on decode: a
restart with the other setting converts exactly.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentmem import MemoryPool

from tests.fixtures import tiny_gguf
from tests.fixtures.kv_probe import first_logits

OPTS: dict[str, Any] = dict(n_ctx=512, resident_agents=2, n_batch=64, prefetch=False, n_threads=1, cold_codec="f16")
FIRST = [{"role": "user", "content": "tell me about cats and the garden"}]
NEXT = FIRST + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and dogs"}]


@pytest.fixture(scope="module")
def tiny_hd64_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with head dim 64 (n_embd 256): big enough for a q8_0 K/V cache and llama.cpp's rotation."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiny_gguf, "_HEAD_DIM", 64)
        mp.setattr(tiny_gguf, "_N_EMBD", 256)
        return tiny_gguf.build_tiny_gguf(tmp_path_factory.mktemp("tiny-hd64") / "tiny-hd64.gguf")


@pytest.fixture(scope="module")
def tiny_other_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another tiny llama: same shapes and vocabulary, other weights (seed 1)."""
    return tiny_gguf.build_tiny_gguf(tmp_path_factory.mktemp("tiny-other") / "tiny-other.gguf", seed=1)


def store(model: Path, archive: Path, **opts: Any) -> None:
    """Agent `a` answers `FIRST`, then its state is parked in the archive and the pool closed."""
    with MemoryPool(model, archive_path=str(archive), **{**OPTS, **opts}) as p:
        p.chat("a", FIRST, max_tokens=3)
        p.park("a", "cold")


def resume(model: Path, archive: Path, **opts: Any) -> tuple[Any, np.ndarray, int]:
    """Reopen the archive and call `a` with `NEXT`: (result, first-token logits, restore failures)."""
    with MemoryPool(model, archive_path=str(archive), **{**OPTS, **opts}) as p:
        with first_logits(p) as seen:
            r = p.chat("a", NEXT, max_tokens=1)
        return r, seen[0].copy(), p.stats()["totals"]["restore_failures"]


def fresh(model: Path, **opts: Any) -> np.ndarray:
    """First-token logits of `NEXT` in a pool that never saw a stored state."""
    with MemoryPool(model, **{**OPTS, **opts}) as p:
        with first_logits(p) as seen:
            p.chat("a", NEXT, max_tokens=1)
        return seen[0].copy()


def assert_refused(r: Any, failures: int, logits: np.ndarray, want: np.ndarray, caplog: Any, key: str) -> None:
    """The restore was refused with a FingerprintMismatch naming `key`, and the re-prefill is exact."""
    assert failures == 1 and r.kv == "prefilled", f"the stored state was used ({r.kv}): a silent restore"
    assert "belongs to another config" in caplog.text and key in caplog.text, caplog.text
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-4)


def test_same_configuration_restores(tiny_model_path: Path, tmp_path: Path) -> None:
    """The control: with nothing changed the archived state is restored, and its logits are a fresh pool's."""
    store(tiny_model_path, tmp_path / "a.db")
    r, logits, failures = resume(tiny_model_path, tmp_path / "a.db")
    assert r.kv == "restored" and failures == 0
    np.testing.assert_allclose(logits, fresh(tiny_model_path), rtol=0, atol=1e-3)


@pytest.mark.parametrize(
    "key, before, after",
    [
        ("flash_attn", {}, {"flash_attn": False}),
        ("n_seq_max", {}, {"resident_agents": 3}),
        ("kv_unified", {"kv_layout": "unified"}, {"kv_layout": "per_sequence"}),
    ],
)
def test_cache_setting_mismatch_is_refused(tiny_model_path: Path, tmp_path: Path, caplog: Any, key: str,
                                           before: dict[str, Any], after: dict[str, Any]) -> None:
    store(tiny_model_path, tmp_path / "a.db", **before)
    with caplog.at_level(logging.WARNING, logger="agentmem"):
        r, logits, failures = resume(tiny_model_path, tmp_path / "a.db", **after)
    assert_refused(r, failures, logits, fresh(tiny_model_path, **after), caplog, key)


def test_other_model_file_is_refused(tiny_model_path: Path, tiny_other_path: Path, tmp_path: Path,
                                     caplog: Any) -> None:
    """Same shapes, same vocabulary, other weights: the blob would load; the fingerprint must refuse it."""
    store(tiny_model_path, tmp_path / "a.db")
    with caplog.at_level(logging.WARNING, logger="agentmem"):
        r, logits, failures = resume(tiny_other_path, tmp_path / "a.db")
    assert_refused(r, failures, logits, fresh(tiny_other_path), caplog, "model")


def test_swa_full_mismatch_is_refused(tiny_gemma3_path: Path, tmp_path: Path, caplog: Any) -> None:
    store(tiny_gemma3_path, tmp_path / "a.db", swa_full=True)
    with caplog.at_level(logging.WARNING, logger="agentmem"):
        r, logits, failures = resume(tiny_gemma3_path, tmp_path / "a.db", swa_full=False)
    assert_refused(r, failures, logits, fresh(tiny_gemma3_path, swa_full=False), caplog, "swa_full")


@pytest.mark.parametrize("key, after", [("type_k", {"type_k": "q8_0"}), ("type_v", {"type_v": "q8_0"})])
def test_kv_type_mismatch_is_refused(tiny_hd64_path: Path, tmp_path: Path, caplog: Any, key: str,
                                     after: dict[str, Any]) -> None:
    store(tiny_hd64_path, tmp_path / "a.db")
    with caplog.at_level(logging.WARNING, logger="agentmem"):
        r, logits, failures = resume(tiny_hd64_path, tmp_path / "a.db", **after)
    assert_refused(r, failures, logits, fresh(tiny_hd64_path, **after), caplog, key)


def test_llama_build_mismatch_is_refused(tiny_model_path: Path, tmp_path: Path, caplog: Any,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A state written by another llama.cpp build (its kernels, its blob format) is not trusted."""
    import agentmem.pool.opening as opening

    store(tiny_model_path, tmp_path / "a.db")
    build = opening.llama_build_info()
    monkeypatch.setattr(opening, "llama_build_info", lambda: f"{build} (another build)")
    with caplog.at_level(logging.WARNING, logger="agentmem"):
        r, logits, failures = resume(tiny_model_path, tmp_path / "a.db")
    assert_refused(r, failures, logits, fresh(tiny_model_path), caplog, "llama")


def test_llama_kv_rotation_mismatch_is_refused(tiny_hd64_path: Path, tmp_path: Path, caplog: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug guarded: llama.cpp's KV rotation is not in the fingerprint (issue #35).

    A q8_0 K/V cache written with llama.cpp's default rotation and read back where
    `LLAMA_ATTN_ROT_DISABLE=1` (or by a build with another default) holds rotated keys
    the new context reads unrotated: the same fingerprint, a wrong restore.
    """
    quant = dict(type_k="q8_0", type_v="q8_0")
    monkeypatch.delenv("LLAMA_ATTN_ROT_DISABLE", raising=False)
    store(tiny_hd64_path, tmp_path / "a.db", **quant)
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    with caplog.at_level(logging.WARNING, logger="agentmem"):
        r, logits, failures = resume(tiny_hd64_path, tmp_path / "a.db", **quant)
    assert_refused(r, failures, logits, fresh(tiny_hd64_path, **quant), caplog, "rot")


def test_park_rotate_change_converts_exactly(tiny_hd64_path: Path, tmp_path: Path) -> None:
    """agentmem's codec rotation travels with the stored state: a restart with the other setting decodes it exactly."""
    lossy = dict(cold_codec="q4_0")
    store(tiny_hd64_path, tmp_path / "a.db", park_rotate=True, **lossy)
    shutil.copy(tmp_path / "a.db", tmp_path / "b.db")
    r_same, same, _ = resume(tiny_hd64_path, tmp_path / "a.db", park_rotate=True, **lossy)
    r_other, other, failures = resume(tiny_hd64_path, tmp_path / "b.db", park_rotate=False, **lossy)
    assert r_same.kv == r_other.kv == "restored" and failures == 0
    np.testing.assert_array_equal(other, same)
    assert not np.array_equal(other, fresh(tiny_hd64_path)), "q4_0 should differ from f16: the test cannot tell"


def test_handoff_state_mismatch_is_refused(tiny_model_path: Path, tmp_path: Path, caplog: Any) -> None:
    """A handed-off agent's archived state (cells it got from another agent) is refused like any other."""
    with MemoryPool(tiny_model_path, archive_path=str(tmp_path / "a.db"), **OPTS) as p:
        p.chat("src", FIRST, max_tokens=3)
        p.handoff("src", "a")
        p.park("a", "cold")
        p.park("src", "cold")
    with caplog.at_level(logging.WARNING, logger="agentmem"):
        r, logits, failures = resume(tiny_model_path, tmp_path / "a.db", resident_agents=3)
    assert_refused(r, failures, logits, fresh(tiny_model_path, resident_agents=3), caplog, "n_seq_max")
