"""Typed, serializable settings of `agentmem serve` (everything but the pool's own `PoolConfig`).

>>> s = ServerSettings(port=8080, max_prompt_tokens=4096)
>>> ServerSettings.from_dict(s.to_dict()) == s
True
>>> ServerSettings(port=0)
Traceback (most recent call last):
...
agentmem.errors.ConfigError: port must be in [1, 65535], got 0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from agentmem.errors import ConfigError

__all__ = ["ANONYMOUS_POLICIES", "ServerSettings"]

ANONYMOUS_POLICIES = ("lines", "reject", "per-key")
"""What a request that names no agent gets: `lines` (the default: the kept conversation
its prompt continues, or a new one, within the key's scope: `agentmem.pool.lines`),
`reject` (a 400 `missing_agent_id`) or `per-key` (one anonymous agent per API key, or
one for the whole server without keys)."""


#: When agents are written to the archive (see `ServerSettings.durability`).
DURABILITY = ("exit", "call", "lazy")

#: How replies are generated (`agentmem.calls.strategy.STRATEGIES`; see `ServerSettings.decode_strategy`).
DECODE_STRATEGIES = ("lazy", "free_then_forced")


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """How the HTTP server behaves. Every field is keyword-only and JSON-friendly.

    Attributes:
        host: interface to bind; the default serves this machine only.
        port: TCP port.
        model_name: the model id `/v1/models` lists and responses carry (`None` = the
            GGUF file's stem). Requests may name any model: there is one.
        anonymous: `lines` (default), `reject` or `per-key`; see `ANONYMOUS_POLICIES`.
        max_body_bytes: largest request body; a larger one gets 413.
        max_prompt_tokens: largest rendered prompt of one call (`0` = the pool's agent
            capacity decides, with a 400 `context_length_exceeded`); a larger one gets 413.
        max_tokens_limit: largest `max_tokens` a request may ask for.
        default_max_tokens: `max_tokens` of a request that sets none.
        max_concurrent_per_key: requests one API key (or, without keys, the whole server)
            may have in flight; one more gets 429 at once.
        max_requests_per_minute_per_key: requests one key may start per minute (`0` = no
            limit, the default); a token bucket of that size, refilled evenly; one more gets
            429 with `Retry-After`, before any work. A key's own value overrides it.
        max_agents_per_key: agents one scoped API key may keep (`0` = no limit); a call
            that would start one more gets 429 `quota_exceeded` (param `max_agents`).
            A key's own `max_agents` overrides it; admin keys have none unless set.
        max_parked_bytes_per_key: bytes of parked KV state (WARM and COLD) one scoped
            key's agents may keep (`0` = no limit); at or over it every call of the key
            gets 429 `quota_exceeded` (param `max_parked_bytes`) until it forgets agents.
        shutdown_grace_s: on SIGTERM, seconds in-flight requests get to finish before
            they are cancelled; then the pool closes (and checkpoints to its archive).
        metrics_public: serve `/metrics` to any key (default: admin keys only when keys
            are configured; without keys `/metrics` is always open).
        durability: `exit` (default): agents reach the archive when demoted, on
            `checkpoint` and at shutdown; a SIGKILL loses what changed since. `call`:
            every call's agent (ledger and KV state) is committed to the archive before
            its response ends, so a SIGKILL loses nothing that was answered. `lazy`
            (cluster mode only): the ledger after every call, the KV state when the agent
            is parked, goes idle (its lease is released) or the server stops.
        cluster: one replica of several sharing an archive (`--archive-url`): an agent
            is served only under its lease, and its writes are fenced by it; durability
            must be `call` or `lazy`.
        replica_id: this replica's lease owner name (`""`: `host:pid` at start).
        lease_ttl_s: lease length; renewed every third of it while the agent is in use,
            released after as long without a call. A killed replica's agents move after
            at most this long.
        decode_strategy: how a reply is generated (`agentmem.calls.strategy`): `lazy`
            (default: a free tool turn decodes once, under a lazy call grammar) or
            `free_then_forced` (free, then once more forced when the reply was a broken call).
        max_input_items: most messages (chat, Messages, Ollama) or `input` items (Responses)
            one request may carry; more is a 413 naming the field, before any conversion.
        max_lines_per_key: anonymous conversations (lines and branches: agents the server
            named `{scope}conv-...`) one key keeps, on a server with keys or without (`0` =
            no cap): a new one past it forgets the least recently used idle one.
        line_park_s: an anonymous conversation idle this long is parked (to the archive's cold
            tier when there is one; `0` = never, the pool's own budget still parks it).
        line_idle_s: an anonymous conversation idle this long is forgotten (`0` = never).
            Named agents are never forgotten by the server (`DELETE /agents/{id}` does).
        end_users: partition each key by end user (the `X-End-User` header, else the OpenAI
            `user` field, Anthropic's `metadata.user_id`): lines, prefix sharing and
            `cached_tokens` stay inside one end user. With it on, `user` names the end user,
            not the agent (name agents with `X-Agent-Id` or `agent_id`).
        api_docs: serve `/docs` and `/openapi.json` (default off: they describe the server to
            anyone who can reach it, and need no key).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None
    anonymous: str = "lines"
    max_body_bytes: int = 4 << 20
    max_prompt_tokens: int = 0
    max_tokens_limit: int = 4096
    default_max_tokens: int = 256
    max_concurrent_per_key: int = 8
    max_requests_per_minute_per_key: int = 0
    max_agents_per_key: int = 256
    max_parked_bytes_per_key: int = 1 << 30
    shutdown_grace_s: float = 10.0
    metrics_public: bool = False
    durability: str = "exit"
    cluster: bool = False
    replica_id: str = ""
    lease_ttl_s: float = 10.0
    decode_strategy: str = "lazy"
    max_input_items: int = 4096
    max_lines_per_key: int = 64
    line_park_s: float = 300.0
    line_idle_s: float = 3600.0
    end_users: bool = False
    api_docs: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host must be a non-empty string, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise ConfigError(f"port must be in [1, 65535], got {self.port!r}")
        if self.anonymous not in ANONYMOUS_POLICIES:
            raise ConfigError(f"anonymous must be one of {', '.join(ANONYMOUS_POLICIES)}, got {self.anonymous!r}")
        for name in ("max_body_bytes", "max_tokens_limit", "default_max_tokens", "max_concurrent_per_key",
                     "max_input_items"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}")
        for name in ("max_prompt_tokens", "max_agents_per_key", "max_parked_bytes_per_key", "max_lines_per_key",
                     "max_requests_per_minute_per_key"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} must be an int >= 0, got {v!r}")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ConfigError(
                f"default_max_tokens ({self.default_max_tokens}) must be <= max_tokens_limit ({self.max_tokens_limit})"
            )
        if self.durability not in DURABILITY:
            raise ConfigError(f"durability must be one of {', '.join(DURABILITY)}, got {self.durability!r}")
        if self.cluster and self.durability == "exit":
            raise ConfigError("durability must be call or lazy in cluster mode (--archive-url), got 'exit'")
        if not self.cluster and self.durability == "lazy":
            raise ConfigError("durability lazy needs cluster mode (--archive-url)")
        if not isinstance(self.replica_id, str):
            raise ConfigError(f"replica_id must be a string, got {self.replica_id!r}")
        if isinstance(self.lease_ttl_s, bool) or not isinstance(self.lease_ttl_s, (int, float)) or self.lease_ttl_s < 1:
            raise ConfigError(f"lease_ttl_s must be a number >= 1, got {self.lease_ttl_s!r}")
        if self.decode_strategy not in DECODE_STRATEGIES:
            raise ConfigError(f"decode_strategy must be one of {', '.join(DECODE_STRATEGIES)}, got {self.decode_strategy!r}")
        for name in ("shutdown_grace_s", "line_park_s", "line_idle_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {v!r}")
        for name in ("end_users", "api_docs", "metrics_public"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-serializable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerSettings:
        """Inverse of `to_dict`; an unknown key is a `ConfigError` listing the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown server setting(s) {unknown}; valid: {', '.join(sorted(names))}")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> ServerSettings:
        """A copy with some fields changed (validated)."""
        return ServerSettings.from_dict({**self.to_dict(), **changes})
