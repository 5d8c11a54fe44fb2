"""Helpers the server benchmarks share: a server subprocess with an RSS sampler, one streamed chat call, percentiles.

Both `serve_load.py` and `vs_llama_server.py` drive servers over HTTP on 127.0.0.1 only,
with the same `httpx` client code for agentmem and llama-server.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = ["CallResult", "ServerProc", "free_port", "pct", "stream_chat"]


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(xs: list[float], q: float) -> float:
    """The `q`-th percentile (nearest rank) of `xs`; NaN when empty."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def rss_bytes(pid: int) -> int:
    """VmRSS of `pid` from /proc/PID/status (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class ServerProc:
    """A server subprocess on 127.0.0.1:`port`: start, wait for health, sample RSS, stop or kill.

    Args:
        cmd: the command line (the caller puts `--host 127.0.0.1 --port PORT` in it).
        port: the port it binds.
        log: file its stdout and stderr go to.
        health: the path that answers 200 once it serves.
        rss_every_s: RSS sampling period.
        env: extra environment variables of the process (only its own).
    """

    def __init__(self, cmd: list[str], port: int, log: Path, *, health: str = "/health", rss_every_s: float = 1.0,
                 env: dict[str, str] | None = None) -> None:
        self.cmd, self.port, self.log, self.health, self.rss_every_s = cmd, port, log, health, rss_every_s
        self.env = {**os.environ, **env} if env else None
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.rss: list[tuple[float, int]] = []  # (seconds since start, bytes)
        self._t0 = 0.0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self, timeout_s: float = 300.0) -> float:
        """Start it and wait until `health` answers 200; returns the seconds that took."""
        self._t0 = time.monotonic()
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(self.cmd, stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=self.env)
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        deadline = self._t0 + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before it was healthy; see {self.log}")
            try:
                if httpx.get(self.base_url + self.health, timeout=2.0).status_code == 200:
                    return time.monotonic() - self._t0
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise TimeoutError(f"{self.base_url} not healthy in {timeout_s} s; see {self.log}")

    def _sample(self) -> None:
        assert self.proc is not None
        pid = self.proc.pid
        while not self._stop.is_set() and self.proc.poll() is None:
            self.rss.append((round(time.monotonic() - self._t0, 1), rss_bytes(pid)))
            self._stop.wait(self.rss_every_s)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> int | None:
        """Send `sig`, wait for the exit (SIGKILL after `timeout_s`); returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._stop.set()
        return self.proc.returncode

    def kill(self) -> int | None:
        """SIGKILL (no shutdown work at all)."""
        return self.stop(signal.SIGKILL, timeout_s=30.0)

    def rss_now(self) -> int:
        """The server's VmRSS now (0 when it is not running)."""
        return rss_bytes(self.proc.pid) if self.proc is not None and self.proc.poll() is None else 0

    def peak_rss(self) -> int:
        return max((b for _, b in self.rss), default=0)


@dataclass
class CallResult:
    """One streamed call as the client saw it."""

    status: int
    ttft_s: float = math.nan  # first chunk with content (or the end, when none had content)
    latency_s: float = math.nan
    text: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    server: dict[str, Any] = field(default_factory=dict)  # agentmem's `agentmem` object or llama-server's `timings`
    error: str = ""


def stream_chat(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
                *, close_after_first: bool = False, timeout_s: float = 300.0) -> CallResult:
    """POST a streaming chat completion and time it.

    `usage` comes from `stream_options.include_usage`; llama-server's `timings` (`prompt_n`,
    `cache_n`) and agentmem's `agentmem` object are kept in `server`. With `close_after_first`
    the connection is closed right after the first chunk (a client going away mid-stream).
    """
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    res = CallResult(status=0)
    try:
        with client.stream("POST", url, json=body, headers=headers or {}, timeout=timeout_s) as r:
            res.status = r.status_code
            if r.status_code != 200:
                res.error = r.read().decode(errors="replace")[:300]
                res.latency_s = time.perf_counter() - t0
                return res
            parts: list[str] = []
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"])[:300]
                for ch in chunk.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                    if piece:
                        parts.append(piece)
                        if math.isnan(res.ttft_s):
                            res.ttft_s = time.perf_counter() - t0
                if close_after_first and (parts or chunk.get("choices")):
                    if math.isnan(res.ttft_s):
                        res.ttft_s = time.perf_counter() - t0
                    break
                usage = chunk.get("usage")
                if usage:
                    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    res.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                for key in ("agentmem", "timings"):
                    if key in chunk:
                        res.server = chunk[key]
            res.text = "".join(parts)
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:300]
    res.latency_s = time.perf_counter() - t0
    if math.isnan(res.ttft_s):
        res.ttft_s = res.latency_s
    if res.server.get("cache_n") is not None and not res.cached_tokens:  # llama-server: cached = cache_n
        res.cached_tokens = int(res.server["cache_n"])
    return res
