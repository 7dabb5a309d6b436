"""Where each format's rounding steps have their ties, derived from ``reference`` (no copies).

The tie distributions build inputs ``x = m * 2**-k`` with ``m`` a midpoint of the element grid
and an amax that makes the encode scale exactly ``2**k`` (``amax = scale_numerator * 2**-k``),
or one fp32 ulp either side of it.  This module names, per format, the scale numerator and the
signed grid points and midpoints in scaled units.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from moe_fq_parity.reference.formats import IntGrid, MinifloatGrid, format_spec


def scale_numerator(fmt: str, *, unsigned: bool = False) -> float:
    """``c`` with encode scale ``s = RN(c / amax)`` (``FormatSpec.scale_numerator``): INT qmax, FP8 448,
    NVFP4 448*6 (global scale)."""
    return format_spec(fmt).scale_numerator(unsigned=unsigned)


@lru_cache(maxsize=None)
def _minifloat_points(grid: MinifloatGrid) -> tuple[float, ...]:
    """Non-negative values of a minifloat grid, found by rounding every finite positive bf16 value."""
    bits = torch.arange(0, 0x7F80, dtype=torch.int32).to(torch.int16)
    allbf = bits.view(torch.bfloat16).to(torch.float32)
    return tuple(torch.unique(grid.round(allbf)).tolist())


def grid_points(fmt: str, *, unsigned: bool = False, narrow_range: bool = False) -> torch.Tensor:
    """Sorted signed fp32 values of the element grid in scaled units (INT integers, FP8/FP4 codes)."""
    grid = format_spec(fmt).grid
    if isinstance(grid, IntGrid):
        lo, qmax = grid.bounds(unsigned=unsigned, narrow_range=narrow_range)
        return torch.arange(lo, qmax + 1, dtype=torch.float32)
    pos = torch.tensor(_minifloat_points(grid), dtype=torch.float32)
    return torch.cat([-pos.flip(0)[:-1], pos])


def midpoints(fmt: str, *, unsigned: bool = False, narrow_range: bool = False) -> torch.Tensor:
    """Rounding boundaries between adjacent grid points (exact in fp32): where ties sit."""
    g = grid_points(fmt, unsigned=unsigned, narrow_range=narrow_range)
    return (g[1:] + g[:-1]) * 0.5


def block_scale_midpoints(fmt: str) -> torch.Tensor:
    """Positive midpoints of a block format's block-scale grid (NVFP4: E4M3): the ties of its
    block-scale rounding step."""
    block = format_spec(fmt).block
    if block is None:
        raise ValueError(f"{fmt} has no block scales")
    pos = torch.tensor(_minifloat_points(block.scale_grid), dtype=torch.float32)
    return (pos[1:] + pos[:-1]) * 0.5
