"""Exhaustive check that the INT dequantization ``y = RN(q / s)`` formulas of the kernel are exact.

``python -m moe_fq_parity.kernels.divproof`` checks, for every fp32 mantissa of ``s`` (all 2**23 values of ``s`` in
[1, 2)) and every odd integer ``m`` in 1..127, that

* ``markstein``: ``y0 = RN(m*r); rho = fma(-y0, s, m); y = fma(rho, r, y0)`` with ``r = RN(1/s)``
* ``fp64``:      ``y = RN32(RN64(m / s))``

equal the correctly rounded quotient ``RN32(m / s)`` (numpy's float32 division, which is IEEE).
That covers every ``|q| <= 128`` and every normal ``s``: multiplying ``m`` or ``s`` by a power of
two scales every intermediate exactly (the kernel keeps all of them normal: ``s2 = 256 s`` is in
[2**-118, 2**40] and ``m <= 128``), and ``q = 0`` gives ``+0`` in both formulas (the sign is put back
separately).  The fma is emulated exactly in float64 with the double-rounding case repaired.
Takes about three minutes on one core; ``--mantissas K`` checks a strided subset.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

_F32 = np.float32


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded fp32 ``a*b+c`` for fp32 arrays (float64 product is exact; the one case where
    rounding the float64 sum to fp32 rounds twice, an exact fp32 midpoint, is decided by the error)."""
    a64, b64, c64 = (v.astype(np.float64) for v in (a, b, c))
    p = a64 * b64
    t = p + c64
    bb = t - p
    err = (p - (t - bb)) + (c64 - bb)  # exact error of the float64 sum (TwoSum)
    t32 = t.astype(_F32)
    d = t - t32.astype(np.float64)
    hi = np.nextafter(t32, _F32(np.inf))
    lo = np.nextafter(t32, _F32(-np.inf))
    nb = np.where(d > 0, hi, lo).astype(np.float64)
    tie = (d != 0) & (t == (t32.astype(np.float64) + nb) / 2)
    res = np.where(tie & (err > 0) & (d > 0), hi, t32)
    return np.where(tie & (err < 0) & (d < 0), lo, res)


def markstein(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    r = _F32(1) / s
    y0 = (m * r).astype(_F32)
    rho = fma_f32(-y0, s, m)
    return fma_f32(rho, r, y0)


def via_fp64(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    return (m.astype(np.float64) / s.astype(np.float64)).astype(_F32)


def count_failures(step: int = 1) -> dict[str, int]:
    """Number of ``(s, m)`` pairs where each formula differs from ``RN32(m/s)``."""
    mant = np.arange(0, 2**23, step, dtype=np.uint32)
    s = (mant | np.uint32(127 << 23)).view(_F32)
    fails = {"markstein": 0, "fp64": 0, "naive_m_times_recip": 0}
    for m_int in range(1, 128, 2):
        m = np.full_like(s, _F32(m_int))
        want = m / s
        fails["markstein"] += int((markstein(m, s) != want).sum())
        fails["fp64"] += int((via_fp64(m, s) != want).sum())
        fails["naive_m_times_recip"] += int(((m * (_F32(1) / s)).astype(_F32) != want).sum())
    return fails


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mantissas", type=int, default=2**23, help="how many of the 2**23 mantissas (strided)")
    args = ap.parse_args(argv)
    step = max(1, 2**23 // max(1, args.mantissas))
    t0 = time.time()
    fails = count_failures(step)
    pairs = len(range(0, 2**23, step)) * 64
    print(f"checked {pairs} (s, m) pairs in {time.time() - t0:.1f}s")
    for name, n in fails.items():
        print(f"  {name:22s} {n} differ from RN(m/s)")
    return 0 if fails["markstein"] == 0 and fails["fp64"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
