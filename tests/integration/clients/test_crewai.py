"""CrewAI 1.15 in its default set-up against `agentmem serve`, in its own virtualenv.

CrewAI pins `openai<3`, so it lives in `.venv-crewai` (`bash scripts/install_crewai.sh`,
run by `make test`); this test runs `crewai_run.py` there as a subprocess against the
shared `served` server: `LLM(model="openai/<name>", base_url=..., api_key=...)`, one agent
with one tool, one task, `max_iter=1`, two kickoffs. Each kickoff is a call with `tools`
(the model calls the tool) and CrewAI's final-answer call without `tools`: a side request
on the conversation's line. The test asserts the tool was called and that the second
kickoff's first call read >= 95 % of its prompt from the KV the first kickoff kept
(`cached_prompt_tokens` of CrewAI's own per-call usage). Slow on 2 busy cores (each free
tool turn decodes to `max_tokens`): it has 20 minutes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.clients.conftest import Served

pytestmark = pytest.mark.integration

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[3]
VENV = Path(os.environ.get("AGENTMEM_CREWAI_VENV", ROOT / ".venv-crewai"))
SCRIPT = Path(__file__).with_name("crewai_run.py")


def _crewai_python() -> Path:
    """The venv's interpreter, or skip saying how to make it."""
    python = VENV / "bin" / "python"
    if not (VENV / ".crewai-installed").is_file() or not python.is_file():
        pytest.skip(f"no CrewAI virtualenv at {VENV}: run `bash scripts/install_crewai.sh` (make test does)")
    return python


def test_crewai_tool_call_and_second_kickoff_read_kept_kv(served: Served, tmp_path: Path) -> None:
    """The agent calls `get_weather`; the second kickoff's first call reads its prompt from kept KV."""
    python = _crewai_python()
    out, err = tmp_path / "crewai.json", tmp_path / "crewai.log"
    env = {**os.environ, "OPENAI_API_BASE": served.v1, "OPENAI_API_KEY": "x", "HOME": str(tmp_path)}
    cmd = [str(python), str(SCRIPT), "--base-url", served.v1, "--api-key", "x", "--model", served.model,
           "--out", str(out)]
    with err.open("w", encoding="utf-8") as log:
        try:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1200, check=False).returncode
        finally:
            logger.info("crewai_run.py log:\n%s", err.read_text(encoding="utf-8")[-4000:])
    assert rc == 0, err.read_text(encoding="utf-8")[-3000:]
    summary = json.loads(out.read_text(encoding="utf-8"))
    logger.info("crewai: %s", json.dumps(summary))
    assert summary["tool_calls"], summary
    second = [c["usage"] for c in summary["llm_calls"] if c["run"] == 1]
    assert second, summary
    first_call = second[0]
    cached, prompt = first_call.get("cached_prompt_tokens", 0), first_call["prompt_tokens"]
    assert cached >= 0.95 * prompt, f"second kickoff's first call: {cached=} of {prompt=}"
