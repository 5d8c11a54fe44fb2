"""Workflow hints on a real model: with fewer live sequences than agents, correct hints keep more agents resident.

Gemma 3 270M only (the model is beside the point: placement is model-independent, and
Gemma is always installed); the instruct model's multi-agent runs are in
`benchmarks/apps_autogen.py`.
"""

from __future__ import annotations

import random

import pytest

from agentmem import MemoryPool

pytestmark = pytest.mark.integration

AGENTS = ["planner", "coder", "reviewer", "writer"]


def order(n: int, seed: int = 7) -> list[str]:
    """A selector-like speaker order the online predictor cannot learn (random, no agent twice in a row)."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        x = rng.choice(AGENTS)
        if not out or x != out[-1]:
            out.append(x)
    return out


def run(model_path, *, hinted: bool) -> tuple[int, int, dict]:
    """Calls whose agent was still resident (of those with a kept state), and the hint stats."""
    hists = {a: [{"role": "system", "content": f"You are the {a} of a small software team. Answer briefly."}]
             for a in AGENTS}
    seq = order(14)
    reused = counted = 0
    with MemoryPool(model_path, n_ctx=4096, resident_agents=2, prefetch=False, n_threads=1) as pool:
        for i, a in enumerate(seq):
            if hinted:
                pool.expect(seq[i : i + 4], soon=False)  # what a selector knows: who runs now, then next
            h = hists[a]
            h.append({"role": "user", "content": f"Step {i}: one word for the {a}?"})
            r = pool.chat(a, h, max_tokens=2)
            h.append({"role": "assistant", "content": r.text})
            if len(h) > 3:  # not its first call
                counted += 1
                reused += r.kv == "reused"
        return reused, counted, pool.stats()["hints"]


def test_correct_hints_give_more_resident_hits_than_none(gemma_model_path) -> None:
    plain, n, _ = run(gemma_model_path, hinted=False)
    hinted, n2, stats = run(gemma_model_path, hinted=True)
    assert n == n2
    assert stats["expected"] == n and stats["hits"] == hinted, stats
    # 2 live sequences for 4 agents: the agent furthest from its next call gives its sequence up
    assert hinted > plain, f"resident hits: hinted {hinted}/{n}, no hints {plain}/{n}"
