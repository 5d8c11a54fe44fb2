"""Conversation lines: which kept state a prompt continues, when the caller names no agent.

A client that sends no agent id (most OpenAI clients' default set-up) still sends
the whole history on every call. `MemoryPool.find_line` finds the agent whose kept
history that prompt *continues* — live, parked (any codec) or archived — and the
call then runs as that agent, reading its KV; a prompt that continues none gets a
new agent with a fresh random id (`{scope}conv-<16 hex digits>`), which still starts from the
longest prefix another agent of its tenant holds (`agentmem.pool.sharing`).

**The same line.** An agent's *line key* is its history up to the end of the last
user, tool or raw-text message (`line_marks`): everything but its last reply and
the generation prompt before it. A prompt continues the agent when

1. the agent's line key is a prefix of the prompt's tokens (so the system prompt
   alone, or a shared brief, never joins two conversations: the key always holds at
   least one user/tool message), and
2. the prompt goes past the agent's last prompt (its key plus that generation
   prompt): a prompt that only repeats the last prompt (a retry, a second sample,
   another user who opened with the same words) **branches** instead of overwriting
   the reply kept there.

**Ties.** Of the agents whose key is a prefix of the prompt, the deepest key wins
(the longest match). Among agents with that same key, the one whose whole history
(its last reply included) matches the prompt longest wins, then the most recently
used, then the smallest id. Only the deepest level counts: when none there may be
continued (rule 2, or rule 3 below) the prompt branches.

**Concurrency.** `find_line` *claims* what it returns until `release_line` (the
server releases it when the request ends). A line whose agent is claimed or generating
is not joined: the second request **branches** at once (a new agent that starts from
the prefix an idle agent of the tenant holds, or prefills), rather than waiting for a
reply it could not have seen. Two identical first prompts in flight get two agents (each new
id is random; one already used or claimed would get a `-2`, `-3`, ... suffix).

**Branches.** A prompt that shares a prefix with a line but leaves it before the line's
key ends (tools dropped, a side question, an earlier turn edited) is a new agent;
sharing copies the common prefix's cells from the line (`seq_cp`, no recompute) and
the line stays as it was, parked, budgeted and evicted like any state. A later prompt
that continues the old line finds it again by rule 1. (A call that *names* its agent
is not looked up: it reconciles that agent's KV to its prompt, dropping what diverges.)

**Scope.** Lookups are per tenant (`agentmem.pool.tenants`): `scope` is the caller's
agent-id prefix (a server key's prefix); only agents of the tenant of `scope + "x"`
that start with `scope` are candidates. Declared shares are never lines.

**Cost.** `LineIndex` keeps one `PrefixIndex` (a radix tree over line keys) per
tenant. Calls, handoffs, archive loads and forgets mark agents dirty (`touch`, `drop`);
a lookup re-indexes only those, then walks the prompt's path once
(`PrefixIndex.prefixes_of`): flat in the number of kept states.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

import agentmem.validation as check
from agentmem.engine.chat_format import REGIONS, Message
from agentmem.errors import ConfigError
from agentmem.memory.ledger import Ledger
from agentmem.memory.shared import SHARE_PREFIX, PrefixIndex

if TYPE_CHECKING:
    from agentmem.engine.renderer import ChatRenderer
    from agentmem.pool.tenants import TenantScope

PoolCore = Any  # the pool's `agentmem.pool.state.PoolCore` (not imported: state.py imports this module)

__all__ = ["LINE_REGIONS", "Line", "LineIndex", "LineMethods", "line_marks"]

#: regions of the messages a line key ends with (what a caller sends; never the model's reply)
LINE_REGIONS = frozenset({"user", "tool_result", "text"})
_IS_LINE = np.array([r in LINE_REGIONS for r in REGIONS] + [False] * (256 - len(REGIONS)))  # by region code
_TAIL = 256  # tokens `line_marks` reads first, from the end (then four times more, and so on)


@dataclass(frozen=True, slots=True)
class Line:
    """What `MemoryPool.find_line` decided for a prompt.

    Attributes:
        agent_id: the agent to call (an existing one when `kind == "continued"`, else a new random id).
        kind: `"continued"` (the prompt continues `agent_id`'s kept history), `"branched"`
            (a new agent whose prompt shares at least `min_share_tokens` tokens with a kept line of
            the scope) or `"new"`.
        matched: prompt tokens the chosen agent's history already holds (`continued`), or the longest
            prefix a line of the scope shares with the prompt (`branched`, `new`).
    """

    agent_id: str
    kind: Literal["continued", "branched", "new"]
    matched: int


def line_marks(ledger: Ledger) -> tuple[int, int] | None:
    """`(key_end, prompt_end)` of a history, or None when it has no user/tool/text message.

    `key_end`: the end of the last message in `LINE_REGIONS`; `prompt_end`: that plus the
    template's generation prompt right after it (the tokens before the reply). Read from the
    ledger's arrays (no span objects built: a call's lookup re-indexes its agent), from the
    end back in growing windows, so a history's length does not make it slower.
    """
    n = len(ledger)
    if n == 0:
        return None
    reg, msg = ledger.regions, ledger.messages
    hi, width, last = n, _TAIL, -1
    while hi > 0 and last < 0:  # from the end back: a history's last user message is near its end
        lo = max(0, hi - width)
        hits = np.flatnonzero((msg[lo:hi] >= 0) & _IS_LINE[reg[lo:hi]])
        last = lo + int(hits[-1]) if hits.size else -1
        hi, width = lo, width * 4
    if last < 0:
        return None
    end = last + 1  # the last such token ends its span: a token after it in the span would be one too
    if end == n or msg[end] != -1:
        return end, end
    pin = ledger.pinned
    differs = np.flatnonzero((reg[end:] != reg[end]) | (msg[end:] != -1) | (pin[end:] != pin[end]))
    return end, end + (int(differs[0]) if differs.size else n - end)


class LineIndex:
    """Per-tenant radix trees over the agents' line keys, synced from dirty marks (see the module docstring)."""

    def __init__(self) -> None:
        self._trees: dict[str, PrefixIndex] = {}
        self._tenant: dict[str, str] = {}  # agent -> the tenant whose tree holds it
        self._marks: dict[str, tuple[int, int]] = {}
        self._dirty: set[str] = set()
        self._scope: TenantScope | None = None  # the scope the trees were built under (None: build on first use)
        self.claims: set[str] = set()

    def touch(self, agent_id: str) -> None:
        """`agent_id`'s history may have changed: re-index it at the next lookup."""
        self._dirty.add(agent_id)

    def drop(self, agent_id: str) -> None:
        """`agent_id` is gone (forgotten, discarded)."""
        self._dirty.discard(agent_id)
        self._marks.pop(agent_id, None)
        t = self._tenant.pop(agent_id, None)
        if t is not None:
            self._trees[t].remove(agent_id)

    @property
    def visited(self) -> int:
        """Tree nodes the last lookup walked (its cost)."""
        return max((t.visited for t in self._trees.values()), default=0)

    def refresh(self, core: PoolCore) -> None:
        """Re-index the dirty agents (every agent once, and again after the tenants change)."""
        if core.tenants is not self._scope:
            self._trees.clear()
            self._tenant.clear()
            self._marks.clear()
            self._dirty = set(core.agents)
            self._scope = core.tenants
        dirty, self._dirty = self._dirty, set()
        for aid in dirty:
            self._sync(core, aid)

    def _sync(self, core: PoolCore, aid: str) -> None:
        a = core.agents.get(aid)
        marks = None
        if a is not None and not aid.startswith(SHARE_PREFIX) and (a.seq is not None or a.tier in core.tiers):
            marks = line_marks(a.ledger)
        self.drop(aid)
        if marks is None or a is None:
            return
        t = core.tenants.of(aid)
        self._trees.setdefault(t, PrefixIndex()).sync(aid, a.ledger.tokens[: marks[0]], version=a.ledger.version)
        self._tenant[aid] = t
        self._marks[aid] = marks

    def find(self, core: PoolCore, tokens: Sequence[int], scope: str, *, claim: bool = True) -> Line:
        """The line `tokens` continues in `scope`, or a new agent id (lock held)."""
        self.refresh(core)
        toks = np.asarray(tokens, dtype=np.int32)
        tree = self._trees.get(core.tenants.of(scope + "x"))
        found, depth = tree.prefixes_of(toks) if tree is not None else ([], 0)
        if found:
            best = self._pick(core, toks, scope, found[0][1])
            if best is not None:
                if claim:
                    self.claims.add(best[0])
                return Line(best[0], "continued", best[1])
        n_min = core.config.min_share_tokens
        line = Line(self._new_id(core, scope), "branched" if n_min and depth >= n_min else "new", depth)
        if claim:
            self.claims.add(line.agent_id)
        return line

    def _pick(self, core: PoolCore, toks: np.ndarray, scope: str, ids: Iterable[str]) -> tuple[str, int] | None:
        """The agent to continue among those with the deepest key (the tie rules); None: branch."""
        best: tuple[int, float, str] | None = None
        for aid in ids:
            a = core.agents.get(aid)
            if a is None or not aid.startswith(scope) or a.held or aid in self.claims:
                continue
            key_end, prompt_end = self._marks[aid]
            if len(toks) <= prompt_end:
                continue  # only repeats its last prompt: branch, keep its reply
            n = a.ledger.common_prefix(toks)
            if n < key_end:  # indexed from an older history: re-index at the next lookup
                self._dirty.add(aid)
                continue
            rank = (n, a.last_used, aid)
            if best is None or (rank[0], rank[1]) > (best[0], best[1]) or (rank[:2] == best[:2] and aid < best[2]):
                best = rank
        return None if best is None else (best[2], best[0])

    def _new_id(self, core: PoolCore, scope: str) -> str:
        # random, not a hash of the prompt: equal suffixes across tenants said who sent the same prompt (#33 M2)
        base = f"{scope}conv-{secrets.token_hex(8)}"
        aid, n = base, 1
        while aid in core.agents or aid in self.claims:
            n += 1
            aid = f"{base}-{n}"
        return check.agent_id(aid, field="scope")


