"""Clipped straight-through backward: one launch for all N experts.

``grad_in = grad_out where |x| <= amax else +0`` (``reference/ste.py``): the comparison is done in
fp32 on the exactly upcast ``x`` and is inclusive; NaN ``x`` compares false and gives ``+0``.  The
gradient is moved as raw bits (never converted), so every gradient dtype is passed through
exactly.  Pass-through mode needs no kernel at all (the caller returns ``grad_out`` itself).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import expert_base, expert_out_base, program_tile, tile_2d
from .tl_rounding import bits_to_f32


@triton.jit
def clipped_bwd_kernel(
    x_ptr,  # stacked: weight bits [N, rows, cols]; list: placeholder of the weight bits dtype
    g_ptr,  # stacked: grad bits; list: placeholder of the grad bits dtype
    o_ptr,  # output grad bits: stacked [N, rows, cols]; list: one buffer, expert e at meta[1, e]
    meta_ptr,  # list: int64 [5, N] (see tiles.expert_geometry)
    amax_ptr,
    amax_se,
    amax_sr,
    n_experts,
    rows_u,
    cols_u,
    IO: tl.constexpr,
    LIST: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    ALIGNED: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
):
    """Zero the gradient of tile ``program_id(0)`` of expert ``program_id(1)`` where ``|x| > amax``."""
    e, rows, cols, r0, c0, valid = program_tile(meta_ptr, n_experts, rows_u, cols_u, LIST, ALIGNED, BR, BC)
    if valid:
        xb = expert_base(x_ptr, meta_ptr, 0, n_experts, e, rows, cols, LIST, ALIGNED)
        ob = expert_out_base(o_ptr, meta_ptr, n_experts, e, rows, cols, LIST, ALIGNED)
        gb = expert_base(g_ptr, meta_ptr, 4, n_experts, e, rows, cols, LIST, ALIGNED)
        tile0, offs, rl, rmask, mask = tile_2d(r0, c0, rows, cols, BR, BC)
        if PER_CHANNEL:
            a = tl.load(amax_ptr + e * amax_se + (r0 + rl) * amax_sr, mask=rmask, other=0.0)
        else:
            a = tl.load(amax_ptr + e * amax_se)
        x = bits_to_f32(tl.load(xb + tile0 + offs, mask=mask, other=0, eviction_policy="evict_first"), IO)
        g = tl.load(gb + tile0 + offs, mask=mask, other=0, eviction_policy="evict_first")
        keep = tl.abs(x) <= a
        tl.store(ob + tile0 + offs, tl.where(keep, g, tl.zeros_like(g)), mask=mask)
