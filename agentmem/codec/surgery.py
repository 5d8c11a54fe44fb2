"""Blob surgery for shared KV blocks: cut a state blob into a block's cells and its own, and join them back.

A parked agent that started from a shared prefix stores only its *private*
cells; the prefix's cells live once, in a reference-counted block
(`agentmem.memory.shared.BlockStore`). Both halves are ordinary llama.cpp
sequence-state blobs (the private one simply has fewer cells), so every park
codec and the archive handle them unchanged. `split_state` cuts a blob and
returns a small `order` array that says, for each cell of the original blob in
its original order, the *position* of the block cell it was (>= 0) or that it was
the next private cell (-1); `join_state` puts the cells back in that order, so a
restore is bit-identical. Positions, not cell indices, so the reference may be
any blob holding those positions with the same bytes in any cell order (a
restored sequence's own sliding-window cells, for a checkpoint).

Order array layout (int32): `n_sections`, then one length per section, then each
section's entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentmem.codec.layout import SectionLayout, StateLayout, StreamLayout, TensorLayout, parse_state
from agentmem.errors import CodecError

__all__ = ["join_state", "split_state"]

_HDR_BYTES = 8  # magic u32 + seq_id i32
_TENSOR_HDR = 12  # K/V: type i32 + row_size u64; transposed V: type i32 + el_size u32 + n_embd u32

_Runs = list[tuple[int, bool, int, int]]  # (dst, from_block, src, length) of consecutive cells


def _stream_of(section: SectionLayout) -> StreamLayout | None:
    """The one stream of a section holding cells (`None` for an empty section).

    A unified cache has one stream; with per-sequence streams (`kv_unified=False`) a
    sequence's blob has one stream per sequence, all but its own empty. Blobs cut or
    joined here keep the section's stream count and the index of the stream with cells
    (llama.cpp loads a sequence's cells into that sequence's stream, whichever index
    they came from).
    """
    full = [st for st in section.streams if st.n_cells]
    if len(full) > 1:
        raise CodecError(f"a section holds cells in {len(full)} streams; one sequence's blob has them in one")
    return full[0] if full else (section.streams[0] if section.streams else None)


def _zeros(n_streams: int) -> np.ndarray:
    """The cell counts (0) of `n_streams` empty streams."""
    return np.zeros(4 * max(0, n_streams), np.uint8)


def _cell_stride(stream: StreamLayout) -> int:
    return stream.cells_size // stream.n_cells


def _rows(blob: np.ndarray, t: TensorLayout) -> np.ndarray:
    """Tensor data as (cells, bytes-per-cell) — or (n_embd, cells, elem) when transposed."""
    data = blob[t.data_offset : t.data_offset + t.data_size]
    if t.transposed:
        return data.reshape(t.n_embd, t.n_cells, t.row_size)
    return data.reshape(t.n_cells, t.row_size)


def _match_sections(member: StateLayout, block: StateLayout) -> list[SectionLayout]:
    """The block section each member section corresponds to (an SWA-only blob maps to the last ones)."""
    nb, nm = len(block.sections), len(member.sections)
    if nm > nb:
        raise CodecError(f"blob has {nm} cache sections, the shared block {nb}")
    return list(block.sections[nb - nm :])


def split_state(
    blob: np.ndarray, block_blob: np.ndarray, n_shared: int, *, verify_rows: int = 3, partial: bool = False
) -> tuple[np.ndarray, np.ndarray] | None:
    """Cut a member's state blob into its private part and an order array.

    `join_state(block_blob, private_blob, order)` gives `blob` back byte for byte.
    Each cache section is cut on its own (`_split_section`): find which of the member's
    cells the block holds, verify a few of their rows, copy the rest out.

    Args:
        blob: the member's f16 sequence state (full, or sliding-window only).
        block_blob: the shared block's state (positions `0..n_shared-1`).
        n_shared: cells of the shared prefix.
        verify_rows: per tensor, compare this many of the member's shared rows
            (first, last, middle ...) with the block's; a mismatch returns `None`.
        partial: cells below `n_shared` the block lacks stay private instead of
            failing the cut (used to cut a checkpoint against its own agent's state).

    Returns:
        `(private_blob, order)` or `None` when the member's cells below
            `n_shared` are not all in the block (or differ from it): store it whole.
    """
    blob = np.asarray(blob, dtype=np.uint8).reshape(-1)
    block_blob = np.asarray(block_blob, dtype=np.uint8).reshape(-1)
    mem = parse_state(blob)
    blk = parse_state(block_blob)
    parts: list[np.ndarray] = [blob[:_HDR_BYTES]]
    orders: list[np.ndarray] = []
    for msec, bsec in zip(mem.sections, _match_sections(mem, blk)):
        cut = _split_section(blob, block_blob, msec, bsec, n_shared, verify_rows, partial)
        if cut is None:
            return None
        parts.extend(cut[0])
        orders.append(cut[1])
    return np.concatenate(parts), _order_array(orders)


def _split_section(
    blob: np.ndarray, block_blob: np.ndarray, msec: SectionLayout, bsec: SectionLayout,
    n_shared: int, verify_rows: int, partial: bool,
) -> tuple[list[np.ndarray], np.ndarray] | None:
    """One section's private bytes and order entries, or `None` when the block does not fit it."""
    ms, bs = _stream_of(msec), _stream_of(bsec)
    n_stream = blob[msec.offset : msec.offset + 4]
    n_st = max(1, len(msec.streams))
    if ms is None or ms.n_cells == 0:
        return [n_stream, _zeros(n_st)], np.zeros(0, np.int32)
    located = _locate_shared(ms, bs, n_shared, partial)
    if located is None:
        return None
    shared, src = located
    if shared.any() and not _shared_rows_match(blob, block_blob, ms, bs, shared, src, verify_rows):
        return None
    order = np.where(shared, ms.positions, -1).astype(np.int32)
    return [n_stream, *_private_parts(blob, ms, ~shared, n_st)], order


def _locate_shared(
    ms: StreamLayout, bs: StreamLayout | None, n_shared: int, partial: bool
) -> tuple[np.ndarray, np.ndarray] | None:
    """`(shared, src)`: which member cells come from the block, and the block cell each is.

    `None` when a cell below `n_shared` is missing from the block and `partial` is off;
    with `partial` such cells stay private.
    """
    shared = ms.positions < n_shared
    src = np.full(ms.n_cells, -1, dtype=np.int32)
    if shared.any() and (bs is None or bs.n_cells == 0):
        if not partial:
            return None
        shared[:] = False
    if shared.any():
        assert bs is not None
        bpos = bs.positions
        srt = np.argsort(bpos, kind="stable")
        want = ms.positions[shared]
        at = np.searchsorted(bpos[srt], want)
        at[at >= len(srt)] = 0
        hit = bpos[srt][at] == want
        if not hit.all():
            if not partial:
                return None  # the member holds a shared position the block lacks
            shared[np.flatnonzero(shared)[~hit]] = False
            at = at[hit]
        src[shared] = srt[at]
    return shared, src


def _shared_rows_match(
    blob: np.ndarray, block_blob: np.ndarray, ms: StreamLayout, bs: StreamLayout | None,
    shared: np.ndarray, src: np.ndarray, verify_rows: int,
) -> bool:
    """Whether the block's tensors have the member's layout and `verify_rows` probed shared rows per tensor."""
    assert bs is not None
    if ms.v_trans != bs.v_trans or len(ms.k) != len(bs.k):
        return False
    idx = np.flatnonzero(shared)
    probe = np.unique(idx[np.linspace(0, len(idx) - 1, num=min(verify_rows, len(idx))).astype(np.int64)])
    for mt, bt in zip(ms.k + ms.v, bs.k + bs.v):
        if (mt.ggml_type, mt.row_size, mt.n_embd) != (bt.ggml_type, bt.row_size, bt.n_embd):
            return False
        mr, br = _rows(blob, mt), _rows(block_blob, bt)
        if mt.transposed:
            if not np.array_equal(mr[:, probe, :], br[:, src[probe], :]):
                return False
        elif not np.array_equal(mr[probe], br[src[probe]]):
            return False
    return True


def _private_parts(blob: np.ndarray, ms: StreamLayout, keep: np.ndarray, n_st: int) -> list[np.ndarray]:
    """The section's streams holding only the `keep` cells: counts, cells, tensor headers and rows."""
    n_priv = int(keep.sum())
    if n_priv == 0:
        return [_zeros(n_st)]
    parts = [_zeros(ms.index)]  # the streams before this sequence's
    parts.append(np.frombuffer(np.uint32(n_priv).tobytes(), np.uint8))
    stride = _cell_stride(ms)
    cells = blob[ms.cells_offset : ms.cells_offset + ms.cells_size].reshape(ms.n_cells, stride)
    parts.append(cells[keep].reshape(-1))
    tail = ms.k[0].header_offset - 8
    parts.append(blob[tail : tail + 8])  # v_trans, n_layer
    for t in ms.k + ms.v:
        parts.append(blob[t.header_offset : t.data_offset])
        r = _rows(blob, t)
        parts.append((r[:, keep, :] if t.transposed else r[keep]).reshape(-1))
    parts.append(_zeros(n_st - 1 - ms.index))
    return parts


def _order_array(orders: list[np.ndarray]) -> np.ndarray:
    """The int32 order array: `n_sections`, each section's length, then their entries."""
    if not orders:
        return np.zeros(1, np.int32)
    lens = np.array([len(o) for o in orders], dtype=np.int32)
    return np.concatenate([np.array([len(orders)], np.int32), lens, *orders])


def _runs(shared: np.ndarray, sh_src: np.ndarray) -> _Runs | None:
    """The join's cell mapping as runs `(dst, from_block, src, length)` of consecutive cells.

    Cells usually come in a few long runs (the prefix's cells, then the agent's
    own): copying those as slices runs at memcpy speed, where a gather per cell
    is several times slower. `None` when the mapping is too fragmented.
    """
    n = len(shared)
    src = np.empty(n, dtype=np.int64)
    src[shared] = sh_src
    src[~shared] = np.arange(n - len(sh_src))
    brk = np.flatnonzero((shared[1:] != shared[:-1]) | (src[1:] != src[:-1] + 1)) + 1
    if len(brk) > 64:
        return None
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [n]))
    return [(int(a), bool(shared[a]), int(src[a]), int(b - a)) for a, b in zip(starts, ends)]


