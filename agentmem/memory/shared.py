"""Shared prefixes and agent-to-agent handoff.

Agents of one app start from the same tokens (a team brief, the user's task, a
shared document). In the unified KV cache one set of cells can belong to many
sequences: `seq_cp` only adds a sequence tag, so a prefix decoded once is
*shared*, not copied, and each agent's later tokens diverge copy-on-write.

* `PrefixIndex` — a radix tree over the agents' shareable token
  sequences (their ledgers up to the first evicted token), refreshed lazily by
  ledger version: which agents share the longest prefix with a prompt.
  `longest_shared_prefix` is the same question as a plain scan (kept as
  the reference the tree is tested against).
* `HandoffCard` — the descriptor of a handoff (`pool.handoff`): what
  was handed over, at which positions, for which model, with a checksum of the
  token ids, a sequence number and the shared block both agents reference.
* `KVBlock` / `BlockStore` — a shared prefix's cells kept once
  (reference-counted) for every parked agent that starts with it;
  `agentmem.codec.split_state` cuts an agent's state blob into its private part
  and an order array, `agentmem.codec.join_state` rebuilds it byte for byte.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from agentmem.memory.ledger import Ledger

__all__ = [
    "SHARE_PREFIX",
    "BlockStore",
    "HandoffCard",
    "KVBlock",
    "PrefixIndex",
    "longest_shared_prefix",
    "token_checksum",
]

#: agent-id prefix of declared shares (`pool.share(name, ...)` → `"share:" + name`)
SHARE_PREFIX = "share:"


def token_checksum(tokens: np.ndarray) -> str:
    """A short checksum of token ids (int32 little-endian)."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes()).hexdigest()[:16]


def longest_shared_prefix(tokens: np.ndarray, candidates: Iterable[tuple[str, Ledger]]) -> tuple[str | None, int]:
    """The candidate whose *live* ledger prefix matches `tokens` longest.

    Only a prefix whose tokens are all live (no eviction inside it) can be shared,
    because its KV positions must equal its token positions.

    >>> a, b = Ledger(), Ledger()
    >>> a.extend([1, 2, 3, 4], region="system"); b.extend([1, 2, 9], region="system")
    >>> longest_shared_prefix(np.array([1, 2, 3, 7]), [("a", a), ("b", b)])
    ('a', 3)
    """
    best, best_n = None, 0
    for agent_id, led in candidates:
        n = led.common_prefix(tokens)
        if n <= best_n:
            continue
        live = led.live
        if not live[:n].all():
            n = int(np.argmin(live[:n]))  # the prefix before the first evicted token
        if n > best_n:
            best, best_n = agent_id, n
    return best, best_n


@dataclass(frozen=True, slots=True)
class HandoffCard:
    """What `pool.handoff(src, dst)` gave the destination.

    Attributes:
        src: the agent handed from.
        dst: the agent handed to.
        seq_no: the pool's running handoff number.
        n_tokens: history tokens handed over (the destination's ledger length).
        n_live: KV cells handed over (positions `0..n_live-1`).
        mode: `"shared"` (cells tagged for both, no copy: the source was live),
            `"copied"` (the live source's state copied: per-sequence KV streams share
            no cells) or `"restored"` (the source's parked state loaded into the destination).
        fingerprint: model fingerprint both agents' KV belongs to.
        checksum: checksum of the handed token ids (see `token_checksum`).
        block: the shared KV block both now reference (positions
            `0..block_tokens-1`), or `None` when the handed span is not
            kept as one (evicted tokens inside it); parked copies of either
            agent then store only their cells after it (the private fragment).
        block_tokens: cells in `block`.
        created: Unix time.
    """

    src: str
    dst: str
    seq_no: int
    n_tokens: int
    n_live: int
    mode: str
    fingerprint: str
    checksum: str
    block: str | None = None
    block_tokens: int = 0
    created: float = field(default_factory=time.time)

    @property
    def private_tokens(self) -> int:
        """Cells handed over beyond the shared block (the private fragment a parked copy stores)."""
        return self.n_live - self.block_tokens if self.block is not None else self.n_live

    def verify(self, ledger_tokens: np.ndarray) -> bool:
        """True when `ledger_tokens[:n_tokens]` still carries this card's checksum."""
        return len(ledger_tokens) >= self.n_tokens and token_checksum(ledger_tokens[: self.n_tokens]) == self.checksum


# --------------------------------------------------------------------------- shared KV blocks


