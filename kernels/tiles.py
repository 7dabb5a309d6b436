"""Where each program's tiles lie: expert base addresses, shape, and the 2-D tiles of the expert.

Shared by the forward and the backward kernel.  Grid: ``(cdiv(max tiles per expert, TPP), N)``;
program ``(p, e)`` handles tiles ``p*TPP .. p*TPP+TPP-1`` of expert ``e`` (tiles beyond the
expert's own count are skipped, so ragged and empty experts need no host-side tile table, and the
per-expert scale arithmetic is paid once per ``TPP`` tiles).  Each expert is a row-major
``[rows, cols]`` matrix; a tile is ``[BR, BC]`` (rows x cols).  Offsets inside an expert are int64
(an expert may hold more than 2**31 elements); offsets inside a tile are int32 (the host checks
``BR * cols < 2**31``).

The list-layout table is ``meta[7, N]`` (int64): 0 input offset, 1 output offset, 2 rows, 3 cols,
4 gradient offset (backward only), 5 and 6 rows and cols of the flat view (``geometry.flat_width``;
a launch with ``FLAT`` tiles the experts as those).  Offsets count elements from the kernel's base pointer
arguments (a pointer argument carries Triton's 16-byte alignment facts, which an address turned
into a pointer in the kernel would not: the loads would not be vectorized).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def expert_geometry(meta_ptr, n_experts, rows_u, cols_u, e, LIST: tl.constexpr, CVEC: tl.constexpr, FLAT: tl.constexpr):
    """``(rows, cols)`` of expert ``e``: from ``meta[2:4, e]`` (list; ``meta[5:7, e]``, the flat view,
    with ``FLAT``) or the uniform shape; ``CVEC > 1`` asserts (host-checked) that every ``cols`` is a
    multiple of ``CVEC``."""
    if LIST:
        slot = 5 if FLAT else 2
        rows = tl.load(meta_ptr + slot * n_experts + e).to(tl.int32)
        cols = tl.load(meta_ptr + (slot + 1) * n_experts + e).to(tl.int32)
    else:  # "+ zeros": an int argument equal to 1 may arrive as a constexpr; make it a tensor
        rows = rows_u + tl.zeros([], tl.int32)
        cols = cols_u + tl.zeros([], tl.int32)
    if CVEC > 1:
        cols = tl.multiple_of(cols, CVEC)
    return rows, cols


@triton.jit
def expert_ptr(base_ptr, meta_ptr, slot, n_experts, e, rows, cols, LIST: tl.constexpr, VEC: tl.constexpr):
    """``base_ptr + meta[slot, e]`` (list) or ``base_ptr + e*rows*cols`` (stacked); ``VEC > 1``
    asserts (host-checked) that the list offset is a multiple of ``VEC`` elements (16 bytes)."""
    if LIST:
        off = tl.load(meta_ptr + slot * n_experts + e)
        if VEC > 1:
            off = tl.multiple_of(off, VEC)
        return base_ptr + off
    else:
        return base_ptr + e.to(tl.int64) * rows.to(tl.int64) * cols.to(tl.int64)


@triton.jit
def tile_count(rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """``(column tiles, tiles)`` of a ``[rows, cols]`` expert (column tiles >= 1)."""
    return tl.maximum(tl.cdiv(cols, BC), 1), tl.cdiv(rows, BR) * tl.cdiv(cols, BC)


@triton.jit
def tile_2d(t, n_tc, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """Tile ``t``: ``(tile0, offs, r, rmask, mask)`` = int64 start, int32 in-tile offsets ``[BR, BC]``,
    row indices ``[BR, 1]``, row mask and element mask."""
    tr = t // n_tc
    r0 = tr * BR
    c0 = (t - tr * n_tc) * BC
    rl = tl.arange(0, BR)[:, None]
    cl = tl.arange(0, BC)[None, :]
    rmask = (r0 + rl) < rows
    return r0.to(tl.int64) * cols + c0, rl * cols + cl, r0 + rl, rmask, rmask & ((c0 + cl) < cols)


@triton.jit
def tile_rows(t, n_tc, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """Tile ``t`` as ``[BR, BC]`` rows: ``(tile0, offs, mask)`` (``tile_2d`` without the row
    indices).  Its only axes are the rows and the contiguous columns, so every Triton version lays
    it out alike (lanes along the row, whole 128-byte lines a warp access) and a shared-memory copy
    of it (``tl.range``'s pipelined loads) is row-major: a warp's 16-byte reads of one row fall in
    distinct banks.  Square-block tiles in bf16 pairs load this way and are reshaped to ``[BR // R,
    R, BC // B, B]`` (the same registers: no data moves); ``tile_4d``'s arrangement ``[.., NB, R,
    B]`` copied to shared memory put a row's blocks 512 bytes apart, all in the same banks (NVFP4
    16x16: 63 million bank conflicts in one Ultra call, 86% of copy against 97%)."""
    tr = t // n_tc
    r0 = tr * BR
    c0 = (t - tr * n_tc) * BC
    rl = tl.arange(0, BR)[:, None]
    cl = tl.arange(0, BC)[None, :]
    return r0.to(tl.int64) * cols + c0, rl * cols + cl, ((r0 + rl) < rows) & ((c0 + cl) < cols)


@triton.jit
def tile_aligned(t, BC: tl.constexpr, B: tl.constexpr, K: tl.constexpr = 1, TIES_LOW: tl.constexpr = False):
    """Tile ``t`` of an expert whose tiled rows are multiples of ``BC`` long, in one-row tiles
    (``ALIGNED``, host-checked): it starts at element ``t * BC`` and is whole, so it needs no
    row/column split of ``t`` and no mask.  ``(tile0, offs)``: offsets ``[1, BC]`` (``B = 0``) or,
    for blocks of ``B`` along the row each cut into ``K`` parts, ``[K, BC // B, B // K]``, built as
    ``[BC // B, K, B // K]`` with ``TIES_LOW`` (``env.layout_ties_low``; the kernel's block max
    then reduces axis 1 where it would reduce axis 0).  Either way the compiled kernel places no
    lane and no warp along the parts' axis (NVFP4 at the Ultra launch, bf16 pairs: ``[2, 128, 4]``
    words with sizePerThread ``[1, 1, 4]``, threadsPerWarp ``[1, 32, 1]``, warpsPerCTA ``[1, 2,
    1]``; with Triton 3.6 ``[128, 2, 4]``, ``[32, 1, 1]``, ``[2, 1, 1]``; checked for the 1-D block
    formats that split by ``tests/kernels/test_instructions.py``), so the ``K`` parts of a block
    are one thread's: the block max reduces over the parts' axis and axis 2, and per-block values
    are computed once per thread (``launch.block_split`` chooses ``K``)."""
    tile0 = t.to(tl.int64) * BC
    if B == 0:
        return tile0, tl.arange(0, BC)[None, :]
    elif TIES_LOW:
        return tile0, (tl.arange(0, BC // B)[:, None, None] * B + tl.arange(0, K)[None, :, None] * (B // K)
                       + tl.arange(0, B // K)[None, None, :])  # fmt: skip
    else:
        return tile0, (tl.arange(0, K)[:, None, None] * (B // K) + tl.arange(0, BC // B)[None, :, None] * B
                       + tl.arange(0, B // K)[None, None, :])  # fmt: skip


@triton.jit
def tile_3d(t, n_tc, rows, cols, BR: tl.constexpr, BC: tl.constexpr, B: tl.constexpr):
    """Tile ``t`` as ``[BR, BC // B, B]`` (blocks of ``B`` along the row): ``(tile0, offs, mask)``;
    a short last block of a row is masked (its padding loads as zero)."""
    tr = t // n_tc
    r0 = tr * BR
    c0 = (t - tr * n_tc) * BC
    rl = tl.arange(0, BR)[:, None, None]
    cl = tl.arange(0, BC // B)[None, :, None] * B + tl.arange(0, B)[None, None, :]
    return r0.to(tl.int64) * cols + c0, rl * cols + cl, ((r0 + rl) < rows) & ((c0 + cl) < cols)


@triton.jit
def tile_4d(t, n_tc, rows, cols, BR: tl.constexpr, BC: tl.constexpr, R: tl.constexpr, B: tl.constexpr, ROWS_INNER: tl.constexpr,
            K: tl.constexpr = 1, TIES_LOW: tl.constexpr = False):
    """Tile ``t`` of square ``R x B`` blocks (``BR`` a multiple of ``R``, so every block starts on a
    row multiple of ``R``): ``(tile0, offs, mask)``; the rows and columns of a partial block past
    the expert's edge are masked (they load as zero).  Two layouts, each built in the arrangement
    that gives it under the installed Triton's tie rule (``TIES_LOW``, ``env.layout_ties_low``).
    bf16 pairs outside ``ROWS_INNER`` take ``tile_rows`` instead (the default's lanes, no
    arrangement to choose):

    * default (int16 and fp32 input): a row of the tile's blocks on a warp's lanes, the rows
      across lanes and warps: ``[BR // R, R, BC // B, B]`` (``[BR // R, BC // B, R, B]`` with
      ``TIES_LOW``); the block max reduces over the columns and, across the warps through shared
      memory, the rows (NVFP4 16x16 in 2048 x 2 tiles: threadsPerWarp ``[1, 2, 8, 2]``, with Triton
      3.6 ``[1, 8, 2, 2]`` over its arrangement).  Each warp access covers whole 128-byte lines.
    * ``ROWS_INNER`` (``BR == R``, blocks of at most 1024 elements): ``[K, BC // B, R // K, B]``,
      row ``k * (R // K) + i`` (``[R // K, BC // B, K, B]`` with ``TIES_LOW``; the same reduction
      over axes 0, 2 and 3): a block's ``R // K`` rows x ``B`` columns on the lanes of one warp,
      its ``K`` row groups in one thread (``launch.square_split``), the warps on different blocks:
      no shared memory, no barrier, fewer instructions, but narrower accesses (MX 32x32: 64 bytes
      of a row per warp access) and more registers; measured slower from memory
      (``launch.KernelConfig.square_rows_on_lanes``).
    """
    tr = t // n_tc
    r0 = tr * BR
    c0 = (t - tr * n_tc) * BC
    if ROWS_INNER:
        if TIES_LOW:
            rl = tl.arange(0, R // K)[:, None, None, None] + tl.arange(0, K)[None, None, :, None] * (R // K)
            cl = tl.arange(0, BC // B)[None, :, None, None] * B + tl.arange(0, B)[None, None, None, :]
        else:
            rl = tl.arange(0, K)[:, None, None, None] * (R // K) + tl.arange(0, R // K)[None, None, :, None]
            cl = tl.arange(0, BC // B)[None, :, None, None] * B + tl.arange(0, B)[None, None, None, :]
    elif TIES_LOW:
        rl = tl.arange(0, BR // R)[:, None, None, None] * R + tl.arange(0, R)[None, None, :, None]
        cl = tl.arange(0, BC // B)[None, :, None, None] * B + tl.arange(0, B)[None, None, None, :]
    else:
        rl = tl.arange(0, BR // R)[:, None, None, None] * R + tl.arange(0, R)[None, :, None, None]
        cl = tl.arange(0, BC // B)[None, None, :, None] * B + tl.arange(0, B)[None, None, None, :]
    return r0.to(tl.int64) * cols + c0, rl * cols + cl, ((r0 + rl) < rows) & ((c0 + cl) < cols)