def _fill(dst: np.ndarray, brows: np.ndarray | None, prows: np.ndarray | None, shared: np.ndarray,
          sh_src: np.ndarray, runs: _Runs | None, axis: int) -> None:
    """Put block rows and private rows into `dst` along `axis` (0, or 1 for transposed V)."""
    if runs is not None:
        for a, from_block, s0, k in runs:
            rows = brows if from_block else prows
            if rows is None:
                continue
            if axis == 0:
                dst[a : a + k] = rows[s0 : s0 + k]
            else:
                dst[:, a : a + k] = rows[:, s0 : s0 + k]
        return
    if axis == 0:
        if brows is not None and shared.any():
            dst[shared] = brows[sh_src]
        if prows is not None and not shared.all():
            dst[~shared] = prows
    else:
        if brows is not None and shared.any():
            dst[:, shared] = brows[:, sh_src]
        if prows is not None and not shared.all():
            dst[:, ~shared] = prows


@dataclass(frozen=True, slots=True)
class _SectionJoin:
    """One section of a join, planned before the output is allocated."""

    psec: SectionLayout
    ps: StreamLayout | None  # the private part's stream with cells
    bs: StreamLayout | None  # the block's
    src: np.ndarray  # per output cell: a block cell index (>= 0), or -1 for the next private cell
    shared: np.ndarray  # src >= 0
    ref: StreamLayout | None  # whichever of ps/bs has cells: tensor headers and cell stride come from it
    n_bytes: int  # what the section takes in the output


