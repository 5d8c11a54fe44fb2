"""The apps' server variants: `agentmem serve` and llama-server started for `apps.py` / `apps_autogen.py`, and the HTTP clients.

Both servers get the same model, threads and context, and fewer live sequences than
the apps have agents: agentmem `--resident 2`, llama-server `-np 2 -kvu --cache-ram`
(its host-RAM prompt cache holds the other agents' prompts). Started one at a time on
127.0.0.1 (`benchmarks/_serving.ServerProc`), llama-server with `LD_LIBRARY_PATH` in its
own environment only.

Identity: agentmem serve takes the agent from the `X-Agent-Id` header
(`agentmem/server/identity.py`), so every agent gets its own client object with
`default_headers={"X-Agent-Id": agent}` — `ChatOpenAI` per graph node (the team) or per
user (the tools app), `OpenAIChatCompletionClient` per AutoGen agent. llama-server gets
the same one-client-per-agent setup without a header (it has no agent identity: a
request goes to the slot whose cached prompt matches best, and `--cache-ram` keeps the
others' prompts in RAM).

Cached tokens: both report `usage.prompt_tokens_details.cached_tokens` (llama-server's
equals its `timings.cache_n`), which `ChatOpenAI` puts in
`usage_metadata["input_token_details"]["cache_read"]`.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._serving import ServerProc, free_port  # noqa: E402

__all__ = ["SERVER_VARIANTS", "PerNodeChat", "Served", "ServerBackend", "probe_tool_choice", "start_server",
           "tool_choice_warnings"]

#: variant key -> the row's name
SERVER_VARIANTS = {"serve": "agentmem serve", "llama-server": "llama-server --cache-ram"}


@dataclass
class Served:
    """A started server of one variant."""

    key: str  # "serve" | "llama-server"
    name: str
    proc: ServerProc
    model_name: str

    @property
    def base_url(self) -> str:
        return self.proc.base_url + "/v1"

    def headers(self, agent: str) -> dict[str, str] | None:
        """The agent's identity as agentmem serve documents it; None for llama-server (it has none)."""
        return {"X-Agent-Id": agent} if self.key == "serve" else None

    def agents_summary(self) -> dict[str, int] | None:
        """agentmem's own count (`GET /agents`): agents, restores, prefill and cached tokens; None for llama-server."""
        if self.key != "serve":
            return None
        agents = httpx.get(self.proc.base_url + "/agents", timeout=30).json()["data"]
        return {"agents": len(agents), **{k: sum(int(a.get(k) or 0) for a in agents)
                                         for k in ("restores", "prefill_tokens", "cached_tokens")}}

    def stop(self) -> None:
        self.proc.stop()


def llama_binary(path: str | None) -> tuple[Path | None, str]:
    """The llama-server binary (given, cached or built) and "", or None and why not."""
    from benchmarks._llama_build import find_or_build

    try:
        binary = find_or_build(path, None, 2)
    except Exception as exc:  # a missing compiler, no network: the variant is skipped, with the reason
        return None, f"llama-server missing and not built ({type(exc).__name__}: {exc})"
    if not binary.exists():
        return None, f"llama-server binary {binary} does not exist"
    return binary, ""


def start_server(key: str, *, model: str, threads: int, resident: int, n_ctx: int, cache_ram_mib: int,
                 log_dir: Path, binary: str | None = None) -> Served | str:
    """Start variant `key` and wait for its health; a string says why it was skipped."""
    port = free_port()
    if key == "serve":
        cmd = [sys.executable, "-m", "agentmem.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--model", model, "--resident", str(resident), "--n-ctx", str(n_ctx), "--threads", str(threads),
               "--max-concurrent", "64", "--log-level", "warning"]
        proc = ServerProc(cmd, port, log_dir / "agentmem-serve.log")
    elif key == "llama-server":
        found, why = llama_binary(binary)
        if found is None:
            return why
        # --jinja: the model's own template renders `tools` (needed for tool calls); -lv 4: the
        # slot / prompt-cache lines in its log
        cmd = [str(found), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "-c", str(n_ctx), "-np", str(resident), "-kvu", "--cache-ram", str(cache_ram_mib),
               "--jinja", "--no-webui", "--metrics", "-lv", "4"]
        lib_path = os.pathsep.join(filter(None, [str(found.parent), os.environ.get("LD_LIBRARY_PATH")]))
        proc = ServerProc(cmd, port, log_dir / "llama-server.log", env={"LD_LIBRARY_PATH": lib_path})
    else:
        raise ValueError(f"unknown server variant {key!r}; valid: {', '.join(SERVER_VARIANTS)}")
    try:
        proc.start()
    except (RuntimeError, TimeoutError) as exc:
        return f"{SERVER_VARIANTS[key]} did not start: {exc}"
    return Served(key, SERVER_VARIANTS[key], proc, Path(model).stem)


