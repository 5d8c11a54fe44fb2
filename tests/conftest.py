"""Shared pytest fixtures: the tiny synthetic GGUF models and the test markers.

Fixtures:
    tiny_model_path: a 2-layer ``llama`` GGUF with a ChatML template (session scope).
    tiny_gemma3_path: a 3-layer ``gemma3`` GGUF with sliding-window layers, whose
        sequence state blobs hold a base and an SWA cache section (session scope).
    tiny_qwen2_path: a 2-layer ``qwen2`` GGUF (q/k/v biases, no sliding window) with
        Qwen2.5's real jinja chat template, tools included (session scope).
    postgres_server, postgres_url: a real PostgreSQL server for the session and an
        empty schema per test (``tests/fixtures/postgres.py``); pgvector_server,
        pgvector_url: the same with the pgvector extension.
    backend, archive_target, arc: an archive test run over SQLite and PostgreSQL
        (``tests/fixtures/archives.py``).
    tiny_model_pools, model_team: two tiny-model pools and a fake ``ModelPool`` over them
        (``tests/fixtures/model_pools.py``).

The GPU lane: ``pytest -m gpu`` runs the pool, codec, tier, sharing, eviction and server
tests with every layer offloaded, skipped without a GPU (``tests/fixtures/gpu_lane.py``).

All are built once per session into a pytest temporary directory, in milliseconds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# ``tests`` has no ``__init__.py``; make ``tests.fixtures`` importable however pytest
# was started (``pytest`` does not put the working directory on ``sys.path``,
# ``python -m pytest`` does).
_REPO_ROOT = Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))

import agentmem  # noqa: E402,F401 - first: llama.cpp's libraries before numpy (agentmem/engine/native_first.py)
from tests.fixtures.archives import arc, archive_target, backend  # noqa: E402,F401 - the archive contract fixtures
from tests.fixtures.postgres import postgres_server, postgres_url  # noqa: E402,F401 - a real PostgreSQL server
from tests.fixtures.postgres import pgvector_server, pgvector_url  # noqa: E402,F401 - and one with pgvector
from tests.fixtures.model_pools import tiny_model_pools, model_team  # noqa: E402,F401 - a fake ModelPool, tiny pools
from tests.fixtures.tiny_gguf import QWEN2_TEMPLATE, build_tiny_gguf  # noqa: E402
from tests.fixtures import gpu_lane  # noqa: E402

# llama.cpp's results can depend on its thread count, and `default_threads()` picks one
# from the load average when nobody says: two pools of one test could then round
# differently. Every pool without an explicit `n_threads` gets one thread (on a 2-core
# machine with a busy neighbour also the fastest: ggml's threads spin at barriers),
# unless the caller set `AGENTMEM_THREADS` for the session.
os.environ.setdefault("AGENTMEM_THREADS", "1")

_MARKERS: dict[str, str] = {
    "integration": "needs the real bundled models (gemma-3-270m, qwen2.5-coder-0.5b-instruct); slow",
    "gpu": gpu_lane.MARKER.split(": ", 1)[1],
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kv-layout", default="auto", choices=("auto", "unified", "per_sequence"),
        help="run every pool whose kv_layout is 'auto' with this layout (e.g. the sharing tests over per-sequence streams)",
    )


@pytest.fixture(autouse=True)
def _forced_kv_layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--kv-layout`: pools left at `kv_layout="auto"` get that layout instead of the rule's choice."""
    forced = request.config.getoption("--kv-layout")
    if forced != "auto":
        import agentmem.pool.opening as opening

        monkeypatch.setattr(opening, "choose_kv_layout", lambda cfg: forced if cfg.kv_layout == "auto" else cfg.kv_layout)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The GPU lane (`pytest -m gpu`, `tests/fixtures/gpu_lane.py`): marked by file, skipped without a GPU."""
    gpu_lane.mark_lane(config, items)


@pytest.fixture
def unified_kv_only(request: pytest.FixtureRequest) -> None:
    """Skip under `--kv-layout per_sequence`: shared KV blocks, linked restores and cells tagged
    for several sequences exist in a unified cache only (per-sequence streams copy prefixes),
    and there one agent may hold the whole context, not `n_ctx / resident_agents`."""
    if request.config.getoption("--kv-layout") == "per_sequence":
        pytest.skip("needs a unified KV cache (shared blocks, linked restores, or an agent larger than one stream)")


def pytest_configure(config: pytest.Config) -> None:
    """Register the project's markers unless pyproject.toml already declares them; switch the GPU lane on."""
    declared = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    for name, description in _MARKERS.items():
        if name not in declared:
            config.addinivalue_line("markers", f"{name}: {description}")
    gpu_lane.offload_all(config)  # the GPU lane (`pytest -m gpu`): every layer offloaded, the whole session


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a tiny random-weight ``llama`` GGUF (ChatML template, 641 tokens)."""
    return build_tiny_gguf(tmp_path_factory.mktemp("tiny-llama") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_gemma3_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a tiny random-weight ``gemma3`` GGUF (iSWA: window 16 on layers 0-1)."""
    return build_tiny_gguf(
        tmp_path_factory.mktemp("tiny-gemma3") / "tiny-gemma3.gguf", arch="gemma3"
    )


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a tiny random-weight ``qwen2`` GGUF carrying Qwen2.5's jinja template (with tools)."""
    return build_tiny_gguf(
        tmp_path_factory.mktemp("tiny-qwen2") / "tiny-qwen2.gguf", arch="qwen2", chat_template=QWEN2_TEMPLATE
    )
