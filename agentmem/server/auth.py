"""API keys and what each may touch: admin keys see everything, a scoped key one agent-id prefix.

A key file is JSON or plain lines:

```text
# key            prefix (none = admin)
sk-admin-1
sk-tenant-a      tenant-a/
sk-tenant-b      tenant-b/
```

```json
{"keys": [{"key": "sk-admin-1", "admin": true},
          {"key": "sk-tenant-a", "prefix": "tenant-a/", "max_concurrent": 2,
           "max_agents": 50, "max_parked_bytes": 268435456}]}
```

(a bare JSON list of such objects works too). A key without a prefix is an admin key.
`max_concurrent`, `max_agents`, `max_parked_bytes` and `max_requests_per_minute` are the
key's quotas (`0` or absent: the server's defaults, `ServerSettings.max_*_per_key`; an admin key has no
agent or byte quota unless its entry sets one). Each scoped key's prefix is a tenant
of the pool (`PoolConfig.tenants`): its agents share KV with no other key's.
Keys are kept as SHA-256 digests and compared in constant time; a request presents one
as `Authorization: Bearer KEY` (what the OpenAI clients send) or `X-Api-Key: KEY`.

Without any key the server is open (it binds 127.0.0.1 by default) and every caller is
the one admin principal `local`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from agentmem.errors import ConfigError
from agentmem.pool.tenants import END_USER_MARK

__all__ = ["ADMIN_SPACE", "ApiKey", "KeyRing", "Principal", "end_user_space", "key_space", "load_keys_file"]

ADMIN_SPACE = "@admin/"
"""Where an admin key's anonymous conversations and per-key agent live (`@admin/<key name>/...`):
no scoped key's prefix may overlap it, so no tenant lists or continues them (#33 F5)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: a key's identity and scope.

    Attributes:
        name: a short, non-secret id of the key (`key-` and 8 hex digits of its
            digest), or `local` on a server without keys.
        prefix: agent ids this principal may use start with it (`""` = all).
        admin: may read metrics, list every agent, checkpoint the pool.
        max_concurrent: requests it may have in flight (`0` = the server's default).
        max_agents: agents under its prefix it may keep (`0` = the server's default;
            none for an admin key).
        max_parked_bytes: bytes of parked KV state its agents may keep (`0` = the
            server's default; none for an admin key).
        max_requests_per_minute: requests it may start per minute (`0` = the server's default).
    """

    name: str
    prefix: str = ""
    admin: bool = False
    max_concurrent: int = 0
    max_agents: int = 0
    max_parked_bytes: int = 0
    max_requests_per_minute: int = 0

    def allows(self, agent_id: str) -> bool:
        """Whether this principal may call, read, change or forget `agent_id`."""
        return self.admin or agent_id.startswith(self.prefix)


LOCAL = Principal("local", admin=True)
"""The principal of every request on a server without keys."""


def key_space(principal: Principal) -> str:
    """The agent-id prefix a key's anonymous conversations live under: a scoped key's prefix,
    `@admin/<key name>/` for an admin key (#33 F5), `""` on a server without keys.

    >>> key_space(Principal("key-1a2b3c4d", "team-a/")), key_space(Principal("key-5e6f7a8b", admin=True))
    ('team-a/', '@admin/key-5e6f7a8b/')
    """
    if principal.name == LOCAL.name:
        return ""
    return principal.prefix if not principal.admin else f"{ADMIN_SPACE}{principal.name}/"


def end_user_space(principal: Principal, end_user: str) -> str:
    """The agent-id prefix of one end user of a key (`--end-users`): `{key space}@u/<digest>/`, a tenant of
    its own (`agentmem.pool.tenants.END_USER_MARK`). The digest keeps the end user's id out of agent ids.

    >>> end_user_space(Principal("key-1a2b3c4d", "team-a/"), "alice@example.com")
    'team-a/@u/ff8d9819fc0e12bf/'
    """
    digest = hashlib.sha256(end_user.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{key_space(principal)}{END_USER_MARK}{digest}/"


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured key (the secret itself is only hashed)."""

    digest: bytes
    principal: Principal

    @classmethod
    def make(cls, key: str, *, prefix: str = "", admin: bool | None = None, max_concurrent: int = 0,
             max_agents: int = 0, max_parked_bytes: int = 0, max_requests_per_minute: int = 0) -> ApiKey:
        """A key with its scope and quotas; `admin` defaults to "no prefix".

        Raises:
            ConfigError: an empty key, a key with whitespace, a scoped admin key or a
                negative (or non-int) quota.
        """
        if not isinstance(key, str) or not key or any(c.isspace() for c in key):
            raise ConfigError("an API key must be a non-empty string without whitespace")
        if not isinstance(prefix, str):
            raise ConfigError(f"key prefix must be a string, got {prefix!r}")
        if admin is None:
            admin = not prefix
        if admin and prefix:
            raise ConfigError(f"an admin key cannot have an agent-id prefix (got {prefix!r})")
        if not admin and not prefix:
            raise ConfigError("a non-admin key needs an agent-id prefix")
        if prefix and (ADMIN_SPACE.startswith(prefix) or prefix.startswith(ADMIN_SPACE)):
            raise ConfigError(f"key prefix {prefix!r} overlaps {ADMIN_SPACE!r}, where admin keys' conversations live")
        quotas = {"max_concurrent": max_concurrent, "max_agents": max_agents, "max_parked_bytes": max_parked_bytes,
                  "max_requests_per_minute": max_requests_per_minute}
        for name, v in quotas.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} must be an int >= 0, got {v!r}")
        digest = hashlib.sha256(key.encode()).digest()
        return cls(digest, Principal(f"key-{digest.hex()[:8]}", prefix, admin, **quotas))


class KeyRing:
    """The configured keys; `authenticate` turns a presented key into a `Principal`.

    Args:
        keys: the keys; none makes an open server.
    """

    def __init__(self, keys: Iterable[ApiKey] = ()) -> None:
        self._keys = list(keys)
        digests = [k.digest for k in self._keys]
        if len(set(digests)) != len(digests):
            raise ConfigError("the same API key is configured twice")

    @property
    def enabled(self) -> bool:
        """Whether requests must present a key."""
        return bool(self._keys)

    def tenant_prefixes(self) -> tuple[str, ...]:
        """The scoped keys' prefixes, once each: the pool's tenants (an admin key is none)."""
        return tuple(dict.fromkeys(k.principal.prefix for k in self._keys if not k.principal.admin))

    def authenticate(self, presented: str | None) -> Principal | None:
        """The principal of `presented`; `LOCAL` without keys; `None` for a missing or wrong key."""
        if not self._keys:
            return LOCAL
        if not presented:
            return None
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for k in self._keys:  # compare with every key: the time does not say which one matched
            if hmac.compare_digest(k.digest, digest):
                found = k.principal
        return found

    @classmethod
    def build(cls, *, api_keys: Iterable[str] = (), keys_file: str | Path | None = None) -> KeyRing:
        """Admin keys from `api_keys` plus the keys of `keys_file` (see the module docstring)."""
        keys = [ApiKey.make(k) for k in api_keys]
        if keys_file is not None:
            keys += load_keys_file(keys_file)
        return cls(keys)


_QUOTAS = ("max_concurrent", "max_agents", "max_parked_bytes", "max_requests_per_minute")
_FIELDS = ("key", "prefix", "admin", *_QUOTAS)


def _entry(item: Any, where: str) -> ApiKey:
    if not isinstance(item, Mapping) or not isinstance(item.get("key"), str):
        raise ConfigError(f"{where}: each key must be an object with a string 'key'")
    extra = set(item) - set(_FIELDS)
    if extra:
        raise ConfigError(f"{where}: unknown field(s) {sorted(extra)}; allowed: {', '.join(sorted(_FIELDS))}")
    try:
        return ApiKey.make(item["key"], prefix=item.get("prefix", ""), admin=item.get("admin"),
                           **{q: item.get(q, 0) for q in _QUOTAS})
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def load_keys_file(path: str | Path) -> list[ApiKey]:
    """The keys of a JSON or line-format key file (see the module docstring).

    Raises:
        ConfigError: the file cannot be read or has a malformed entry (named by
            line or index, never by the secret).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"keys file {p}: cannot read it ({exc.strerror or exc})") from exc
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"keys file {p}: invalid JSON ({exc})") from exc
        items = data.get("keys") if isinstance(data, Mapping) else data
        if not isinstance(items, list):
            raise ConfigError(f"keys file {p}: expected a list of keys or {{'keys': [...]}}")
        return [_entry(x, f"keys file {p}, key #{i}") for i, x in enumerate(items)]
    keys = []
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2:
            raise ConfigError(f"keys file {p}, line {n}: expected 'KEY [PREFIX]', got {len(fields)} fields")
        try:
            keys.append(ApiKey.make(fields[0], prefix=fields[1] if len(fields) == 2 else ""))
        except ConfigError as exc:
            raise ConfigError(f"keys file {p}, line {n}: {exc}") from exc
    return keys
