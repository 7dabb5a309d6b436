"""An independent evaluation of the MX and FP8 block-wise formulas with numpy and ``math``.

Shares no code with ``reference/``: tiles are numpy slices of a zero-padded copy, block amax is
``np.max`` of magnitudes, exponents come from ``math.frexp`` on float64 values (never from fp32
bit fields), E8M0 codes are decoded with ``math.ldexp``, element rounding is a nearest-value search
over the decoded code points (ties to the even code, ``numpy_oracle.e4m3_round`` for E4M3), and the
fp32 operations are numpy float32 ``*``/``/`` (IEEE round to nearest).
"""

from __future__ import annotations

import math

import numpy as np

from .numpy_oracle import e4m3_round

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
ELEM = {"mxfp8": (8, 3, 448.0), "mxfp4": (2, 1, 6.0)}
F32_TINY = 2.0**-126
F32_MAX = float(np.finfo(np.float32).max)


def e2m1_round(v: np.ndarray, ties: str = "even") -> np.ndarray:
    """Nearest E2M1 value; ``ties``: ``even`` (the even code) or ``zero`` (the smaller magnitude)."""
    mag = np.minimum(np.abs(v).astype(np.float64), 6.0)
    hi = np.clip(np.searchsorted(E2M1, mag), 0, 7)
    lo = np.clip(hi - 1, 0, None)
    d_lo, d_hi = mag - E2M1[lo], E2M1[hi] - mag
    tie_lo = (lo % 2 == 0) if ties == "even" else np.ones_like(lo, dtype=bool)
    r = np.where((d_lo < d_hi) | ((d_lo == d_hi) & tie_lo), E2M1[lo], E2M1[hi])
    r = np.where(E2M1[hi] == mag, E2M1[hi], r)
    return np.where(np.isnan(v), np.nan, np.copysign(r, v)).astype(np.float32)


def _floor_log2(a: float) -> int:
    return math.frexp(a)[1] - 1


def mx_code(a: float, variant: str, fmt: str) -> int:
    """The E8M0 code of block amax ``a`` (a Python float holding an fp32 value)."""
    emax, mbits, mx = ELEM[fmt]
    if variant.startswith("torchao_") and variant != "torchao_rceil":
        # torchao 0.18.0: only NaN gives 255; an Inf (or even-rounded-to-Inf) amax reads exponent 128
        if math.isnan(a):
            return 255
        if math.isinf(a):
            return 128 - emax + 127
        code = mx_code(a, variant[len("torchao_"):], fmt)
        return 128 - emax + 127 if code == 255 else code
    if variant in ("floor", "ceil", "even"):
        if math.isnan(a) or math.isinf(a):
            return 255
        if a < F32_TINY:  # zero or fp32 subnormal: the exponent field reads -127
            e = -127
            if variant == "ceil" and a > 0:
                e += 1
            if variant == "even" and a >= F32_TINY * (1 - 2.0 ** -(mbits + 1)):
                e = -126
        else:
            e = _floor_log2(a)
            if variant == "ceil" and a != math.ldexp(1.0, e):
                e += 1
            if variant == "even" and a >= math.ldexp(2 - 2.0 ** -(mbits + 1), e):
                e += 1
                if e > 127:
                    return 255
        return max(-127, min(128, e - emax)) + 127
    if variant == "te" and fmt == "mxfp4":  # TE's pure-torch MXFP4: ceil(log2(A / 6)), NaN -> a NaN scale
        return mx_code(a, "torchao_rceil", fmt)
    if variant in ("rceil", "te"):
        d = float(np.float32(a) * (np.float32(1.0) / np.float32(mx)))  # the rounded reciprocal, then the product
        if math.isnan(d):
            return 255
        if math.isinf(d):
            return 255 if variant == "rceil" else 254
        if d == 0:
            return 0
        if d < F32_TINY:
            return 1 if d > 2.0**-127 else 0
        e = _floor_log2(d)
        bump = d != math.ldexp(1.0, e)
        if variant == "te" and e + 127 == 254:
            bump = False
        return e + 127 + int(bump)
    if variant in ("modelopt", "torchao_rceil"):
        d = float(np.float32(a) / np.float32(mx))
        if math.isnan(d) and variant == "torchao_rceil":
            return 255
        if not d > 0:
            return 0
        if math.isinf(d):
            return 254
        e = math.ceil(float(np.float32(math.log2(d))))
        return max(-127, min(127, e)) + 127
    raise ValueError(variant)