def join_state(block_blob: np.ndarray, private_blob: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Rebuild a member's blob from the shared block and its private part (see `split_state`).

    Phases: read the order array; plan each section (check it against both blobs, map
    positions to block cells, size it); allocate the output once; write each section.

    Raises:
        CodecError: the order array does not fit the private blob or the block.
    """
    block_blob = np.asarray(block_blob, dtype=np.uint8).reshape(-1)
    private_blob = np.asarray(private_blob, dtype=np.uint8).reshape(-1)
    blk = parse_state(block_blob)
    prv = parse_state(private_blob)
    srcs = _section_orders(np.asarray(order, dtype=np.int32), len(prv.sections))
    plan = [_plan_section(psec, bsec, src) for psec, bsec, src in zip(prv.sections, _match_sections(prv, blk), srcs)]
    total = _HDR_BYTES + sum(p.n_bytes for p in plan)
    out = np.empty(total, dtype=np.uint8)
    out[:_HDR_BYTES] = private_blob[:_HDR_BYTES]
    o = _HDR_BYTES
    for p in plan:
        o = _write_section(out, o, p, block_blob, private_blob)
    assert o == total, f"{o=}, {total=}"
    return out


def _section_orders(order: np.ndarray, n_sections: int) -> list[np.ndarray]:
    """The order array cut into one entry array per section (checked against `n_sections`)."""
    n_sec = int(order[0]) if len(order) else 0
    if n_sec != n_sections or len(order) < 1 + n_sec:
        raise CodecError(f"order array describes {n_sec} sections, the private blob has {n_sections}")
    lens = order[1 : 1 + n_sec]
    if int(lens.sum()) != len(order) - 1 - n_sec:
        raise CodecError("order array is truncated")
    return np.split(order[1 + n_sec :], np.cumsum(lens)[:-1]) if n_sec else []


def _plan_section(psec: SectionLayout, bsec: SectionLayout, src: np.ndarray) -> _SectionJoin:
    """Check one section's order entries against the private part and the block, and size it."""
    ps, bs = _stream_of(psec), _stream_of(bsec)
    n = len(src)
    shared = src >= 0
    n_priv = n - int(shared.sum())
    if ps is not None and ps.n_cells != n_priv:
        raise CodecError(f"private blob has {ps.n_cells} cells in section {psec.index}, the order array {n_priv}")
    if n_priv and (ps is None or ps.n_cells == 0):
        raise CodecError("order array expects private cells the blob does not have")
    if shared.any():
        src = _block_cells(bs, bsec, src, shared)
    ref = ps if n_priv else bs
    return _SectionJoin(psec, ps, bs, src, shared, ref, _section_bytes(psec, ref, n))


def _block_cells(bs: StreamLayout | None, bsec: SectionLayout, src: np.ndarray, shared: np.ndarray) -> np.ndarray:
    """`src` with its shared entries turned from positions into the block's cell indices (a copy)."""
    if bs is None or bs.n_cells == 0:
        raise CodecError(f"the order array needs shared cells the block lacks in section {bsec.index}")
    srt = np.argsort(bs.positions, kind="stable")
    want = src[shared]
    at = np.searchsorted(bs.positions[srt], want)
    at[at >= len(srt)] = 0
    if not np.array_equal(bs.positions[srt][at], want):
        raise CodecError(f"the shared block lacks positions the order array needs in section {bsec.index}")
    src = src.copy()
    src[shared] = srt[at]
    return src


def _section_bytes(psec: SectionLayout, ref: StreamLayout | None, n: int) -> int:
    """Bytes of a joined section of `n` cells: stream counts, cells, tensor headers and rows."""
    total = 4 + 4 * max(1, len(psec.streams))
    if n and ref is not None:
        total += n * _cell_stride(ref) + 8
        for t in ref.k + ref.v:
            per = t.n_embd * t.row_size if t.transposed else t.row_size
            total += _TENSOR_HDR if t.transposed else (t.data_offset - t.header_offset)
            total += n * per
    return total


def _write_section(out: np.ndarray, o: int, p: _SectionJoin, block_blob: np.ndarray, private_blob: np.ndarray) -> int:
    """Write one planned section into `out` at `o`; returns the offset after it."""
    n = len(p.src)
    out[o : o + 4] = private_blob[p.psec.offset : p.psec.offset + 4]
    o += 4
    n_st = max(1, len(p.psec.streams))
    if n == 0:
        out[o : o + 4 * n_st] = 0
        return o + 4 * n_st
    # the stream with cells: the private part's, else the member's own (its seq id)
    ps = p.ps
    si = ps.index if (ps is not None and ps.n_cells) else int(np.frombuffer(private_blob[4:8].tobytes(), np.int32)[0])
    si = si if 0 <= si < n_st else 0
    out[o : o + 4 * si] = 0
    o += 4 * si
    out[o : o + 4] = np.frombuffer(np.uint32(n).tobytes(), np.uint8)
    o += 4
    sh_src = p.src[p.shared]
    runs = _runs(p.shared, sh_src)
    o = _write_cells(out, o, p, sh_src, runs, block_blob, private_blob)
    o = _write_tensors(out, o, p, sh_src, runs, block_blob, private_blob)
    tail_zeros = 4 * (n_st - 1 - si)
    out[o : o + tail_zeros] = 0
    return o + tail_zeros


def _write_cells(out: np.ndarray, o: int, p: _SectionJoin, sh_src: np.ndarray, runs: _Runs | None,
                 block_blob: np.ndarray, private_blob: np.ndarray) -> int:
    """The section's cell records (position, seq ids), block cells carrying the member's seq id."""
    ps, bs, ref, shared = p.ps, p.bs, p.ref, p.shared
    assert ref is not None
    n = len(p.src)
    stride = _cell_stride(ref)
    cells = out[o : o + n * stride].reshape(n, stride)
    _fill(
        cells,
        block_blob[bs.cells_offset : bs.cells_offset + bs.cells_size].reshape(bs.n_cells, stride)
        if bs is not None and shared.any() else None,
        private_blob[ps.cells_offset : ps.cells_offset + ps.cells_size].reshape(ps.n_cells, stride)
        if ps is not None and not shared.all() else None,
        shared, sh_src, runs, 0,
    )
    if shared.any():
        cells[shared, stride - 4 :] = private_blob[4:8]  # the member's own seq id (llama.cpp ignores it on load)
    return o + n * stride


def _write_tensors(out: np.ndarray, o: int, p: _SectionJoin, sh_src: np.ndarray, runs: _Runs | None,
                   block_blob: np.ndarray, private_blob: np.ndarray) -> int:
    """`v_trans`, `n_layer`, then per K/V tensor its header and its rows from the block and the private part."""
    ps, bs, ref = p.ps, p.bs, p.ref
    assert ref is not None
    n = len(p.src)
    tail = ref.k[0].header_offset - 8
    src_blob = private_blob if ref is ps else block_blob
    out[o : o + 8] = src_blob[tail : tail + 8]
    o += 8
    ptens = (ps.k + ps.v) if (ps is not None and ps.n_cells) else (None,) * len(ref.k + ref.v)
    btens = (bs.k + bs.v) if (bs is not None and bs.n_cells) else (None,) * len(ref.k + ref.v)
    for rt, pt, bt in zip(ref.k + ref.v, ptens, btens):
        h = rt.data_offset - rt.header_offset
        out[o : o + h] = src_blob[rt.header_offset : rt.data_offset]
        o += h
        size = n * rt.n_embd * rt.row_size if rt.transposed else n * rt.row_size
        dst = out[o : o + size]
        dst = dst.reshape(rt.n_embd, n, rt.row_size) if rt.transposed else dst.reshape(n, rt.row_size)
        _fill(
            dst,
            _rows(block_blob, bt) if bt is not None else None,
            _rows(private_blob, pt) if pt is not None else None,
            p.shared, sh_src, runs, 1 if rt.transposed else 0,
        )
        o += size
    return o
