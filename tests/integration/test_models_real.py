"""Several models in one pool on the two bundled models (issue #26).

Gemma 3 270M (253 MB of weights) and Qwen2.5-Coder-0.5B-Instruct (491 MB): a budget
of 700 MiB holds one of them (plus a small context and parked KV), not both.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentmem.errors import ModelMismatchError
from agentmem.models import ModelPool

pytestmark = pytest.mark.integration

MiB = 1 << 20
ONE_MODEL = 700 * MiB
PLAN = [{"role": "system", "content": "You are the planner. Answer in a few words."},
        {"role": "user", "content": "Plan step one of a tiny web page: what comes first?"}]
CODE = [{"role": "system", "content": "You are the coder. Answer with code only."},
        {"role": "user", "content": "Write a Python function that adds two numbers."}]


def _team(models: dict[str, Path], archive: Path, budget: int) -> ModelPool:
    return ModelPool({k: str(v) for k, v in models.items()}, ram_budget_bytes=budget, archive_dir=archive,
                     n_ctx=2048, resident_agents=2, n_threads=1)


@pytest.fixture(scope="module")
def models(gemma_model_path: Path, instruct_model_path: Path) -> dict[str, Path]:
    return {"planner": gemma_model_path, "coder": instruct_model_path}


_LAST: dict[str, int] = {}  # agent -> prompt tokens of its previous call


def _turn(team: ModelPool, agent: str, msgs: list[dict[str, str]], model: str | None = None):
    """One call, and whether its KV held at least the whole previous prompt of the agent."""
    r = team.chat(agent, msgs, model=model, max_tokens=8)
    kept = r.usage.cached_tokens >= _LAST.get(agent, 1 << 30)
    _LAST[agent] = r.usage.prompt_tokens
    msgs.append({"role": "assistant", "content": r.text})
    msgs.append({"role": "user", "content": "And then?"})
    return r, kept


@pytest.fixture(autouse=True)
def _fresh_turns() -> None:
    _LAST.clear()


def test_alternating_models_keep_every_agents_kv(models: dict[str, Path], tmp_path: Path) -> None:
    """Room for both: the calls alternate between the models and every agent reuses its live KV."""
    with _team(models, tmp_path, 0) as team:
        plan, code = [dict(m) for m in PLAN], [dict(m) for m in CODE]
        assert _turn(team, "plan", plan, "planner")[0].kv == "prefilled"
        assert _turn(team, "code", code, "coder")[0].kv == "prefilled"
        for _ in range(2):
            (r1, k1), (r2, k2) = _turn(team, "plan", plan), _turn(team, "code", code)
            assert (r1.kv, r2.kv) == ("reused", "reused")
            assert k1 and k2, (r1.usage, r2.usage)
        states = {m["name"]: (m["state"], m["loads"], m["unloads"]) for m in team.models()}
        assert states == {"planner": ("loaded", 1, 0), "coder": ("loaded", 1, 0)}


def test_a_budget_for_one_model_restores_the_returning_models_agents(models: dict[str, Path], tmp_path: Path) -> None:
    """Room for one: each switch of model unloads the other, and its agents come back restored, not prefilled."""
    with _team(models, tmp_path, ONE_MODEL) as team:
        team.prefetch_models = False  # the switch happens in the call itself: what it restores is its own
        plan, code = [dict(m) for m in PLAN], [dict(m) for m in CODE]
        _turn(team, "plan", plan, "planner")
        _turn(team, "code", code, "coder")
        held = {a: team.pool(team.model_of(a) or "").history_tokens(a) for a in ("code",)}
        r, kept = _turn(team, "plan", plan)
        assert r.kv == "restored" and kept, (r.kv, r.usage)
        r, kept = _turn(team, "code", code)
        assert r.kv == "restored" and kept, (r.kv, r.usage)
        assert list(team.pool("coder").history_tokens("code")[: len(held["code"])]) == list(held["code"])
        states = {m["name"]: (m["loads"], m["unloads"]) for m in team.models()}
        assert states["planner"][1] >= 1 and states["coder"][1] >= 1, states
        assert [m["name"] for m in team.models() if m["state"] == "loaded"] == ["coder"]


def test_an_agent_cannot_be_restored_into_the_wrong_model(models: dict[str, Path], tmp_path: Path) -> None:
    """Naming the other model is refused; an archive file moved to the other model is not restored from."""
    with _team(models, tmp_path, 0) as team:
        team.chat("plan", [dict(m) for m in PLAN], model="planner", max_tokens=4)
        with pytest.raises(ModelMismatchError, match="bound to model 'planner'"):
            team.chat("plan", [dict(m) for m in PLAN], model="coder", max_tokens=4)
    # swap the files: the planner's agent now sits in the coder's archive
    shutil.move(tmp_path / "planner.db", tmp_path / "coder.db")
    with _team(models, tmp_path, 0) as team:
        assert team.model_of("plan") == "coder"
        r = team.chat("plan", [dict(m) for m in PLAN], max_tokens=4)
        assert r.kv == "prefilled", r.kv  # the fingerprint refuses Gemma's KV in Qwen; re-prefilled, not garbage


def test_after_a_restart_both_models_agents_resume_from_the_archive(models: dict[str, Path], tmp_path: Path) -> None:
    plan, code = [dict(m) for m in PLAN], [dict(m) for m in CODE]
    with _team(models, tmp_path, ONE_MODEL) as team:
        _turn(team, "plan", plan, "planner")
        _turn(team, "code", code, "coder")
    with _team(models, tmp_path, ONE_MODEL) as team:
        assert (team.model_of("plan"), team.model_of("code")) == ("planner", "coder")
        for agent, msgs in (("plan", plan), ("code", code)):
            r, kept = _turn(team, agent, msgs)
            assert r.kv == "restored" and kept, (agent, r.kv, r.usage)
