"""`NginxConfig`: an nginx config that routes each agent to one replica and fails over to the next.

Requests are routed by `hash $http_x_agent_id consistent` (ketama): an agent's
calls reach the replica that holds it, and adding or removing a replica moves only
its share of agents. When a replica refuses the connection, times out, or answers
502/503 (`agent_elsewhere`, shutting down), nginx passes the request to the next
replica (`proxy_next_upstream … non_idempotent`: chat calls are POSTs, and a call
that failed before its commit is safe to run again; the lease decides who serves
it). Streaming (SSE) is passed through unbuffered.

>>> cfg = NginxConfig(listen="127.0.0.1:8000", upstreams=("127.0.0.1:8001", "127.0.0.1:8002"), workdir="/tmp/am")
>>> text = cfg.render()
>>> "hash $http_x_agent_id consistent;" in text and "server 127.0.0.1:8002 max_fails=1 fail_timeout=5s;" in text
True
"""

from __future__ import annotations

import dataclasses
import getpass
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from agentmem.errors import ConfigError

__all__ = ["NginxConfig"]


@dataclass(frozen=True, kw_only=True)
class NginxConfig:
    """What the proxy needs; `render` writes the config text.

    Attributes:
        listen: `host:port` the proxy serves.
        upstreams: `host:port` of every `agentmem serve` replica.
        workdir: directory of the pid file, logs and temp files (the config is
            written there by `write`).
        max_fails, fail_timeout_s: a replica that failed `max_fails` times is skipped
            for `fail_timeout_s` (its agents go to the next one meanwhile).
        next_upstream_tries: replicas one request may try.
        read_timeout_s: longest silence of a replica within one response (a
            replica waiting for a killed one's lease to expire stays silent up to
            the lease TTL).
        max_body_bytes: largest request body (the replicas check their own limit too).
        access_log: write `access.log` in `workdir` (off by default: it costs time per request).
    """

    listen: str = "127.0.0.1:8000"
    upstreams: tuple[str, ...] = ()
    workdir: str = "."
    max_fails: int = 1
    fail_timeout_s: int = 5
    next_upstream_tries: int = 3
    read_timeout_s: int = 300
    max_body_bytes: int = 8 << 20
    access_log: bool = False

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ConfigError("upstreams must name at least one replica (host:port)")
        for addr in (self.listen, *self.upstreams):
            host, sep, port = str(addr).rpartition(":")
            if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ConfigError(f"upstreams/listen entries must be host:port, got {addr!r}")
        for name in ("max_fails", "fail_timeout_s", "next_upstream_tries", "read_timeout_s", "max_body_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-serializable)."""
        return {**dataclasses.asdict(self), "upstreams": list(self.upstreams)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NginxConfig:
        """Inverse of `to_dict`."""
        return cls(**{**data, "upstreams": tuple(data.get("upstreams", ()))})

    @property
    def path(self) -> Path:
        """Where `write` puts the config."""
        return Path(self.workdir) / "nginx.conf"

    def render(self) -> str:
        """The config text."""
        w = Path(self.workdir).resolve()
        servers = "\n".join(f"        server {u} max_fails={self.max_fails} fail_timeout={self.fail_timeout_s}s;"
                            for u in self.upstreams)
        user = f"user {getpass.getuser()};\n" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
        temps = "\n".join(f"    {k}_temp_path {w}/tmp/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        log = f"access_log {w}/access.log;" if self.access_log else "access_log off;"
        return f"""# written by agentmem.cluster.nginx (see docs/scale-out.md)
{user}worker_processes 1;
daemon off;
pid {w}/nginx.pid;
error_log {w}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    {log}
{temps}
    client_max_body_size {self.max_body_bytes};
    client_body_buffer_size {self.max_body_bytes};
    upstream agentmem {{
        hash $http_x_agent_id consistent;
{servers}
        keepalive 64;
    }}
    server {{
        listen {self.listen};
        location / {{
            proxy_pass http://agentmem;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_buffering off;
            proxy_request_buffering on;
            proxy_connect_timeout 2s;
            proxy_read_timeout {self.read_timeout_s}s;
            proxy_send_timeout {self.read_timeout_s}s;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_next_upstream_tries {self.next_upstream_tries};
        }}
    }}
}}
"""

    def write(self) -> Path:
        """Write the config (and the temp directories) into `workdir`; returns its path."""
        w = Path(self.workdir)
        for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (w / "tmp" / k).mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.render())
        return self.path
