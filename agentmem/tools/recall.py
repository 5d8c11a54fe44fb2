"""Pinned facts and recall of evicted text, as every integration's memory shows them to the model.

An agent with a token budget (`MemoryPool.set_budget`) keeps only part of its history in
the KV; the rest is evicted and archived, found by meaning and by keyword (`MemoryPool.recall`).
An integration's memory (AutoGen's `AgentMemMemory`, MAF's `AgentMemContextProvider`)
adds the facts it was given in one message that starts with `FACTS_HEADER` (the client
pins it in the KV: `pin_facts`), and the evicted spans the latest message asks about in
one that starts with `RECALL_HEADER` (`recall_spans`, `recall_block`). Over a `MemoryPool`
the memories recall through `agentmem.models.seats.recall_on`, on the agent's model under a seat.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Sequence

from agentmem.errors import AgentMemError

__all__ = [
    "CONTEXT_TOKENS", "FACTS_HEADER", "RECALL_HEADER", "facts_block", "is_memory_text", "pin_facts_sync",
    "recall_block", "recall_spans", "words",
]

logger = logging.getLogger(__name__)

FACTS_HEADER = "Pinned facts:"
"""First line of the block holding the facts (the clients pin the message that holds it)."""
RECALL_HEADER = "Recalled from earlier in this conversation (no longer in working memory):"
"""First line of a block of recalled evicted text."""
CONTEXT_TOKENS = 48
"""Tokens of history looked at on each side of a recalled span to complete its line."""

#: Lines of a chat template's markup left when its control tokens are dropped.
_ROLE_LINES = frozenset({"system", "user", "assistant", "tool", "model", "ipython"})
#: Words too common to make a span relevant (the FTS query ORs every word).
_COMMON = frozenset(
    "about also been could does from have into just like make many more most much must name only over "
    "said same says should some such tell than that their them then there these they this very want were "
    "what when where which while will with would your".split()
)


def words(text: str) -> set[str]:
    """The words of `text` that can make a span relevant: four letters or more, not common."""
    return {w for w in re.findall(r"\w+", text.lower()) if len(w) >= 4 and w not in _COMMON}


def is_memory_text(text: str) -> bool:
    """Whether `text` is a facts or recall block (a memory's own message, never searched for)."""
    return text.startswith((FACTS_HEADER, RECALL_HEADER))


def facts_block(facts: Sequence[str]) -> str:
    """The facts as one block (`""` for none)."""
    return FACTS_HEADER + "\n" + "\n".join(f"- {f}" for f in facts) if facts else ""


def recall_block(texts: Sequence[str]) -> str:
    """Recalled spans as one block (`""` for none)."""
    return RECALL_HEADER + "\n" + "\n".join(f"- {t}" for t in texts) if texts else ""


def recall_spans(pool: Any, agent_id: str, query: str, k: int) -> list[tuple[str, Any]]:
    """The `k` best evicted spans as `(text, span)`, each widened to the whole line(s) it cuts.

    Eviction removes token blocks, so a span may start or end inside a sentence (`"the
    vault pass"` | `"word is marmalade."`); the history tokens around it complete it up to
    the nearest line breaks (at most `CONTEXT_TOKENS` each side), without the template's
    role lines. When the pool recalls by meaning (`MemoryPool.recall_stats()` names an
    embedder and the mode is not `"keyword"`) its hits are kept as they rank: a
    paraphrased question shares no word with what it asks about, and the pool already
    drops spans too unlike the query. By keyword, a span counts only when it shares a
    word of four letters or more (not a common one) with the query — the full-text
    search ORs every word, so `"what is"` alone would match everything. Duplicates and
    the memory's own blocks are dropped.

    Args:
        pool: the `agentmem.MemoryPool`.
        agent_id: the agent whose archive is searched.
        query: the text to search for (the latest message).
        k: spans at most (`0`: none).
    """
    lease, model_of = getattr(pool, "lease", None), getattr(pool, "model_of", None)
    if callable(lease) and callable(model_of):  # the one pool: the work runs on the agent's model's engine
        with lease(model=model_of(agent_id)) as held:
            return _recall_spans(held.pool, agent_id, query, k)
    return _recall_spans(pool, agent_id, query, k)


def _recall_spans(pool: Any, agent_id: str, query: str, k: int) -> list[tuple[str, Any]]:
    wanted = words(query)
    if not wanted or k == 0:
        return []
    spans = pool.recall(agent_id, query, 4 * k)
    if not spans:
        return []
    stats = pool.recall_stats() if hasattr(pool, "recall_stats") else {}
    by_meaning = stats.get("embedder") is not None and stats.get("mode") != "keyword"
    hist = pool.history_tokens(agent_id)
    text = pool.model.detokenize
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for s in spans:
        left = text(hist[max(0, s.start - CONTEXT_TOKENS) : s.start])
        right = text(hist[s.end : s.end + CONTEXT_TOKENS])
        whole = left.rsplit("\n", 1)[-1] + text(hist[s.start : s.end]) + right.split("\n", 1)[0]
        lines = [ln.strip() for ln in whole.splitlines()]
        whole = "\n".join(ln for ln in lines if ln and ln.lower() not in _ROLE_LINES)
        if not whole or whole in seen or is_memory_text(whole) or not (by_meaning or wanted & words(whole)):
            continue
        seen.add(whole)
        out.append((whole, s))
        if len(out) == k:
            break
    return out


def pin_facts_sync(pool: Any, agent_id: str, messages: Sequence[Mapping[str, Any]]) -> None:
    """Pin the latest message holding a facts block in the agent's KV (and unpin older ones).

    A block counts at the start of a message or on a line of its own (MAF appends it to
    the agent's instructions). Call it after the call that sent `messages` finished.
    """
    idx = [i for i, m in enumerate(messages) if m.get("role") == "system" and _holds_facts(str(m.get("content", "")))]
    if not idx:
        return
    try:
        for i in idx[:-1]:
            pool.pin(agent_id, i, False)
        pool.pin(agent_id, idx[-1])
    except AgentMemError as exc:  # the call did not keep its messages (cancelled, trimmed)
        logger.debug("agent %r: facts message not pinned: %s", agent_id, exc)


def _holds_facts(content: str) -> bool:
    return content.startswith(FACTS_HEADER) or f"\n{FACTS_HEADER}\n" in content
