"""A plain copy through the forward kernel's tensor-of-pointers tiling (benchmark diagnostic only).

Same program geometry, expert table and access hints as ``fwd_kernel``, no arithmetic: its
bandwidth is what the access pattern alone reaches, so the gap to the forward kernel is the cost
of the arithmetic and the gap to ``torch`` copy the cost of the tiling.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import expert_base, expert_out_base, program_tile, tile_2d


@triton.jit
def tiled_copy_kernel(x_ptr, y_ptr, meta_ptr, n_experts, ALIGNED: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    e, rows, cols, r0, c0, valid = program_tile(meta_ptr, n_experts, 0, 0, True, ALIGNED, BR, BC)
    if valid:
        xb = expert_base(x_ptr, meta_ptr, 0, n_experts, e, rows, cols, True, ALIGNED)
        yb = expert_out_base(y_ptr, meta_ptr, n_experts, e, rows, cols, True, ALIGNED)
        tile0, offs, rl, rmask, mask = tile_2d(r0, c0, rows, cols, BR, BC)
        bits = tl.load(xb + tile0 + offs, mask=mask, eviction_policy="evict_first")
        tl.store(yb + tile0 + offs, bits, mask=mask)
