"""An independent evaluation of the INT and FP8 formulas with numpy float32 arithmetic.

Shares no code with ``reference/``: numpy's float32 ``*``/``/`` are IEEE round-to-nearest, the
bf16 rounding is done on the uint32 bits, and E4M3 rounding is a nearest-value search over the
256 decoded code points (ties to the even code).
"""

from __future__ import annotations

import numpy as np


def bf16_bits_from_f32(y: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns (int16), round to nearest even; NaN -> 0x7FFF (CUDA canonical)."""
    b = y.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    r = np.where(np.isnan(y), np.uint16(0x7FFF), r)
    return r.view(np.int16)


def f32_from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.int16).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _e4m3_table() -> np.ndarray:
    vals = []
    for code in range(0x7F):  # non-negative codes 0x00..0x7E (0x7F is NaN)
        e, m = code >> 3, code & 7
        vals.append(np.ldexp(m / 8.0, -6) if e == 0 else np.ldexp(1 + m / 8.0, e - 7))
    return np.array(vals, dtype=np.float64)


E4M3 = _e4m3_table()


def e4m3_round(v: np.ndarray) -> np.ndarray:
    """Nearest E4M3 value (float32), ties to even code, saturating at 448, NaN kept."""
    v = v.astype(np.float32)
    mag = np.minimum(np.abs(v).astype(np.float64), 448.0)
    hi = np.clip(np.searchsorted(E4M3, mag), 0, len(E4M3) - 1)
    lo = np.clip(hi - 1, 0, None)
    d_lo, d_hi = mag - E4M3[lo], E4M3[hi] - mag
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0))
    r = np.where(pick_lo, E4M3[lo], E4M3[hi])
    r = np.where(E4M3[hi] == mag, E4M3[hi], r)
    out = np.copysign(r, v).astype(np.float32)
    return np.where(np.isnan(v), np.float32(np.nan), out)


def int_fake_quant_bits(x_bits: np.ndarray, amax: float, num_bits: int, narrow: bool) -> np.ndarray:
    """CUDA-extension INT formula on bf16 bit patterns (docs/measured.md §5), numpy fp32."""
    x = f32_from_bf16_bits(x_bits)
    qmax = np.float32(2 ** (num_bits - 1) - 1)
    lo = -qmax if narrow else -qmax - np.float32(1)
    a = np.float32(amax)
    with np.errstate(all="ignore"):
        s = np.float32(qmax / a)
        q = np.clip(np.rint(x * s), lo, qmax)
        y = (q / s).astype(np.float32)
    if a < np.float32(2.0**-24):
        y = np.zeros_like(x)
    return bf16_bits_from_f32(y)


def fp8_fake_quant_bits(x_bits: np.ndarray, amax: float) -> np.ndarray:
    """CUDA-extension FP8 E4M3 formula on bf16 bit patterns, numpy fp32."""
    x = f32_from_bf16_bits(x_bits)
    a = np.float32(1.0) if np.float32(amax) <= np.float32(2.0**-24) else np.float32(amax)
    with np.errstate(all="ignore"):
        s = np.float32(np.float32(448.0) / a)
        inv = np.float32(np.float32(1.0) / s)
        y = (e4m3_round(x * s) * inv).astype(np.float32)
    return bf16_bits_from_f32(y)
