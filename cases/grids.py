"""Where each format's rounding steps have their ties, derived from ``reference`` (no copies).

The tie distributions build inputs ``x = m * 2**-k`` with ``m`` a midpoint of the element grid
and an amax that makes the encode scale exactly ``2**k`` (``amax = scale_numerator * 2**-k``),
or one fp32 ulp either side of it.  This module names, per format, the scale numerator and the
signed grid points and midpoints in scaled units.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from moe_fq_parity.reference.constants import E4M3_MAX, NVFP4_GLOBAL_SCALE_NUM, int_bounds
from moe_fq_parity.reference.rounding import round_to_e2m1, round_to_e4m3

_INT_BITS = {"int8": 8, "int4": 4}


def scale_numerator(fmt: str, *, unsigned: bool = False) -> float:
    """``c`` with encode scale ``s = RN(c / amax)``: INT qmax, FP8 448, NVFP4 448*6 (global scale)."""
    if fmt in _INT_BITS:
        return int_bounds(_INT_BITS[fmt], unsigned=unsigned, narrow_range=False)[1]
    if fmt == "fp8_e4m3":
        return E4M3_MAX
    if fmt == "nvfp4":
        return NVFP4_GLOBAL_SCALE_NUM
    raise ValueError(f"unknown format {fmt!r}")


@lru_cache(maxsize=None)
def _minifloat_points(kind: str) -> tuple[float, ...]:
    """Non-negative values of E4M3 / E2M1, found by rounding every finite positive bf16 value."""
    bits = torch.arange(0, 0x7F80, dtype=torch.int32).to(torch.int16)
    allbf = bits.view(torch.bfloat16).to(torch.float32)
    rounded = (round_to_e4m3 if kind == "e4m3" else round_to_e2m1)(allbf)
    return tuple(torch.unique(rounded).tolist())


def grid_points(fmt: str, *, unsigned: bool = False, narrow_range: bool = False) -> torch.Tensor:
    """Sorted signed fp32 values of the element grid in scaled units (INT integers, FP8/FP4 codes)."""
    if fmt in _INT_BITS:
        lo, qmax = int_bounds(_INT_BITS[fmt], unsigned=unsigned, narrow_range=narrow_range)
        return torch.arange(lo, qmax + 1, dtype=torch.float32)
    pos = torch.tensor(_minifloat_points("e4m3" if fmt == "fp8_e4m3" else "e2m1"), dtype=torch.float32)
    return torch.cat([-pos.flip(0)[:-1], pos])


def midpoints(fmt: str, *, unsigned: bool = False, narrow_range: bool = False) -> torch.Tensor:
    """Rounding boundaries between adjacent grid points (exact in fp32): where ties sit."""
    g = grid_points(fmt, unsigned=unsigned, narrow_range=narrow_range)
    return (g[1:] + g[:-1]) * 0.5


def e4m3_midpoints() -> torch.Tensor:
    """Positive E4M3 midpoints: the ties of the NVFP4 block-scale rounding step."""
    m = midpoints("fp8_e4m3")
    return m[m > 0]