class LineMethods:
    """`MemoryPool.find_line` and `release_line` (mixed into the facade; it provides `_core`, `renderer`)."""

    _core: PoolCore
    renderer: ChatRenderer
    _check_open: Callable[[], None]  # the facade's method

    def find_line(
        self, messages: Iterable[Mapping[str, Any] | Message] | None = None, *, prompt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None, scope: str = "", claim: bool = True,
    ) -> Line:
        """The agent a call without an agent id should run as (see `agentmem.pool.lines`).

        Pass the chat `messages` (and the `tools` the call will show, which are part of its
        prompt), or a raw completion `prompt`. `scope`: the caller's agent-id prefix (its
        tenant's lines only). With `claim` (the default) the returned agent is reserved until
        `release_line`: a concurrent lookup branches instead of joining it.

        >>> line = pool.find_line(history, scope="team-a/")    # doctest: +SKIP
        >>> try:                                               # doctest: +SKIP
        ...     r = pool.chat(line.agent_id, history)
        ... finally:
        ...     pool.release_line(line.agent_id)

        Raises:
            MessageError: a malformed message.
            ConfigError: neither or both of `messages` and `prompt`, or a bad `scope`.
        """
        self._check_open()
        if (messages is None) == (prompt is None):
            raise ConfigError("find_line needs either messages or prompt")
        if not isinstance(scope, str):
            raise ConfigError(f"scope must be a string, got {type(scope).__name__}")
        if prompt is not None:
            rendered = self.renderer.render_text(check.text(prompt, field="prompt"))
        else:
            rendered = self.renderer.render(check.message_list(messages), tools=tools)
        core = self._core
        with core.lock:
            return core.lines.find(core, rendered.ids, scope, claim=claim)

    def release_line(self, agent_id: str) -> None:
        """End the claim `find_line` took on `agent_id` (no-op when there is none).

        Takes no lock (one set operation), so an event loop may call it while a call decodes.
        """
        self._core.lines.claims.discard(agent_id)
