"""Fixtures for integration tests on the real default model (Gemma 3 270M Q4_K_M)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmem.model import resolve_model_path


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The bundled default model, assembled once into the cache directory."""
    return resolve_model_path()
