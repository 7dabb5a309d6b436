"""Where each program's tile lies: expert base addresses, shape, and the 2-D tile of the expert.

Shared by the forward and the backward kernel.  Grid: ``(max tiles per expert, N)``; program
``(t, e)`` handles tile ``t`` of expert ``e`` (tiles beyond an expert's own count return at once,
so ragged experts and empty experts need no host-side tile table).  Each expert is a row-major
``[rows, cols]`` matrix; a tile is ``[BR, BC]`` (rows x cols).  Offsets inside an expert are int64
(an expert may hold more than 2**31 elements); offsets inside a tile are int32 (the host checks
``BR * cols < 2**31``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def expert_geometry(meta_ptr, n_experts, rows_u, cols_u, e, LIST: tl.constexpr, ALIGNED: tl.constexpr):
    """``(rows, cols)`` of expert ``e``: from the int64 table ``meta[2:4, N]`` (list) or uniform.

    The list-layout table is ``meta[5, N]``: 0 input address, 1 output offset (elements, from the
    output base pointer), 2 rows, 3 cols, 4 gradient address (backward only).
    """
    if LIST:
        rows = tl.load(meta_ptr + 2 * n_experts + e).to(tl.int32)
        cols = tl.load(meta_ptr + 3 * n_experts + e).to(tl.int32)
    else:  # "+ zeros": an int argument equal to 1 may arrive as a constexpr; make it a tensor
        rows = rows_u + tl.zeros([], tl.int32)
        cols = cols_u + tl.zeros([], tl.int32)
    if ALIGNED:
        cols = tl.multiple_of(cols, 8)
    return rows, cols


@triton.jit
def expert_base(stacked_ptr, meta_ptr, slot, n_experts, e, rows, cols, LIST: tl.constexpr, ALIGNED: tl.constexpr):
    """Base pointer of expert ``e``: ``meta[slot, e]`` as an address (list) or ``ptr + e*rows*cols``.

    In the list layout the pointer type is taken from ``stacked_ptr`` (a placeholder tensor of the
    element type), so the same source serves int16 and int32 bit buffers.
    """
    if LIST:
        addr = tl.load(meta_ptr + slot * n_experts + e)
        if ALIGNED:
            addr = tl.multiple_of(addr, 16)
        return addr.to(stacked_ptr.dtype)
    else:
        return stacked_ptr + e.to(tl.int64) * rows.to(tl.int64) * cols.to(tl.int64)


@triton.jit
def expert_out_base(out_ptr, meta_ptr, n_experts, e, rows, cols, LIST: tl.constexpr, ALIGNED: tl.constexpr):
    """Output base of expert ``e``: ``out_ptr + meta[1, e]`` (list) or ``out_ptr + e*rows*cols``."""
    if LIST:
        off = tl.load(meta_ptr + n_experts + e)
        if ALIGNED:
            off = tl.multiple_of(off, 8)
        return out_ptr + off
    else:
        return out_ptr + e.to(tl.int64) * rows.to(tl.int64) * cols.to(tl.int64)


@triton.jit
def tile_origin(t, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """``(r0, c0, valid)``: first row/col of tile ``t`` and whether the expert has that tile."""
    n_tc = tl.maximum(tl.cdiv(cols, BC), 1)
    n_t = tl.cdiv(rows, BR) * tl.cdiv(cols, BC)
    tr = t // n_tc
    tc = t - tr * n_tc
    return tr * BR, tc * BC, t < n_t


@triton.jit
def program_tile(meta_ptr, n_experts, rows_u, cols_u, LIST: tl.constexpr, ALIGNED: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """``(e, rows, cols, r0, c0, valid)`` of this program: expert, its shape, the tile's origin."""
    t = tl.program_id(0)
    e = tl.program_id(1)
    rows, cols = expert_geometry(meta_ptr, n_experts, rows_u, cols_u, e, LIST, ALIGNED)
    r0, c0, valid = tile_origin(t, rows, cols, BR, BC)
    return e, rows, cols, r0, c0, valid


@triton.jit
def tile_2d(r0, c0, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """``(tile0, offs, rl, rmask, mask)`` of a ``[BR, BC]`` tile: int64 tile start, int32 in-tile
    offsets, local row indices ``[BR, 1]``, row mask and element mask."""
    rl = tl.arange(0, BR)[:, None]
    cl = tl.arange(0, BC)[None, :]
    rmask = (r0 + rl) < rows
    return r0.to(tl.int64) * cols + c0, rl * cols + cl, rl, rmask, rmask & ((c0 + cl) < cols)