def _tiles(x: np.ndarray, tile: tuple[int, int]):
    """Yield (row slice, col slice) of every tile of the 2-D ``x``."""
    o, k = x.shape
    r, c = tile
    for i in range(0, o, r):
        for j in range(0, k, c):
            yield slice(i, min(i + r, o)), slice(j, min(j + c, k))


def mx_fake_quant(x: np.ndarray, fmt: str, variant: str, tile: tuple[int, int]) -> np.ndarray:
    """fp32 output of MX fake quant of the 2-D fp32 array ``x``."""
    y = np.zeros_like(x, dtype=np.float32)
    rnd = e4m3_round if fmt == "mxfp8" else e2m1_round
    for rs, cs in _tiles(x, tile):
        blk = x[rs, cs].astype(np.float32)
        mags = np.abs(blk)
        if variant == "te" and fmt == "mxfp8":  # TE's C++ amax skips NaN (std::max from 0)
            mags = mags[~np.isnan(mags)]
        a = float(np.max(mags)) if mags.size else 0.0
        modelopt_fp4 = fmt == "mxfp4" and variant == "modelopt"
        te_fp4 = fmt == "mxfp4" and variant == "te"
        if modelopt_fp4 and not math.isfinite(a):  # Model-Optimizer's MXFP4: inf/NaN exponent, every element -0
            y[rs, cs] = -0.0
            continue
        code = mx_code(a, variant, fmt)
        if code == 255:
            y[rs, cs] = np.nan
            continue
        inv = math.ldexp(1.0, 127 - code)
        if code == 0 and variant == "torchao_rceil":
            inv = 1.0
        if code == 0 and variant in ("torchao_floor", "torchao_ceil", "torchao_even"):  # scale clamped to 2**-126
            inv = math.ldexp(1.0, 126)
        with np.errstate(all="ignore"):
            v = (blk.astype(np.float64) * inv).astype(np.float32)
            if modelopt_fp4:  # ties toward zero; negative unless v > 0 (+0 -> -0)
                q = np.abs(e2m1_round(v, ties="zero")).astype(np.float64)
                q = np.where(v > 0, q, -q)
            elif te_fp4:  # TE's cast_to_fp4x2: -0.0 and NaN coded +0
                q = rnd(v).astype(np.float64)
                q = np.where((v == 0) | np.isnan(v), 0.0, q)
            else:
                q = rnd(v).astype(np.float64)
            y[rs, cs] = (q * math.ldexp(1.0, code - 127)).astype(np.float32)
    return y


def _ceil_pow2(d: float) -> float:
    """The least power of two >= ``d > 0`` (exact: ``math.frexp``)."""
    m, e = math.frexp(d)
    return math.ldexp(1.0, e - 1) if m == 0.5 else math.ldexp(1.0, e)


