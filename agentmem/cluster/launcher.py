"""`Cluster`: N `agentmem serve` replicas and an nginx in front of them, on one machine, started and stopped together.

`agentmem cluster up --replicas 2 --archive-url postgresql://… --port 8000` runs
one; the failover test and `benchmarks/scale_out.py` use the class. Each replica
is a process of its own (`python -m agentmem.cli serve --archive-url … --replica-id
rN --port BASE+N`); nginx runs in the foreground as a child (`daemon off`) with its
config, logs and pid file in `workdir`. `stop` sends SIGTERM to nginx, then to the
replicas (each stores its agents under its leases and releases them), and SIGKILL
to whatever is still running after the grace period.

>>> c = Cluster(replicas=2, archive_url="postgresql://localhost/agentmem", port=8000, workdir="/tmp/am")
>>> c.replica_ports
[8001, 8002]
>>> c.serve_command(0)[3:9]
['serve', '--port', '8001', '--archive-url', 'postgresql://localhost/agentmem', '--replica-id']
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from agentmem.cluster.nginx import NginxConfig
from agentmem.errors import ConfigError

__all__ = ["Cluster"]

logger = logging.getLogger(__name__)


def _tail(log: Path | None, n: int = 5) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()[-n:] if log is not None else []
    except OSError:
        lines = []
    return (": " + " | ".join(lines)) if lines else ""


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError(f"{what} exited with status {proc.returncode} while starting ({log}){_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise ConfigError(f"{what} did not answer {url} within {timeout_s:.0f} s")


class Cluster:
    """Replicas plus nginx on one machine.

    Args:
        replicas: how many `agentmem serve` processes.
        archive_url: the shared archive (`postgresql://…`).
        port: the proxy's port (clients use `http://host:port/v1`).
        host: interface of the proxy and the replicas.
        base_port: replica `i` listens on `base_port + i` (default `port + 1`).
        ports: the replicas' ports one by one (instead of `base_port`).
        serve_args: more `agentmem serve` flags for every replica (`--model`, `--n-ctx`, …).
        workdir: nginx's config/logs and the replicas' logs (`replica-N.log`).
        nginx: the nginx binary (default: found on PATH or in /usr/sbin).
        env: extra environment of the replicas.
    """

    def __init__(self, *, replicas: int = 2, archive_url: str, port: int = 8000, host: str = "127.0.0.1",
                 base_port: int | None = None, ports: Sequence[int] | None = None, serve_args: Sequence[str] = (), workdir: str | os.PathLike[str] = ".",
                 nginx: str | None = None, env: dict[str, str] | None = None) -> None:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ConfigError(f"replicas must be an int >= 1, got {replicas!r}")
        if not archive_url:
            raise ConfigError("archive_url is required: the replicas share one archive")
        self.replicas, self.archive_url, self.port, self.host = replicas, archive_url, port, host
        self.base_port = port + 1 if base_port is None else base_port
        if ports is not None and len(ports) != replicas:
            raise ConfigError(f"ports must name {replicas} port(s), got {list(ports)}")
        self._ports = list(ports) if ports is not None else None
        self.serve_args = list(serve_args)
        self.workdir = Path(workdir)
        self.nginx_bin = nginx
        self.env = dict(env or {})
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * replicas
        self.proxy: subprocess.Popen[bytes] | None = None

    @property
    def replica_ports(self) -> list[int]:
        """The port of each replica."""
        return list(self._ports) if self._ports else [self.base_port + i for i in range(self.replicas)]

    @property
    def url(self) -> str:
        """The proxy's base URL (`…/v1` for OpenAI clients)."""
        return f"http://{self.host}:{self.port}"

    def replica_url(self, i: int) -> str:
        """Replica `i`'s own base URL (bypassing the proxy)."""
        return f"http://{self.host}:{self.replica_ports[i]}"

    def serve_command(self, i: int) -> list[str]:
        """The command line of replica `i`."""
        return [sys.executable, "-m", "agentmem.cli", "serve", "--port", str(self.replica_ports[i]),
                "--archive-url", self.archive_url, "--replica-id", f"r{i}", "--host", self.host, *self.serve_args]

    def nginx_config(self) -> NginxConfig:
        """The proxy's config over the replicas."""
        return NginxConfig(listen=f"{self.host}:{self.port}", upstreams=tuple(f"{self.host}:{p}" for p in self.replica_ports),
                           workdir=str(self.workdir))

    def _nginx(self) -> str:
        found = self.nginx_bin or shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if not found:
            raise ConfigError("nginx is not installed: run scripts/install_nginx.sh (Debian/Ubuntu: apt-get install nginx-light)")
        return found

    # ------------------------------------------------------------------ lifetime
    def start_replica(self, i: int, *, timeout_s: float = 180.0) -> None:
        """Start replica `i` (again) and wait for its `/health`."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"replica-{i}.log"
        with open(path, "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(self.serve_command(i), stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, **self.env})
        self.procs[i] = proc
        _wait_http(self.replica_url(i) + "/health", proc, timeout_s, f"replica {i}", path)
        logger.info("replica %d up on %s (pid %d)", i, self.replica_url(i), proc.pid)

    def start(self, *, timeout_s: float = 180.0) -> Cluster:
        """Start every replica, then nginx; returns self. A failure stops what was started."""
        nginx = self._nginx()
        try:
            for i in range(self.replicas):  # one after the other: model loads do not compete for 2 cores
                self.start_replica(i, timeout_s=timeout_s)
            conf = self.nginx_config().write()
            self.proxy = subprocess.Popen([nginx, "-c", str(conf.resolve()), "-p", str(self.workdir.resolve()),
                                           "-e", str((self.workdir / "error.log").resolve())],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _wait_http(self.url + "/health", self.proxy, 30.0, "nginx", self.workdir / "error.log")
        except BaseException:
            self.stop()
            raise
        logger.info("cluster up: %s over %d replica(s)", self.url, self.replicas)
        return self

    def kill(self, i: int) -> None:
        """SIGKILL replica `i` (a crash: nothing is stored, its leases run out)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def stop(self, *, grace_s: float = 30.0) -> None:
        """SIGTERM nginx and the replicas, SIGKILL what outlives `grace_s` (idempotent)."""
        running = [p for p in (self.proxy, *self.procs) if p is not None and p.poll() is None]
        for p in running:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in running:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("pid %d did not stop within %.0f s; killing it", p.pid, grace_s)
                p.kill()
                p.wait()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