@dataclass(eq=False, slots=True)
class KVBlock:
    """A shared prefix's KV cells, kept once for every agent that references it.

    Attributes:
        id: block id (`"blk-<n>-<token checksum>-<serial>"`).
        n_tokens: cells at positions `0..n_tokens-1` (the prefix).
        checksum: `token_checksum` of the prefix's tokens.
        data: the cells as an f16 sequence-state blob, or `None` while only the
            archive holds it (no agent that needs it is in RAM).
        nbytes: length of the blob.
        refs: agents whose KV starts with these cells (live or parked).
        archived: the archive holds a copy (`shared_blocks` table).
    """

    id: str
    n_tokens: int
    checksum: str
    data: np.ndarray | None
    nbytes: int
    refs: set[str] = field(default_factory=set)
    archived: bool = False


class BlockStore:
    """Reference-counted shared KV blocks (RAM side; the archive keeps its own counts).

    >>> store = BlockStore()
    >>> b = store.create(np.arange(4), np.zeros(10, np.uint8))
    >>> store.acquire(b.id, "a"); store.acquire(b.id, "b"); store.release(b.id, "a")
    False
    >>> store.release(b.id, "b"), len(store)
    (True, 0)
    """

    def __init__(self) -> None:
        self._blocks: dict[str, KVBlock] = {}
        self._serial = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator[KVBlock]:
        return iter(list(self._blocks.values()))

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._blocks

    def get(self, block_id: str) -> KVBlock | None:
        """The block, or `None` (freed or never created)."""
        return self._blocks.get(block_id)

    def create(self, tokens: np.ndarray, blob: np.ndarray) -> KVBlock:
        """A new block of `tokens`' cells (`blob`: their f16 state); no references yet."""
        self._serial += 1
        ck = token_checksum(tokens)
        bid = f"blk-{len(tokens)}-{ck}-{self._serial}"
        b = self._blocks[bid] = KVBlock(bid, len(tokens), ck, blob, int(blob.nbytes))
        return b

    def register(self, block: KVBlock) -> KVBlock:
        """Adopt a block known from elsewhere (the archive on resume)."""
        self._blocks[block.id] = block
        return block

    def acquire(self, block_id: str, agent_id: str) -> None:
        """`agent_id` now references the block (idempotent)."""
        b = self._blocks.get(block_id)
        if b is None:
            raise KeyError(f"no shared block {block_id!r}")
        b.refs.add(agent_id)

    def release(self, block_id: str, agent_id: str) -> bool:
        """`agent_id` no longer references the block; True when that freed it.

        Releasing a reference that is not held is a no-op (counts never go negative).
        """
        b = self._blocks.get(block_id)
        if b is None:
            return False
        b.refs.discard(agent_id)
        if not b.refs:
            del self._blocks[block_id]
            return True
        return False

    def ram_bytes(self) -> int:
        """Bytes of blocks held in RAM."""
        return sum(b.nbytes for b in self._blocks.values() if b.data is not None)


# --------------------------------------------------------------------------- prefix index


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two int32 arrays (vectorised)."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    neq = a[:m] != b[:m]
    return int(np.argmax(neq)) if neq.any() else m


class _Node:
    __slots__ = ("label", "children", "agents", "ends")

    def __init__(self, label: np.ndarray) -> None:
        self.label = label  # tokens on the edge into this node
        self.children: dict[int, _Node] = {}
        self.agents: set[str] = set()  # agents whose sequence passes through (or ends in) this node
        self.ends: set[str] = set()  # agents whose sequence ends exactly here


