"""The exception tree of agentmem.

Every error agentmem raises on purpose derives from `AgentMemError`, so an
application can catch the whole family with one `except`:

```text
    AgentMemError
    ├── ConfigError              a configuration value is invalid (names the field)
    │   └── GrammarLimitError    a schema or grammar is over a size, depth or count limit
    ├── ModelError               the model cannot be found, loaded or used
    │   ├── ModelNotFoundError   no model at the path / default model not installed
    │   ├── ChatTemplateError    the model's chat template does not compile, breaks the
    │   │                        sandbox or a render limit, or fails
    │   ├── UnknownModelError    a model pool was asked for a model it does not hold
    │   ├── ModelMismatchError   an agent's KV belongs to another model than the one asked for
    │   └── ModelBudgetError     a model cannot be loaded: the budget is held by models in use
    ├── MessageError             a chat message is malformed (names the field)
    ├── ContextOverflowError     a prompt does not fit the agent's context
    ├── PoolClosedError          the pool is closed or closing (a call in flight when it closed)
    ├── CallCancelledError       the caller cancelled the call (`ChatStream.cancel`, a client gone)
    ├── EngineError              a llama.cpp call failed (names the call and code)
    │   └── ImportOrderError     numpy was imported before agentmem, and on this GPU build a
    │                            model load would crash (names the fix)
    ├── StateError               a KV state cannot be stored or restored
    │   ├── CodecError           a state blob cannot be parsed / encoded / decoded
    │   └── FingerprintMismatch  a stored state belongs to another model/config
    ├── ArchiveError             the archive is unusable (names the file or the redacted URL)
    │   ├── ArchiveFullError     the archive's disk (or database) is full: nothing was written,
    │   │                        what was stored before is intact; retry once space is freed
    │   └── LeaseError           an agent's lease cannot be taken or used
    │       ├── LeaseHeldError   another owner holds an unexpired lease on the agent
    │       └── LeaseLostError   a fenced write's lease is no longer current (nothing written)
    ├── UnknownAgentError        an operation names an agent the pool does not know
    ├── AgentBusyError           an operation needs an agent that a call (or a pin) holds now; retry
    └── PolicyError              an unknown policy / codec name (lists the valid ones)
```

Errors a caller may treat as a *cache miss* (the pool itself does): `StateError`
and its children. The pool falls back to re-prefilling from the ledger when one
of them occurs during a restore, logs a warning and counts it in `stats()`.

`ValueError`/`TypeError` compatibility: `ConfigError`, `MessageError` and
`PolicyError` also derive from `ValueError` so code written against plain
Python conventions keeps working.
"""

from __future__ import annotations

__all__ = [
    "AgentBusyError",
    "AgentMemError",
    "ArchiveError",
    "ArchiveFullError",
    "CallCancelledError",
    "ChatTemplateError",
    "CodecError",
    "ConfigError",
    "ContextOverflowError",
    "EngineError",
    "FingerprintMismatch",
    "GrammarLimitError",
    "ImportOrderError",
    "LeaseError",
    "LeaseHeldError",
    "LeaseLostError",
    "MessageError",
    "ModelBudgetError",
    "ModelError",
    "ModelMismatchError",
    "ModelNotFoundError",
    "PolicyError",
    "PoolClosedError",
    "StateError",
    "UnknownAgentError",
    "UnknownModelError",
]


class AgentMemError(Exception):
    """Root of every error agentmem raises on purpose."""


class ConfigError(AgentMemError, ValueError):
    """A configuration value is invalid; the message names the field."""


class GrammarLimitError(ConfigError):
    """A JSON schema, tool definition or GBNF grammar is over one of the limits of
    `agentmem.tools.limits` (size, nesting depth, a repetition count, grammar size).

    Attributes:
        field: where, as a path into the request or the call (`response_format.json_schema.schema.maxLength`,
            `tools[0].function.parameters.properties.q`, `grammar`).
    """

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class ModelError(AgentMemError):
    """The model cannot be loaded or used."""


class ModelNotFoundError(ModelError, FileNotFoundError):
    """No model file was found; the message says how to install or point to one."""


class ChatTemplateError(ModelError):
    """The model's chat template cannot be used: it does not compile, it tried an unsafe
    operation, it exceeded a render limit (time, output size) or it failed; the cause is
    chained. A template that refuses the messages through `raise_exception` raises
    `MessageError` instead."""