def fp8_block_fake_quant(x: np.ndarray, variant: str, tile: tuple[int, int], fp32_scale: bool = False,
                         dtype_max: float = F32_MAX) -> np.ndarray:
    """fp32 output of FP8 block-wise fake quant of the 2-D fp32 array ``x`` (``dtype_max``: the input
    dtype's largest value, TE's replacement of an infinite scale)."""
    f = np.float32
    y = np.zeros_like(x, dtype=np.float32)
    for rs, cs in _tiles(x, tile):
        blk = x[rs, cs].astype(np.float32)
        mag = np.abs(blk)
        with np.errstate(all="ignore"):
            if variant == "te":
                a = f(np.max(mag))
                s = f(f(448.0) / a)
                if math.isinf(s):
                    s = f(dtype_max)
                if not fp32_scale:
                    s = f(0.5) if math.isnan(s) else f(math.ldexp(1.0, _floor_log2(float(s))) if s > 0 else 0.5)
                    if math.isinf(a):
                        s = f(0.0)
                if a == 0:
                    s = f(1.0)
                inv = f(f(1.0) / s)
                y[rs, cs] = (e4m3_round(blk * s) * inv).astype(np.float32)
            elif variant == "deepseek":
                kept = mag[~np.isnan(mag)]
                a = f(np.max(kept)) if kept.size else f(0.0)
                a = max(a, f(1e-4))
                s = f(a * f(f(1.0) / f(448.0)))  # the GPU's amax / 448.: a product with the rounded reciprocal
                if not fp32_scale and math.isfinite(s):
                    s = f(_ceil_pow2(float(s)))
                y[rs, cs] = (e4m3_round(blk / s) * s).astype(np.float32)
            elif variant == "deepgemm":
                a = f(np.max(mag))
                a = a if (math.isnan(a) or a >= f(1e-4)) else f(1e-4)
                d = f(a / f(448.0))
                if fp32_scale:
                    sf = d
                elif math.isnan(d) or math.isinf(d):
                    sf = f(2.0**127)
                else:
                    e = _floor_log2(float(d)) + 127 + int(float(d) != math.ldexp(1.0, _floor_log2(float(d))))
                    sf = f(math.ldexp(1.0, max(1, min(254, e)) - 127))
                y[rs, cs] = (e4m3_round(blk * f(f(1.0) / sf)) * sf).astype(np.float32)
            else:
                raise ValueError(variant)
    return y


def int4_group_fake_quant(x: np.ndarray, variant: str, group: int = 128) -> np.ndarray:
    """fp32 output of INT4 group-wise fake quant (groups of ``group`` along the last dim) of 2-D fp32 ``x``
    (one expert: ``modelopt``'s zero-amax gate is taken over all its groups)."""
    f = np.float32
    y = np.zeros_like(x, dtype=np.float32)
    tiny = f(2.0**-24)
    tiles = list(_tiles(x, (1, group)))
    amax = [f(np.max(np.abs(x[rs, cs].astype(np.float32)))) for rs, cs in tiles]
    gate = bool(amax) and not any(math.isnan(a) for a in amax) and min(amax) <= tiny
    for (rs, cs), a in zip(tiles, amax):
        blk = x[rs, cs].astype(np.float32)
        with np.errstate(all="ignore"):
            if variant == "step":
                step = f(a / f(7.0))
                out = (np.clip(np.rint((blk / step).astype(np.float32)), -8, 7) * step).astype(np.float32)
                out = np.zeros_like(blk) if a < tiny else out
            elif variant == "cuda":
                s = f(f(7.0) / a)
                out = (np.clip(np.rint((blk * s).astype(np.float32)), -8, 7) / s).astype(np.float32)
                out = np.zeros_like(blk) if a < tiny else out
            elif variant == "modelopt":
                masked = gate and a <= tiny
                s = f(0.0) if masked else f(f(7.0) / a)
                q = np.rint((blk * s).astype(np.float32))
                q = np.where(np.isnan(q), q, np.clip(q, -8, 7))
                out = (q / (f(1.0) if masked else s)).astype(np.float32)
            else:  # eager / reciprocal: scale 0 at a <= 2**-24, then divided by 1
                s = f(0.0) if a <= tiny else (f(f(7.0) / a) if variant == "eager" else f(f(f(1.0) / a) * f(7.0)))
                out = (np.clip(np.rint((blk * s).astype(np.float32)), -8, 7) / (f(1.0) if a <= tiny else s)).astype(np.float32)
        y[rs, cs] = out
    return y
