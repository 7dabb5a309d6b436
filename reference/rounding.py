"""Device-independent fp32 rounding primitives shared by all formats.

Every function here takes and returns ``torch.float32`` tensors and is built only from
operations whose result IEEE 754 fixes exactly (multiplication by a power of two,
``torch.round`` = round half to even, comparisons, clamps) plus exact integer bit
arithmetic.  No ``exp2``/``pow``/``log2`` (libm accuracy varies by device) and no
float8 casts (whose saturation and tie rules differ between libraries).
"""

from __future__ import annotations

import torch

from .constants import E2M1_MAX, E4M3_MANTISSA_BITS, E4M3_MAX, E4M3_MIN_NORMAL_EXP


def exact_pow2(k: torch.Tensor) -> torch.Tensor:
    """``2.0**k`` as float32 for an integer tensor ``k`` in [-126, 127], built from bits.

    Exact by construction: the biased exponent ``k + 127`` is written into bits 23..30.
    """
    return ((k.to(torch.int32) + 127) << 23).view(torch.float32)


def round_to_minifloat(
    v: torch.Tensor, *, mantissa_bits: int, min_normal_exp: int, max_value: float
) -> torch.Tensor:
    """Round fp32 ``v`` to a sign-magnitude minifloat grid, ties to even, saturating.

    Op sequence (all exact except step 3, which is the one rounding):
      1. ``c = clamp(v, -max_value, max_value)``   (±inf saturate, NaN stays NaN)
      2. ``e = frexp(c).exponent``; quantum exponent ``k = max(e - 1 - m, emin - m)``
      3. ``r = round(c * 2**-k)``                  (torch.round: half to even)
      4. ``return r * 2**k``
    Signed zeros are kept (``-0.0 -> -0.0``).
    """
    c = torch.clamp(v, -max_value, max_value)
    _, e = torch.frexp(c)
    k = torch.clamp_min(e - 1 - mantissa_bits, min_normal_exp - mantissa_bits)
    return torch.round(c * exact_pow2(-k)) * exact_pow2(k)


def round_to_e4m3(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> nearest FP8 E4M3 value (as fp32): RNE, saturating at ±448 (±inf -> ±448), NaN -> NaN.

    Equals CUDA's ``__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)`` decoded back to fp32.
    """
    return round_to_minifloat(
        v, mantissa_bits=E4M3_MANTISSA_BITS, min_normal_exp=E4M3_MIN_NORMAL_EXP, max_value=E4M3_MAX
    )


def round_to_e2m1(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> nearest FP4 E2M1 value (as fp32): RNE on {0,.5,1,1.5,2,3,4,6}, saturating at ±6.

    Ties: .25->0, .75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4 (Transformer Engine's table).
    """
    return round_to_minifloat(v, mantissa_bits=1, min_normal_exp=0, max_value=E2M1_MAX)


def round_to_e2m1_te(v: torch.Tensor) -> torch.Tensor:
    """Transformer Engine's pure-torch E2M1 coding (``custom_recipes/reference_nvfp4.py``
    ``cast_to_fp4x2``, decoded): ``round_to_e2m1`` except that ``v = -0.0`` and NaN are coded as
    ``+0`` (its first test is ``x >= 0.0``, and NaN meets no test); ``v`` in ``(-0.25, 0)`` stays ``-0``."""
    return torch.where((v == 0) | torch.isnan(v), torch.zeros((), device=v.device), round_to_e2m1(v))


def fp32_scalar_like(value: float, ref: torch.Tensor) -> torch.Tensor:
    """A 1-element fp32 tensor on ``ref``'s device.

    Used as divisor/dividend so that no op sees a *CPU scalar*: on CUDA, ``t / cpu_scalar``
    is computed as ``t * (1/scalar)`` (two roundings), which would make the reference
    device-dependent.
    """
    return torch.full((1,), value, dtype=torch.float32, device=ref.device)


_CANONICAL_NAN_BITS = {torch.bfloat16: (torch.int16, 0x7FFF), torch.float16: (torch.int16, 0x7FFF), torch.float32: (torch.int32, 0x7FFFFFFF)}


def to_output_dtype(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``y`` -> ``dtype``, round to nearest even; NaN becomes the canonical quiet NaN.

    The canonical NaN is the one CUDA arithmetic produces (all payload bits set, sign clear:
    bf16/fp16 ``0x7FFF``, fp32 ``0x7FFFFFFF``); torch's CPU cast would keep sign and payload
    (or give ``0x7FC0``), so the bits are fixed here to make the output device-independent.
    """
    out = y.to(dtype)
    nan = torch.isnan(y)
    int_dtype, bits = _CANONICAL_NAN_BITS[dtype]
    return torch.where(nan, torch.full((), bits, dtype=int_dtype, device=y.device), out.view(int_dtype)).view(dtype)
