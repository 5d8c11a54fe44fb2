"""`agentmem serve` as a process: SIGTERM checkpoints every agent into `--archive`, the next start resumes them.

Also the command line (flags → settings, keys, pool config) and the package boundary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

import httpx  # noqa: E402

from agentmem.cli import build_parser, main  # noqa: E402
from agentmem.errors import ConfigError  # noqa: E402
from agentmem.server import ServerSettings  # noqa: E402
from agentmem.server.cli import build  # noqa: E402
from tests.fixtures.serving import free_port, wait_healthy  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def start(model: Path, archive: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "agentmem.cli", "serve", "--model", str(model), "--archive", str(archive),
           "--port", str(port), "--threads", "1", "--n-ctx", "2048", "--resident", "2", "--model-name", "tiny",
           "--log-level", "warning", *extra]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


CLEAN = (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its graceful shutdown


def stop(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out.decode(errors="replace")


def test_sigterm_checkpoints_and_restart_resumes_agents(tiny_model_path: Path, tmp_path: Path) -> None:
    archive = tmp_path / "agents.db"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(tiny_model_path, archive, port)
    histories: dict[str, list[dict[str, Any]]] = {}
    try:
        wait_healthy(base, proc=proc)
        with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0) as client:
            for name in ("planner", "coder", "critic"):
                msgs = [{"role": "system", "content": f"You are the {name}."}, {"role": "user", "content": "Go."}]
                r = client.chat.completions.create(model="tiny", messages=msgs, user=name, max_tokens=6)
                histories[name] = [*msgs, {"role": "assistant", "content": r.choices[0].message.content},
                                   {"role": "user", "content": "Next."}]
        before = {a["id"]: a["tokens"] for a in httpx.get(f"{base}/agents").json()["data"]}
    finally:
        code, log = stop(proc)
    assert code in CLEAN and "Traceback" not in log, log
    assert set(before) == set(histories)

    proc = start(tiny_model_path, archive, port)
    try:
        wait_healthy(base, proc=proc)
        agents = {a["id"]: a for a in httpx.get(f"{base}/agents").json()["data"]}
        assert {k: v["tokens"] for k, v in agents.items()} == before  # every agent came back, whole
        assert all(a["tier"] == "cold" for a in agents.values())
        with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0) as client:
            r = client.chat.completions.create(model="tiny", messages=histories["coder"], user="coder", max_tokens=4)
        assert r.model_extra["agentmem"]["kv"] == "restored"
        assert r.usage.prompt_tokens_details.cached_tokens >= before["coder"] - 1
        r = httpx.post(f"{base}/agents", params={"action": "checkpoint"})
        assert r.status_code == 200
    finally:
        code, log = stop(proc)
    assert code in CLEAN and "Traceback" not in log, log


def test_sigterm_during_a_stream_ends_cleanly(tiny_model_path: Path, tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(tiny_model_path, tmp_path / "a.db", port, "--shutdown-grace", "2")
    try:
        wait_healthy(base, proc=proc)
        body = {"messages": [{"role": "user", "content": "talk"}], "user": "talker", "max_tokens": 1500, "stream": True}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            proc.send_signal(signal.SIGTERM)
            tail = list(lines)  # the stream finishes (or is cut) instead of hanging
        assert not tail or tail[-1] in ("data: [DONE]", "")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    log = out.decode(errors="replace")
    assert proc.returncode in CLEAN and "Traceback" not in log, log


def test_startup_failure_exits_2(tmp_path: Path) -> None:
    proc = start(tmp_path / "missing.gguf", tmp_path / "a.db", free_port())
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out.decode(errors="replace")
    assert b"model file not found" in out


def test_cli_flags_build_settings_keys_and_pool_config(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-t team/\n")
    args = build_parser().parse_args([
        "serve", "--port", "9001", "--model", "m.gguf", "--archive", "a.db", "--resident", "3", "--n-ctx", "4096",
        "--api-key", "sk-admin", "--keys-file", str(keys), "--anonymous", "per-key", "--max-concurrent", "2",
        "--pool-option", "warm_budget_bytes=1048576", "--pool-option", "park_codec=q8_0",
    ])
    config, settings, ring = build(args)
    assert (config.model_path, config.archive_path, config.resident_agents, config.n_ctx) == ("m.gguf", "a.db", 3, 4096)
    assert (config.warm_budget_bytes, config.park_codec) == (1048576, "q8_0")
    assert settings == ServerSettings(port=9001, anonymous="per-key", max_concurrent_per_key=2)
    assert ring.authenticate("sk-admin").admin and ring.authenticate("sk-t").prefix == "team/"
    bad = build_parser().parse_args(["serve", "--pool-option", "nope=1"])
    with pytest.raises(ConfigError, match="unknown pool option"):
        build(bad)
    assert main(["serve", "--port", "0"]) == 2  # a ConfigError is one line on stderr, status 2


def test_settings_round_trip_and_validation() -> None:
    s = ServerSettings(max_prompt_tokens=100, anonymous="per-key")
    assert ServerSettings.from_dict(s.to_dict()) == s
    with pytest.raises(ConfigError, match="anonymous"):
        ServerSettings(anonymous="sometimes")
    with pytest.raises(ConfigError, match="unknown server setting"):
        ServerSettings.from_dict({"colour": "blue"})


def test_public_api_is_pinned() -> None:
    import agentmem.server

    assert agentmem.server.__all__ == ["INSTALL_HINT", "KeyRing", "ServerSettings", "create_app", "require_server_deps"]


def test_without_the_server_extra_the_cli_works_and_serve_names_the_install_command() -> None:
    """Optional dependencies stop at the package boundary: `agentmem --help` needs none of them."""
    code = (
        "import sys; sys.modules['fastapi'] = None\n"
        "from agentmem.cli import main\n"
        "try:\n"
        "    from agentmem.server import create_app\n"
        "except ImportError as exc:\n"
        "    print('IMPORT:', exc)\n"
        "print('STATUS:', main(['serve', '--port', '8123']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "IMPORT: agentmem serve needs FastAPI" in out.stdout and "pip install 'agentmem-kv[server]'" in out.stdout
    assert "STATUS: 2" in out.stdout
    assert "pip install 'agentmem-kv[server]'" in out.stderr


def test_durability_call_survives_a_sigkill(tiny_model_path: Path, tmp_path: Path) -> None:
    """Regression (issue #15 fault run): after a server SIGKILL every agent not yet checkpointed was lost;
    with `--durability call` each answered call's agent is in the archive and resumes with its KV."""
    archive = tmp_path / "agents.db"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(tiny_model_path, archive, port, "--durability", "call")
    histories: dict[str, list[dict[str, Any]]] = {}
    try:
        wait_healthy(base, proc=proc)
        with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0) as client:
            for name in ("planner", "coder", "critic"):  # 3 agents on 2 sequences: one is parked in RAM only
                msgs = [{"role": "system", "content": f"You are the {name}."}, {"role": "user", "content": "Go."}]
                r = client.chat.completions.create(model="tiny", messages=msgs, user=name, max_tokens=6)
                histories[name] = [*msgs, {"role": "assistant", "content": r.choices[0].message.content},
                                   {"role": "user", "content": "Next."}]
        before = {a["id"]: a["tokens"] for a in httpx.get(f"{base}/agents").json()["data"]}
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    proc = start(tiny_model_path, archive, port)
    try:
        wait_healthy(base, proc=proc)
        agents = {a["id"]: a["tokens"] for a in httpx.get(f"{base}/agents").json()["data"]}
        assert agents == before  # none lost, none shortened
        with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0) as client:
            for name, msgs in histories.items():
                r = client.chat.completions.create(model="tiny", messages=msgs, user=name, max_tokens=2)
                assert r.usage.prompt_tokens_details.cached_tokens > 0, (name, r.usage)
    finally:
        code, log = stop(proc)
    assert code in CLEAN and "Traceback" not in log, log


def test_durability_call_needs_an_archive() -> None:
    args = build_parser().parse_args(["serve", "--durability", "call"])
    with pytest.raises(ConfigError, match="--archive"):
        build(args)