class UnknownModelError(ModelError, KeyError):
    """A `MemoryPool` was asked for a model name it does not hold; the message lists the names."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class ModelMismatchError(ModelError):
    """An agent is bound to one model and a call, handoff or restore named another.

    An agent's KV (live, parked, archived, shared blocks) belongs to the model that
    computed it; it is never restored into another model.

    Attributes:
        agent_id: the agent.
        bound: the model it is bound to.
        asked: the model the call named.
    """

    def __init__(self, message: str, *, agent_id: str, bound: str, asked: str) -> None:
        super().__init__(message)
        self.agent_id, self.bound, self.asked = agent_id, bound, asked


class ModelBudgetError(ModelError):
    """A model does not fit the memory budget and every model that could make room is in use."""


class MessageError(AgentMemError, ValueError):
    """A chat message is malformed; the message names the offending field."""


class ContextOverflowError(AgentMemError):
    """A prompt does not fit into the agent's context capacity.

    Attributes:
        n_tokens: tokens the prompt needs.
        capacity: tokens the agent may hold.
    """

    def __init__(self, message: str, *, n_tokens: int, capacity: int) -> None:
        super().__init__(message)
        self.n_tokens = n_tokens
        self.capacity = capacity


class PoolClosedError(AgentMemError):
    """The pool is closed, or closing: new calls are refused, calls in flight stop at their
    next prefill chunk or decode step (`MemoryPool.close`)."""


class CallCancelledError(AgentMemError):
    """The call was cancelled (`ChatStream.cancel`, or a server client that disconnected); it
    stopped at its next prefill chunk or decode step and the agent keeps what it decoded."""


class EngineError(AgentMemError):
    """A llama.cpp call failed; the message names the call and its return code."""


class ImportOrderError(EngineError):
    """numpy (pandas, torch...) was imported before agentmem, and on this GPU build of
    llama-cpp-python a model load in that order crashes (llama-cpp-python #1581); the message
    names the fix: import agentmem first. See `agentmem.engine.native_first`."""


class StateError(AgentMemError):
    """A KV state could not be captured, stored or restored (a cache miss)."""


class CodecError(StateError):
    """A state blob could not be parsed, encoded, verified or decoded."""


class FingerprintMismatch(StateError):
    """A stored state was produced by another model or cache configuration."""


class ArchiveError(AgentMemError):
    """The archive cannot be opened or used; the message names the file (or the URL, password redacted)."""


class ArchiveFullError(ArchiveError):
    """The archive's storage is full (`SQLITE_FULL`, `ENOSPC`, PostgreSQL's `disk_full`).

    The write that hit it was rolled back: what the archive held before is intact and
    readable, and the pool keeps the agent in RAM. A later write succeeds once space is freed.
    """


class LeaseError(ArchiveError):
    """An agent's lease cannot be acquired, renewed or used."""


class LeaseHeldError(LeaseError):
    """Another owner holds an unexpired lease on the agent.

    Attributes:
        agent_id: the agent.
        owner: who holds the lease.
        expires_in_s: seconds until it lapses unless renewed (by the archive's clock).
    """

    def __init__(self, message: str, *, agent_id: str, owner: str, expires_in_s: float) -> None:
        super().__init__(message)
        self.agent_id = agent_id
        self.owner = owner
        self.expires_in_s = expires_in_s


class LeaseLostError(LeaseError):
    """The lease used as a fence (or renewed) is no longer the agent's current one: another
    owner took it over, or it was released. The write it guarded wrote nothing."""


class UnknownAgentError(AgentMemError, KeyError):
    """An operation named an agent that the pool does not know.

    Attributes:
        agent_id: the id asked for (`None` when not given): a server answers with it
            alone, so the body never depends on which other agents exist.
    """

    def __init__(self, *args: object, agent_id: str | None = None) -> None:
        super().__init__(*args)
        self.agent_id = agent_id

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class AgentBusyError(AgentMemError):
    """An operation (forget, park, handoff, reload) needs an agent that is held right now.

    The message says what holds it: `is generating` (a call runs on it) or `is pinned`
    (another operation needs it kept in place, such as a handoff from it). Nothing was
    changed; retry once it is free. A server answers 409 `agent_busy`.
    """


class PolicyError(AgentMemError, ValueError):
    """An unknown policy or codec name; the message lists the valid names."""
