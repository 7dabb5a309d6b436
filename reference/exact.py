"""Exact-arithmetic oracle: the real-number fake-quant functions, for tests only.

Every scale, product and quotient here is an exact rational (``fractions.Fraction``); the only
roundings are the ones the *format* defines (grid rounding, the E4M3 block scale of NVFP4) and
one final round-to-nearest-even into the output dtype.  The fp32 reference differs from this
only where an fp32 rounding moves a value across a tie:

* the pre-rounding value ``x*s`` lies within a few fp32 ulps of a grid boundary (scale or product
  rounding), or
* the NVFP4 block-scale argument ``vmax*ge/6`` lies within a few fp32 ulps of an E4M3 boundary, or
* the exact result lies within one fp32 ulp of a midpoint of the output dtype (the fp32 result
  is rounded twice: fp32, then bf16).

Slow (pure Python); meant for small Hypothesis examples.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import torch

from .constants import E2M1_GRID, E4M3_MAX, NVFP4_BLOCK, NVFP4_GLOBAL_SCALE_NUM, TINY_AMAX, int_bounds


def _e4m3_values() -> list[Fraction]:
    vals = set()
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue  # NaN
            v = Fraction(m, 8) * Fraction(2) ** -6 if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
            vals.add(v)
    return sorted(vals)


E4M3_POSITIVE = _e4m3_values()
E2M1_POSITIVE = [Fraction(v) for v in E2M1_GRID]


def round_to_grid(v: Fraction, grid: Sequence[Fraction]) -> Fraction:
    """Nearest value of a sign-symmetric grid (given by its non-negative values, code order),
    ties to the even code, saturating at the largest value."""
    mag = abs(v)
    if mag >= grid[-1]:
        r = grid[-1]
    else:
        hi = next(i for i, g in enumerate(grid) if g >= mag)
        if grid[hi] == mag or hi == 0:
            r = grid[hi]
        else:
            lo = hi - 1
            d_lo, d_hi = mag - grid[lo], grid[hi] - mag
            r = grid[lo] if d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0) else grid[hi]
    return -r if v < 0 else r


def round_to_dtype(y: Fraction, dtype: torch.dtype) -> float:
    """Exact ``y`` -> nearest value of ``dtype`` (ties to even), returned as a Python float."""
    approx = torch.tensor(float(y), dtype=torch.float64).to(dtype)
    bits_dtype = torch.int16 if dtype in (torch.bfloat16, torch.float16) else torch.int32
    best = None
    for step in (-1, 0, 1):
        b = approx.view(bits_dtype) + step if approx.item() >= 0 else approx.view(bits_dtype) - step
        c = b.view(dtype)
        if not torch.isfinite(c):
            continue
        cf = Fraction(c.item())
        d = abs(cf - y)
        even = int(b.item()) % 2 == 0
        if best is None or d < best[0] or (d == best[0] and even):
            best = (d, c.item())
    return best[1]


def int_exact(x: float, amax: float, *, num_bits: int, unsigned: bool = False, narrow_range: bool = False) -> Fraction:
    """Real-number INT fake quant of one finite value (before output rounding)."""
    lo, qmax = int_bounds(num_bits, unsigned=unsigned, narrow_range=narrow_range)
    if amax < TINY_AMAX:
        return Fraction(0)
    s = Fraction(int(qmax)) / Fraction(amax)
    q = min(max(round(Fraction(x) * s), int(lo)), int(qmax))
    return q / s


def fp8_exact(x: float, amax: float) -> Fraction:
    """Real-number FP8 E4M3 fake quant of one finite value (before output rounding)."""
    a = Fraction(1) if amax <= TINY_AMAX else Fraction(amax)
    s = Fraction(int(E4M3_MAX)) / a
    return round_to_grid(Fraction(x) * s, E4M3_POSITIVE) / s


def nvfp4_exact_block(xs: Sequence[float], global_amax: float) -> list[Fraction]:
    """Real-number NVFP4 (TE recipe) of one block of finite values (before output rounding)."""
    g = Fraction(global_amax)
    ge = Fraction(int(NVFP4_GLOBAL_SCALE_NUM)) / g if g else None
    if ge is None:
        ge = Fraction(torch.finfo(torch.float32).max)
    vmax = max((abs(Fraction(v)) for v in xs), default=Fraction(0))
    ds8 = round_to_grid(vmax * ge / 6, E4M3_POSITIVE)
    if ds8 == 0:
        return [Fraction(0) for _ in xs]
    es = ge / ds8
    return [round_to_grid(Fraction(v) * es, E2M1_POSITIVE) * ds8 / ge for v in xs]


def nvfp4_exact_row(row: Sequence[float], global_amax: float, block_size: int = NVFP4_BLOCK) -> list[Fraction]:
    """NVFP4 exact over a row, in blocks of ``block_size`` (last block shorter)."""
    out: list[Fraction] = []
    for i in range(0, len(row), block_size):
        out.extend(nvfp4_exact_block(row[i : i + block_size], global_amax))
    return out
