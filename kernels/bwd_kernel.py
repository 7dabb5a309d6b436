"""Clipped straight-through backward: one launch for all N experts.

``grad_in = grad_out where |x| <= amax else +0`` (``reference/ste.py``): the comparison is done in
fp32 on the exactly upcast ``x`` and is inclusive; NaN ``x`` compares false and gives ``+0``.  The
gradient is moved as raw bits (never converted), so every gradient dtype is passed through
exactly.  Pass-through mode needs no kernel at all (the caller returns ``grad_out`` itself).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import expert_geometry, expert_ptr, tile_2d, tile_count
from .tl_rounding import bits_to_f32


# n_experts is not specialised: Triton makes an int argument equal to 1 a constant, so a one-expert
# call would otherwise compile a kernel of its own (about a second per variant on a cold cache).
@triton.jit(do_not_specialize=["n_experts"])
def clipped_bwd_kernel(
    x_ptr,  # weight bits: stacked [N, rows, cols]; list: base, expert e at x_ptr + meta[0, e]
    g_ptr,  # gradient bits: stacked; list: base, expert e at g_ptr + meta[4, e]
    o_ptr,  # output gradient bits: stacked; list: one buffer, expert e at o_ptr + meta[1, e]
    meta_ptr,  # list: int64 [7, N] (see kernels/tiles.py)
    amax_ptr,
    amax_se,
    amax_sr,
    n_experts,
    rows_u,
    cols_u,
    IO: tl.constexpr,
    LIST: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    XVEC: tl.constexpr,
    GVEC: tl.constexpr,
    CVEC: tl.constexpr,
    FLAT: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
    TPP: tl.constexpr,
):
    """Zero the gradient of tiles ``program_id(0)*TPP ..`` of expert ``program_id(1)`` where ``|x| > amax``."""
    p = tl.program_id(0)
    e = tl.program_id(1)
    rows, cols = expert_geometry(meta_ptr, n_experts, rows_u, cols_u, e, LIST, CVEC, FLAT)
    n_tc, n_t = tile_count(rows, cols, BR, BC)
    if p * TPP < n_t:
        xb = expert_ptr(x_ptr, meta_ptr, 0, n_experts, e, rows, cols, LIST, XVEC)
        ob = expert_ptr(o_ptr, meta_ptr, 1, n_experts, e, rows, cols, LIST, GVEC)
        gb = expert_ptr(g_ptr, meta_ptr, 4, n_experts, e, rows, cols, LIST, GVEC)
        if not PER_CHANNEL:
            a = tl.load(amax_ptr + e * amax_se)
        for k in range(TPP):
            t = p * TPP + k
            if t < n_t:
                tile0, offs, r, rmask, mask = tile_2d(t, n_tc, rows, cols, BR, BC)
                if PER_CHANNEL:
                    a = tl.load(amax_ptr + e * amax_se + r * amax_sr, mask=rmask, other=0.0)
                x = bits_to_f32(tl.load(xb + tile0 + offs, mask=mask, other=0, eviction_policy="evict_first"), IO)
                g = tl.load(gb + tile0 + offs, mask=mask, other=0, eviction_policy="evict_first")
                tl.store(ob + tile0 + offs, tl.where(tl.abs(x) <= a, g, tl.zeros_like(g)), mask=mask)
