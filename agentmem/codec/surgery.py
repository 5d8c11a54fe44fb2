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

import numpy as np

from agentmem.codec.layout import SectionLayout, StateLayout, StreamLayout, TensorLayout, parse_state
from agentmem.errors import CodecError

__all__ = ["join_state", "split_state"]

_HDR_BYTES = 8  # magic u32 + seq_id i32
_TENSOR_HDR = 12  # K/V: type i32 + row_size u64; transposed V: type i32 + el_size u32 + n_embd u32


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
        ms, bs = _stream_of(msec), _stream_of(bsec)
        parts.append(blob[msec.offset : msec.offset + 4])  # n_stream
        n_st = max(1, len(msec.streams))
        if ms is None or ms.n_cells == 0:
            parts.append(_zeros(n_st))
            orders.append(np.zeros(0, np.int32))
            continue
        shared = ms.positions < n_shared
        src = np.full(ms.n_cells, -1, dtype=np.int32)
        if shared.any() and (bs is None or bs.n_cells == 0):
            if not partial:
                return None
            shared[:] = False
        if shared.any():
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
        if shared.any():
            if ms.v_trans != bs.v_trans or len(ms.k) != len(bs.k):
                return None
            idx = np.flatnonzero(shared)
            probe = np.unique(idx[np.linspace(0, len(idx) - 1, num=min(verify_rows, len(idx))).astype(np.int64)])
            for mt, bt in zip(ms.k + ms.v, bs.k + bs.v):
                if (mt.ggml_type, mt.row_size, mt.n_embd) != (bt.ggml_type, bt.row_size, bt.n_embd):
                    return None
                mr, br = _rows(blob, mt), _rows(block_blob, bt)
                if mt.transposed:
                    if not np.array_equal(mr[:, probe, :], br[:, src[probe], :]):
                        return None
                elif not np.array_equal(mr[probe], br[src[probe]]):
                    return None
        orders.append(np.where(shared, ms.positions, -1).astype(np.int32))
        keep = ~shared
        n_priv = int(keep.sum())
        if n_priv == 0:
            parts.append(_zeros(n_st))
            continue
        parts.append(_zeros(ms.index))  # the streams before this sequence's
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
    lens = np.array([len(o) for o in orders], dtype=np.int32)
    order = np.concatenate([np.array([len(orders)], np.int32), lens, *orders]) if orders else np.zeros(1, np.int32)
    return np.concatenate(parts), order


def _runs(shared: np.ndarray, sh_src: np.ndarray) -> list[tuple[int, bool, int, int]] | None:
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
          sh_src: np.ndarray, runs: list[tuple[int, bool, int, int]] | None, axis: int) -> None:
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


def join_state(block_blob: np.ndarray, private_blob: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Rebuild a member's blob from the shared block and its private part (see `split_state`)."""
    block_blob = np.asarray(block_blob, dtype=np.uint8).reshape(-1)
    private_blob = np.asarray(private_blob, dtype=np.uint8).reshape(-1)
    order = np.asarray(order, dtype=np.int32)
    blk = parse_state(block_blob)
    prv = parse_state(private_blob)
    n_sec = int(order[0]) if len(order) else 0
    if n_sec != len(prv.sections) or len(order) < 1 + n_sec:
        raise CodecError(f"order array describes {n_sec} sections, the private blob has {len(prv.sections)}")
    lens = order[1 : 1 + n_sec]
    if int(lens.sum()) != len(order) - 1 - n_sec:
        raise CodecError("order array is truncated")
    srcs = np.split(order[1 + n_sec :], np.cumsum(lens)[:-1]) if n_sec else []
    bsecs = _match_sections(prv, blk)
    # sizes first, then one allocation
    plan = []
    total = _HDR_BYTES
    for psec, bsec, src in zip(prv.sections, bsecs, srcs):
        ps, bs = _stream_of(psec), _stream_of(bsec)
        n = len(src)
        shared = src >= 0
        n_priv = n - int(shared.sum())
        if ps is not None and ps.n_cells != n_priv:
            raise CodecError(f"private blob has {ps.n_cells} cells in section {psec.index}, the order array {n_priv}")
        if n_priv and (ps is None or ps.n_cells == 0):
            raise CodecError("order array expects private cells the blob does not have")
        if shared.any():
            if bs is None or bs.n_cells == 0:
                raise CodecError(f"the order array needs shared cells the block lacks in section {bsec.index}")
            srt = np.argsort(bs.positions, kind="stable")
            want = src[shared]
            at = np.searchsorted(bs.positions[srt], want)
            at[at >= len(srt)] = 0
            if not np.array_equal(bs.positions[srt][at], want):
                raise CodecError(f"the shared block lacks positions the order array needs in section {bsec.index}")
            src = src.copy()
            src[shared] = srt[at]  # positions -> the block's cell indices
        ref = ps if n_priv else bs  # tensor headers / cell stride come from whichever has cells
        total += 4 + 4 * max(1, len(psec.streams))
        if n and ref is not None:
            total += n * _cell_stride(ref) + 8
            for t in ref.k + ref.v:
                per = t.n_embd * t.row_size if t.transposed else t.row_size
                total += _TENSOR_HDR if t.transposed else (t.data_offset - t.header_offset)
                total += n * per
        plan.append((psec, ps, bs, src, shared, ref))
    out = np.empty(total, dtype=np.uint8)
    out[:_HDR_BYTES] = private_blob[:_HDR_BYTES]
    o = _HDR_BYTES
    for psec, ps, bs, src, shared, ref in plan:
        n = len(src)
        out[o : o + 4] = private_blob[psec.offset : psec.offset + 4]
        o += 4
        n_st = max(1, len(psec.streams))
        if n == 0:
            out[o : o + 4 * n_st] = 0
            o += 4 * n_st
            continue
        # the stream with cells: the private part's, else the member's own (its seq id)
        si = ps.index if (ps is not None and ps.n_cells) else int(np.frombuffer(private_blob[4:8].tobytes(), np.int32)[0])
        si = si if 0 <= si < n_st else 0
        out[o : o + 4 * si] = 0
        o += 4 * si
        out[o : o + 4] = np.frombuffer(np.uint32(n).tobytes(), np.uint8)
        o += 4
        tail_zeros = 4 * (n_st - 1 - si)
        sh_src = src[shared]
        runs = _runs(shared, sh_src)
        stride = _cell_stride(ref)
        cells = out[o : o + n * stride].reshape(n, stride)
        _fill(
            cells,
            block_blob[bs.cells_offset : bs.cells_offset + bs.cells_size].reshape(bs.n_cells, stride) if shared.any() else None,
            private_blob[ps.cells_offset : ps.cells_offset + ps.cells_size].reshape(ps.n_cells, stride)
            if not shared.all() else None,
            shared, sh_src, runs, 0,
        )
        if shared.any():
            cells[shared, stride - 4 :] = private_blob[4:8]  # the member's own seq id (llama.cpp ignores it on load)
        o += n * stride
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
                shared, sh_src, runs, 1 if rt.transposed else 0,
            )
            o += size
        out[o : o + tail_zeros] = 0
        o += tail_zeros
    assert o == total
    return out
