"""Park codecs and a live q8_0 cache on the real default model (Gemma 3 270M Q4_K_M).

Each park codec parks a planner agent (by running a coder on the single sequence)
and restores it; the planner then continues: a non-empty reply, the restored KV
reused, and for ``f16`` and ``q8_0`` the same reply as an agent that was never
parked (checked on this fixed conversation; 4-bit states are close but not
guaranteed to pick the same greedy tokens, see ``docs/fidelity.md``). Parked
sizes are the real bytes the pool reports. ``n_threads=1``: on a shared 2-core
machine a second ggml thread mostly spins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentmem import MemoryPool

pytestmark = pytest.mark.integration

POOL: dict[str, Any] = dict(n_ctx=2048, resident_agents=1, n_threads=1, prefetch=False)
SYSTEM = "You are the planner in a small software team. Answer in one short sentence."
FIRST = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "We must ship a command-line tool that converts CSV files to JSON by Friday. "
                                "What is the first step?"},
]
OTHER = [{"role": "user", "content": "Write a Python function that reverses a string."}]
MAX_TOKENS = 16


def follow(reply: str) -> list[dict[str, str]]:
    return [*FIRST, {"role": "assistant", "content": reply}, {"role": "user", "content": "And the second step?"}]


def run(path: Path, *, park: bool, **options: Any) -> dict[str, Any]:
    with MemoryPool(path, **{**POOL, **options}) as p:
        r1 = p.chat("planner", FIRST, max_tokens=MAX_TOKENS)
        parked = None
        if park:
            p.chat("coder", OTHER, max_tokens=4)  # one sequence: parks the planner
            parked = p.stats()["agents"]["planner"]
        r2 = p.chat("planner", follow(r1.text), max_tokens=MAX_TOKENS)
        return {"r1": r1, "r2": r2, "parked": parked, "restores": p.stats()["totals"]["restores"]}


@pytest.fixture(scope="module")
def never_parked(default_model_path: Path) -> dict[str, Any]:
    return run(default_model_path, park=False)


@pytest.fixture(scope="module")
def f16_bytes(default_model_path: Path) -> int:
    return run(default_model_path, park=True, park_codec="f16")["parked"]["bytes"]


@pytest.mark.parametrize("spec", ["f16", "q8_0", "q4_0", "q8_0/q4_0"])
def test_park_restore_continues(default_model_path: Path, never_parked: dict[str, Any], f16_bytes: int,
                                spec: str) -> None:
    out = run(default_model_path, park=True, park_codec=spec, park_rotate=spec == "q4_0")
    parked, r2 = out["parked"], out["r2"]
    assert parked["tier"] == "warm" and parked["codec"] == spec, parked
    assert r2.kv == "restored" and out["restores"] == 1, (r2.kv, out["restores"])
    assert r2.usage.cached_tokens >= out["r1"].usage.prompt_tokens
    assert r2.text.strip(), "a restored agent must keep talking"
    ratio = parked["bytes"] / f16_bytes
    assert ratio <= {"f16": 1.0, "q8_0": 0.55, "q4_0": 0.30, "q8_0/q4_0": 0.42}[spec], f"{spec}: {ratio=:.3f}"
    if spec in ("f16", "q8_0"):
        assert r2.text == never_parked["r2"].text, (r2.text, never_parked["r2"].text)


def test_live_q8_0_cache_parks_and_restores(default_model_path: Path, f16_bytes: int) -> None:
    """type_k/type_v q8_0 (flash attention on): half the bytes, exact restore, a sensible reply."""
    live = dict(type_k="q8_0", type_v="q8_0", flash_attn=True)
    parked = run(default_model_path, park=True, **live)
    never = run(default_model_path, park=False, **live)
    assert parked["r2"].kv == "restored"
    assert parked["parked"]["bytes"] <= 0.55 * f16_bytes, (parked["parked"]["bytes"], f16_bytes)
    assert parked["r2"].text == never["r2"].text  # the q8_0 blob is restored byte for byte
    assert parked["r2"].text.strip()
