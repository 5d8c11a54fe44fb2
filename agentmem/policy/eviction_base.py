"""The eviction strategy interface and the selection every policy shares.

`EvictionPolicy` subclasses give each live token a keep priority; its `select`
turns priorities into ranges to remove (see `agentmem.policy.eviction` for the
procedure and the registered policies). The helpers here are shared by them.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

# np.unique imports numpy.ma on its first call (16 ms here): import it now so the
# first eviction pass of a process does not pay it on a reply's path
import numpy.ma  # noqa: F401

from agentmem.policy.view import REGION_CODE, LedgerView

__all__ = ["EvictionPolicy"]

logger = logging.getLogger(__name__)


#: Added to the priority of protected tokens: larger than any ordinary
#: priority, so a protected piece always ranks after every ordinary one.
_PROTECT = 1e12

_SYSTEM = REGION_CODE["system"]


class EvictionPolicy(ABC):
    """A strategy choosing which live tokens of one agent to evict.

    Subclasses implement `priority` (and may override `protected`);
    `select` — shared by all — turns priorities into block ranges.
    A policy holds only its parameters: one instance may serve many agents and
    threads.

    Attributes:
        name: the registry name (``get_policy(name)`` builds this class).
    """

    name: ClassVar[str]

    @abstractmethod
    def priority(self, view: LedgerView) -> np.ndarray:
        """Keep priority of every live token (float64, length ``view.n``).

        Higher means "keep longer". Only the order matters, and only among
        tokens of the same class (ordinary / protected).
        """

    def protected(self, view: LedgerView) -> np.ndarray:
        """Tokens this policy keeps unless the target cannot be met otherwise (bool mask).

        The default protects nothing.
        """
        return np.zeros(view.n, dtype=bool)

    def select(self, view: LedgerView, *, target: int, block: int = 32) -> list[tuple[int, int]]:
        """Ranges of live positions to evict so that at most ``target`` tokens remain.

        Args:
            view: the agent's live tokens.
            target: tokens that may remain (the low watermark of the budget).
            block: eviction granularity in tokens; blocks are aligned to live
                position 0 and split around pinned/protected tokens and at
                message boundaries.

        Returns:
            Sorted, non-overlapping half-open ``(start, end)`` ranges of live
            positions, never containing a pinned token. Whole pieces are
            evicted, so slightly more than ``view.n - target`` tokens may go
            (less than one block more). Empty when ``view.n <= target``. When
            pinned tokens alone exceed ``target``, every unpinned token is
            returned (the caller reports the overflow).

        Raises:
            ValueError: ``target`` is negative or ``block`` is below 1.
        """
        if not isinstance(target, (int, np.integer)) or target < 0:
            raise ValueError(f"target must be a non-negative int, got {target!r}")
        if not isinstance(block, (int, np.integer)) or block < 1:
            raise ValueError(f"block must be a positive int, got {block!r}")
        n = view.n
        need = n - int(target)
        if need <= 0:
            return []
        _check_view(view)
        pinned = view.pinned.astype(bool, copy=False)
        prot = self.protected(view) & ~pinned
        prio = np.asarray(self.priority(view), dtype=np.float64)
        assert prio.shape == (n,), f"{self.name}: priority shape {prio.shape}, expected ({n},)"
        key = np.where(prot, prio + _PROTECT, prio)

        # Pieces: aligned blocks, split where the class (0 ordinary, 1 protected, 2 pinned)
        # or the message changes.
        cls = prot.astype(np.int8) + 2 * pinned.astype(np.int8)
        cut = np.zeros(n, dtype=bool)
        cut[::block] = True
        cut[1:] |= (cls[1:] != cls[:-1]) | (view.turn[1:] != view.turn[:-1])
        starts = np.flatnonzero(cut)
        ends = np.append(starts[1:], n)
        lengths = ends - starts
        mean = np.add.reduceat(key, starts) / lengths
        keep = cls[starts] != 2
        starts, ends, lengths, mean = starts[keep], ends[keep], lengths[keep], mean[keep]
        if lengths.sum() <= need:  # pinned alone reach the target: evict everything evictable
            chosen = np.arange(starts.shape[0])
            if lengths.sum() < need:
                logger.debug("%s: %d pinned tokens exceed the target %d", self.name, int(pinned.sum()), target)
        else:
            order = np.lexsort((starts, mean))  # lowest mean first, older first on ties
            taken = np.cumsum(lengths[order])
            chosen = order[: int(np.searchsorted(taken, need)) + 1]
        chosen.sort()
        return _merge(starts[chosen], ends[chosen])

    def __repr__(self) -> str:
        if dataclasses.is_dataclass(self):
            args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
            return f"{type(self).__name__}({args})"
        return f"{type(self).__name__}()"


def _check_view(view: LedgerView) -> None:
    n = view.n
    for attr in ("regions", "pinned", "turn"):
        got = getattr(view, attr).shape
        assert got == (n,), f"LedgerView.{attr} has shape {got}, tokens has ({n},)"


def _merge(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Sorted pieces → ranges; touching pieces are joined (one ``seq_rm`` each)."""
    if starts.size == 0:
        return []
    gap = np.flatnonzero(starts[1:] != ends[:-1])
    first = np.concatenate(([0], gap + 1))
    last = np.concatenate((gap, [starts.size - 1]))
    return list(zip(starts[first].tolist(), ends[last].tolist()))


def _leading_system(view: LedgerView) -> int:
    """Length of the leading run of ``system`` tokens (0 when the view starts otherwise)."""
    not_sys = np.flatnonzero(view.regions != _SYSTEM)
    return int(not_sys[0]) if not_sys.size else view.n