class PrefixIndex:
    """A radix tree over agents' token sequences: who shares the longest prefix with a prompt.

    Edges carry runs of tokens (compared with numpy), every node knows the agents
    whose sequence passes through it, so a lookup walks the prompt once and is
    independent of how many agents share each prefix. Entries are refreshed
    lazily: `sync` re-inserts an agent only when its ledger version changed.
    `prefixes_of` answers the converse question (whose whole sequence is a prefix of a
    prompt) by one walk down the prompt's path: `agentmem.pool.lines` finds a
    conversation's kept state with it.

    >>> idx = PrefixIndex()
    >>> idx.sync("a", np.array([1, 2, 3, 4], np.int32), version=1)
    >>> idx.sync("b", np.array([1, 2, 9], np.int32), version=1)
    >>> idx.matches(np.array([1, 2, 3, 7], np.int32))
    [('a', 3), ('b', 2)]
    >>> idx.prefixes_of(np.array([1, 2, 9, 5], np.int32))  # b's whole sequence starts the prompt
    ([(3, ['b'])], 3)
    >>> idx.remove("a"); idx.matches(np.array([1, 2, 3, 7], np.int32))
    [('b', 2)]
    """

    def __init__(self) -> None:
        self._root = _Node(np.zeros(0, np.int32))
        self._seqs: dict[str, tuple[int, np.ndarray]] = {}  # agent -> (version, tokens)
        self.visited = 0  # nodes the last `prefixes_of` walk visited (its cost; tests check it stays flat)

    def __len__(self) -> int:
        return len(self._seqs)

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._seqs

    def sync(self, agent_id: str, tokens: np.ndarray, *, version: int) -> None:
        """Make `agent_id`'s entry `tokens` unless it is already at `version`."""
        cur = self._seqs.get(agent_id)
        if cur is not None and cur[0] == version:
            return
        if cur is not None:
            self.remove(agent_id)
        toks = np.array(tokens, dtype=np.int32, copy=True)
        self._seqs[agent_id] = (version, toks)
        node, i = self._root, 0
        node.agents.add(agent_id)
        while i < len(toks):
            child = node.children.get(int(toks[i]))
            if child is None:
                leaf = _Node(toks[i:])
                leaf.agents.add(agent_id)
                leaf.ends.add(agent_id)
                node.children[int(toks[i])] = leaf
                return
            k = _common(child.label, toks[i:])
            if k < len(child.label):  # split the edge at k
                mid = _Node(child.label[:k])
                mid.agents = set(child.agents)
                child.label = child.label[k:]
                mid.children[int(child.label[0])] = child
                node.children[int(toks[i])] = mid
                child = mid
            child.agents.add(agent_id)
            node, i = child, i + k
        node.ends.add(agent_id)

    def remove(self, agent_id: str) -> None:
        """Drop `agent_id`'s entry (no-op when absent); empty branches are pruned."""
        cur = self._seqs.pop(agent_id, None)
        if cur is None:
            return
        toks = cur[1]
        node, i = self._root, 0
        node.agents.discard(agent_id)
        while i < len(toks):
            child = node.children.get(int(toks[i]))
            if child is None:
                return
            child.agents.discard(agent_id)
            if not child.agents:
                del node.children[int(toks[i])]
                return
            node, i = child, i + len(child.label)
        node.ends.discard(agent_id)

    def matches(self, tokens: np.ndarray) -> list[tuple[str, int]]:
        """Every indexed agent sharing a prefix with `tokens`: `(agent, length)`, longest first."""
        toks = np.asarray(tokens, dtype=np.int32)
        best: dict[str, int] = {}
        node, i = self._root, 0
        while i < len(toks):
            child = node.children.get(int(toks[i]))
            if child is None:
                break
            k = _common(child.label, toks[i:])
            for a in child.agents:
                best[a] = i + k
            if k < len(child.label):
                break
            node, i = child, i + k
        return sorted(best.items(), key=lambda t: (-t[1], t[0]))

    def prefixes_of(self, tokens: np.ndarray) -> tuple[list[tuple[int, list[str]]], int]:
        """Agents whose whole indexed sequence is a prefix of `tokens`, and how far `tokens` follows the tree.

        Returns `([(length, agents), ...] deepest first, depth)`: `depth` is the longest
        prefix of `tokens` any indexed sequence shares. One walk down the path of
        `tokens`: the cost depends on its length and the agents ending on it, not on
        how many agents are indexed (`visited` counts the nodes).
        """
        toks = np.asarray(tokens, dtype=np.int32)
        found: list[tuple[int, list[str]]] = [(0, sorted(self._root.ends))] if self._root.ends else []
        node, i, visited = self._root, 0, 1
        while i < len(toks):
            child = node.children.get(int(toks[i]))
            if child is None:
                break
            visited += 1
            k = _common(child.label, toks[i:])
            if k < len(child.label):
                i += k
                break
            node, i = child, i + k
            if node.ends:
                found.append((i, sorted(node.ends)))
        self.visited = visited
        return found[::-1], i

    def nodes(self) -> int:
        """Number of nodes (for tests and stats)."""
        stack, n = [self._root], 0
        while stack:
            x = stack.pop()
            n += 1
            stack.extend(x.children.values())
        return n
