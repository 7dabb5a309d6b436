"""A plain copy through the forward kernel's tensor-of-pointers tiling (benchmark diagnostic only).

Same program geometry, expert table and access hints as ``fwd_kernel``, no arithmetic: its
bandwidth is what the access pattern alone reaches, so the gap to the forward kernel is the cost
of the arithmetic and the gap to ``torch`` copy the cost of the tiling.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import expert_geometry, expert_ptr, tile_2d, tile_count


@triton.jit
def tiled_copy_kernel(x_ptr, y_ptr, meta_ptr, n_experts, VEC: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, TPP: tl.constexpr):
    p = tl.program_id(0)
    e = tl.program_id(1)
    rows, cols = expert_geometry(meta_ptr, n_experts, 0, 0, e, True, VEC, False)
    n_tc, n_t = tile_count(rows, cols, BR, BC)
    xb = expert_ptr(x_ptr, meta_ptr, 0, n_experts, e, rows, cols, True, VEC)
    yb = expert_ptr(y_ptr, meta_ptr, 1, n_experts, e, rows, cols, True, VEC)
    for k in range(TPP):
        t = p * TPP + k
        if t < n_t:
            tile0, offs, r, rmask, mask = tile_2d(t, n_tc, rows, cols, BR, BC)
            tl.store(yb + tile0 + offs, tl.load(xb + tile0 + offs, mask=mask, eviction_policy="evict_first"), mask=mask)