class PerNodeChat:
    """Stands in for the one model object `build_graph` takes: each call goes to the calling node's own `ChatOpenAI`.

    The node is read from LangGraph's run config (`"{thread_id}/{langgraph_node}"`, the
    agent id `ChatAgentMem` would derive); every attribute (`stream`, `bind_tools`,
    `invoke`) is that node's client's. The last agent per thread is kept for `metrics`.
    """

    def __init__(self, backend: ServerBackend) -> None:
        self._backend = backend

    def _current(self) -> Any:
        from langgraph.config import get_config

        cfg = get_config()
        agent = f"{cfg['configurable']['thread_id']}/{cfg['metadata']['langgraph_node']}"
        return self._backend.chat(agent)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current(), name)


class ServerBackend:
    """The apps' `Backend` over HTTP: one `ChatOpenAI` per agent, cached tokens from the server's usage."""

    no_tool = "none"

    def __init__(self, served: Served, *, max_tokens: int) -> None:
        self.served, self.max_tokens = served, max_tokens
        self.name = served.name
        self._chats: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self.tool_calls = 0  # replies that came back as tool calls
        self.model = PerNodeChat(self)

    def chat(self, agent: str) -> Any:
        """The agent's own `ChatOpenAI` (made on first use)."""
        from langchain_openai import ChatOpenAI

        self._local.agent = agent
        with self._lock:
            if agent not in self._chats:
                self._chats[agent] = ChatOpenAI(
                    base_url=self.served.base_url, api_key="none", model=self.served.model_name,
                    max_tokens=self.max_tokens, temperature=0, stream_usage=True,
                    default_headers=self.served.headers(agent))
            return self._chats[agent]

    def attach(self, app: Any) -> None:
        pass

    def begin(self) -> None:
        pass

    def metrics(self, message: Any) -> dict[str, Any]:
        usage = message.usage_metadata or {}
        if getattr(message, "tool_calls", None):
            with self._lock:
                self.tool_calls += 1
        return {"agent": getattr(self._local, "agent", "?"), "kv": "-",
                "cache_read": int((usage.get("input_token_details") or {}).get("cache_read") or 0),
                "prompt_tokens": int(usage.get("input_tokens") or 0)}

    def close(self) -> None:
        self.served.stop()


def tool_choice_warnings(served: Served) -> list[str]:
    """llama-server's log lines about a `tool_choice` it did not take (it falls back to `auto`)."""
    try:
        text = served.proc.log.read_text(errors="replace")
    except OSError:
        return []
    return sorted({line.split(" W ", 1)[-1].strip() for line in text.splitlines() if "tool_choice" in line})


def probe_tool_choice(served: Served, tools: list[Any], messages: list[dict[str, Any]], *,
                      forced: str) -> dict[str, str]:
    """How the server answers a forced call, as `tool_choice` naming `forced` and as `"required"` (non-streamed).

    Run after the app (its prompt would otherwise seed the server's cache). Each value
    is `tool_calls: NAME(ARGS)` or `no tool call: finish_reason, content` (first 60 chars).
    """
    from langchain_core.utils.function_calling import convert_to_openai_tool

    body = {"model": served.model_name, "messages": messages, "tools": [convert_to_openai_tool(t) for t in tools],
            "max_tokens": 32, "temperature": 0}
    out = {}
    for label, choice in (("named", {"type": "function", "function": {"name": forced}}), ("required", "required")):
        r = httpx.post(served.base_url + "/chat/completions", json={**body, "tool_choice": choice},
                       headers=served.headers("probe/tool-choice"), timeout=300)
        if r.status_code != 200:
            out[label] = f"HTTP {r.status_code}: {r.text[:120]}"
            continue
        ch = r.json()["choices"][0]
        calls = ch["message"].get("tool_calls") or []
        out[label] = (f"tool_calls: {calls[0]['function']['name']}({calls[0]['function']['arguments']})" if calls else
                      f"no tool call: finish_reason={ch['finish_reason']}, content={(ch['message'].get('content') or '')[:60]!r}")
    return out
