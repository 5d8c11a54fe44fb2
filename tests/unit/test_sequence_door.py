"""The one door to an agent's KV (`agentmem.pool.sequence.AgentSeq`).

Two kinds of test: the code's shape (nothing in the pool but the door and its window
strategy calls the context's KV operations, and only the door and the wiring name the
window rules: the issue-24 finding was 7 pool files calling them, "cut back to n"
written out three times and the window rules passed to four collaborators), and the
door's verbs over a recording fake context (cells and ledger change together).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentmem.errors import StateError
from agentmem.memory.parking import ParkedState
from agentmem.pool import residence
from agentmem.pool.sequence import AgentSeq, Sequences
from agentmem.pool.state import AgentState
from agentmem.pool.window import NoWindow

ROOT = Path(__file__).resolve().parents[2] / "agentmem"
KV_OPS = re.compile(r"\.(seq_rm|seq_cp|seq_add|state_get|state_set|swa_state_get|swa_state_set)\(")


def _sources() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in ROOT.rglob("*.py")
            if "engine" not in p.relative_to(ROOT).parts}


def test_only_the_door_and_its_window_rules_call_the_kv_operations() -> None:
    callers = {name for name, src in _sources().items() if KV_OPS.search(src)}
    assert callers == {"pool/sequence.py", "pool/window.py"}, callers


def test_only_the_door_and_the_wiring_know_the_window_rules() -> None:
    users = {name for name, src in _sources().items()
             if re.search(r"agentmem\.pool\.window import|\bswa\b", src) and name != "pool/window.py"}
    assert users <= {"pool/sequence.py", "pool/opening.py"}, users


class FakeCtx:
    """Records the KV operations; `state_set` accepts blobs unless `full`."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.full = False
        self.pos_max = -1

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        self.calls.append(("rm", seq, p0, p1))

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.calls.append(("add", seq, p0, p1, delta))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.calls.append(("cp", src, dst, p0, p1))

    def state_get(self, seq: int) -> np.ndarray:
        self.calls.append(("get", seq))
        return np.zeros(4, np.uint8)

    def state_set(self, seq: int, blob: np.ndarray) -> int:
        self.calls.append(("set", seq))
        return 0 if self.full else 4

    def seq_pos_max(self, seq: int) -> int:
        return self.pos_max


class FakeBlocks:
    def __init__(self) -> None:
        self.left: list[tuple[str, int | None]] = []

    def leave_below(self, a: Any, n_live: int) -> None:
        self.left.append((a.id, n_live))

    def leave(self, a: Any) -> None:
        self.left.append((a.id, None))


def door(n_tokens: int = 10, *, window: NoWindow | None = None) -> tuple[AgentSeq, FakeCtx, FakeBlocks, dict[str, int]]:
    ctx, blocks, totals = FakeCtx(), FakeBlocks(), {"privatized": 0}
    a = AgentState("a")
    a.ledger.extend(list(range(n_tokens)))
    seqs = Sequences(ctx, blocks, totals, window=window or NoWindow())  # type: ignore[arg-type]
    residence.seat(a, seqs.open(a, 3, fit=lambda attempt: attempt()))
    assert a.kv is not None
    return a.kv, ctx, blocks, totals


def test_seq_is_the_doors_id_while_resident() -> None:
    kv, *_ = door()
    assert kv.agent.seq == 3
    residence.unseat(kv.agent)
    assert kv.agent.seq is None


def test_cut_changes_cells_and_ledger_together_and_leaves_an_uncovered_block() -> None:
    kv, ctx, blocks, _ = door(10)
    assert kv.can_cut(6) and kv.cut(6) == 6
    assert ctx.calls == [("rm", 3, 6, -1)] and kv.agent.ledger.n_live == len(kv.agent.ledger) == 6
    assert blocks.left == [("a", 6)]
    ctx.calls.clear()
    assert kv.cut(8) == 8 and ctx.calls == []  # nothing past the ledger to cut


class NoReach(NoWindow):
    """A window that reaches nothing below the live end (a restored state past its window)."""

    def reaches(self, seq: int, n_live: int, *, exact: bool = False) -> bool:
        return False


def test_a_cut_the_window_cannot_reach_without_a_checkpoint_drops_everything() -> None:
    kv, ctx, _, _ = door(10, window=NoReach())
    assert not kv.can_cut(6)
    assert kv.cut(6) == 0  # re-prefill
    assert ctx.calls == [("rm", 3, 0, -1)] and kv.agent.ledger.n_live == len(kv.agent.ledger) == 0


def test_evict_makes_shared_cells_private_before_shifting_them() -> None:
    kv, ctx, blocks, totals = door(10)
    kv.shared_upto = 4
    hist = kv.evict([(2, 4), (6, 7)])
    assert hist.tolist() == [2, 3, 6] and kv.agent.ledger.n_live == 7
    assert ctx.calls == [("get", 3), ("set", 3), ("rm", 3, 2, 4), ("rm", 3, 6, 7),
                         ("add", 3, 4, 6, -2), ("add", 3, 7, -1, -3)]
    assert totals["privatized"] == 1 and kv.shared_upto == 0 and blocks.left == [("a", 2)]


def test_evict_fails_typed_when_there_is_no_room_to_privatize() -> None:
    kv, ctx, _, _ = door(10)
    kv.shared_upto = 4
    ctx.full = True
    with pytest.raises(StateError, match="private"):
        kv.evict([(0, 2)])
    assert kv.agent.ledger.n_live == 10  # nothing removed


def test_load_checks_the_cells_end_where_the_ledger_does() -> None:
    kv, ctx, _, _ = door(10)
    parked = ParkedState(np.zeros(4, np.uint8), "f16", 10)
    ctx.full = True
    assert kv.load(np.zeros(4, np.uint8), parked) is False
    ctx.full, ctx.pos_max = False, 7
    with pytest.raises(StateError, match="ends at position 7"):
        kv.load(np.zeros(4, np.uint8), parked)
    ctx.pos_max = 9
    assert kv.load(np.zeros(4, np.uint8), parked) is True


class Unlinkable(NoWindow):
    def linked_complete(self, seq: int, order: np.ndarray, private: np.ndarray) -> bool:
        return False


def test_a_link_that_misses_window_cells_leaves_the_sequence_empty_and_nothing_shared() -> None:
    kv, ctx, _, _ = door(10, window=Unlinkable())
    member, *_ = door(10)
    ctx.pos_max = 9
    parked = ParkedState(np.zeros(4, np.uint8), "f16", 10, block="blk", order=np.array([1, 10, *([0] * 6), -1, -1, -1, -1], np.int32))
    assert kv.link(member, 6, parked, np.zeros(4, np.uint8)) is False
    assert ctx.calls[-1] == ("rm", 3, -1, -1) and kv.shared_upto == 0 and member.shared_upto == 0


def test_clear_forgets_what_came_with_the_cells() -> None:
    kv, ctx, _, _ = door(10)
    ctx.pos_max = 9
    kv.load(np.zeros(4, np.uint8), ParkedState(np.zeros(4, np.uint8), "f16", 10, window_ckpt=np.ones(2, np.uint8)))
    kv.shared_upto = 5
    kv.clear()
    assert ctx.calls[-1] == ("rm", 3, -1, -1) and kv.shared_upto == 0
    assert kv.agent.ledger.n_live == 10  # the ledger is the caller's (a parked state keeps it)
