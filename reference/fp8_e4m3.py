"""FP8 E4M3 fake quantization (scaled, per tensor / per expert / per channel).

Numeric contract
================
* Input ``x``: bf16 (primary), fp16 or fp32; upcast exactly to fp32.  Output: input dtype (RNE).
* amax: fp32, finite, >= 0.  ``amax <= 2**-24`` is treated as ``1`` (CUDA extension).
* E4M3 rounding (``reference.rounding.round_to_e4m3``): nearest, ties to even, saturating
  at ±448 (±inf -> ±448), NaN -> NaN, signed zeros kept.

Default variant ``cuda`` (Model-Optimizer ``scaled_e4m3`` CUDA extension), fp32 op sequence::

    0. a = 1 if amax <= 2**-24 else amax
    1. s   = RN(448 / a)              true IEEE division
    2. inv = RN(1 / s)
    3. v   = RN(x * s)
    4. e   = e4m3_rne_satfinite(v)
    5. y   = RN(e * inv)
    6. out = RNE_dtype(y)             NaN -> canonical NaN (bf16 0x7FFF), see rounding.to_output_dtype

Variant ``eager`` (Model-Optimizer 0.47.0 eager path, measured bit for bit on CPU: torch evaluates
``448.0 / amax`` as ``reciprocal(amax) * 448``; dequantization as in ``cuda``)::

    1. s = RN(RN(1 / a) * 448)   2. inv = RN(1 / s)   3-6 as default

Variant ``reciprocal`` (the same scale, dequantized by a true division ``e / s``)::

    1. s = RN(RN(1 / a) * 448)   3. v = RN(x * s)   4. e = e4m3(v)   5. y = RN(e / s)

Variant ``div`` (CUDA scale, dequantized by a true division)::

    1. s = RN(448 / a)   3-4 as default   5. y = RN(e / s)

Variant ``te_current`` (Transformer Engine current scaling: ``compute_scale_from_amax`` in
``common/recipe/recipe_common.cuh`` with ``epsilon = 0``, no power-of-two scales,
``value_for_inf = FP32_MAX``; TE computes ``scale_inv = RN(1/scale)`` and dequantizes
``RN(e * scale_inv)``).  No tiny-amax rule: step 0 is not applied::

    1. s = 1 if amax == 0 else RN(448 / amax)  (``__fdiv_rn``);  s = FP32_MAX where that is inf
    2-6 as default

Domains: for ``amax > 2**-24`` it *is* ``cuda`` (same scale, same dequantization); for ``amax == 0``
(an all-zero tensor under current scaling) the outputs agree too (``+-0`` either way).  For
``0 < amax <= 2**-24`` they part: ``cuda`` scales by 448 and flushes every ``|x| <= amax`` to ``+-0``,
``te_current`` scales by ``RN(448 / amax)`` and reproduces ``x = amax`` (e.g. ``2**-25``);
below ``448 / FP32_MAX`` (about ``1.3e-36``) its scale is ``FP32_MAX`` and ``scale_inv`` a subnormal.
"""

from __future__ import annotations

import torch

from .constants import E4M3_MAX, FP32_MAX, TINY_AMAX
from .granularity import broadcast_amax
from .result import FakeQuantResult
from .rounding import fp32_scalar_like, round_to_e4m3, to_output_dtype


def _prepare(x: torch.Tensor, amax: torch.Tensor):
    a = broadcast_amax(x, amax)
    a = torch.where(a <= TINY_AMAX, torch.ones((), device=a.device), a)
    return x.to(torch.float32), a


def cuda_core(xf: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 core of the ``cuda`` variant (steps 1-5) on a broadcast amax ``a`` that step 0 has
    already made safe: returns ``(y, v)`` in fp32.  NVFP4's ``modelopt_static`` block scales
    run through this core too (``reference.nvfp4``)."""
    s = fp32_scalar_like(E4M3_MAX, xf) / a
    inv = fp32_scalar_like(1.0, xf) / s
    v = xf * s
    return round_to_e4m3(v) * inv, v


def fp8_cuda(x, amax) -> FakeQuantResult:
    """Default variant: ``s = RN(448/a)``, ``inv = RN(1/s)``, ``y = RN(e4m3(x*s) * inv)``."""
    xf, a = _prepare(x, amax)
    y, v = cuda_core(xf, a)
    return FakeQuantResult(to_output_dtype(y, x.dtype), v, round_to_e4m3)


def fp8_eager(x, amax) -> FakeQuantResult:
    """Model-Optimizer eager: ``s = RN(RN(1/a) * 448)``, ``inv = RN(1/s)``, ``y = RN(e4m3(x*s) * inv)``."""
    xf, a = _prepare(x, amax)
    s = torch.reciprocal(a) * fp32_scalar_like(E4M3_MAX, xf)
    inv = fp32_scalar_like(1.0, xf) / s
    v = xf * s
    y = round_to_e4m3(v) * inv
    return FakeQuantResult(to_output_dtype(y, x.dtype), v, round_to_e4m3)


def reciprocal_core(xf: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 core of the ``reciprocal`` variant on a broadcast amax ``a``: returns ``(y, v)``."""
    s = torch.reciprocal(a) * fp32_scalar_like(E4M3_MAX, xf)
    v = xf * s
    return round_to_e4m3(v) / s, v


def fp8_reciprocal(x, amax) -> FakeQuantResult:
    """Eager variant: ``s = RN(RN(1/a) * 448)``, ``y = RN(e4m3(x*s) / s)``."""
    xf, a = _prepare(x, amax)
    y, v = reciprocal_core(xf, a)
    return FakeQuantResult(to_output_dtype(y, x.dtype), v, round_to_e4m3)


def fp8_div(x, amax) -> FakeQuantResult:
    """CUDA scale, true-division dequant: ``y = RN(e4m3(x*s) / s)``."""
    xf, a = _prepare(x, amax)
    s = fp32_scalar_like(E4M3_MAX, xf) / a
    v = xf * s
    y = round_to_e4m3(v) / s
    return FakeQuantResult(to_output_dtype(y, x.dtype), v, round_to_e4m3)


def fp8_te_current(x, amax) -> FakeQuantResult:
    """Transformer Engine current scaling: ``s = RN(448/amax)`` (1 at amax 0, FP32_MAX on overflow), no tiny rule."""
    a = broadcast_amax(x, amax)
    xf = x.to(torch.float32)
    s = fp32_scalar_like(E4M3_MAX, xf) / a
    s = torch.where(torch.isinf(s), fp32_scalar_like(FP32_MAX, xf), s)
    s = torch.where(a == 0, torch.ones((), device=xf.device), s)
    inv = fp32_scalar_like(1.0, xf) / s
    v = xf * s
    y = round_to_e4m3(v) * inv
    return FakeQuantResult(to_output_dtype(y, x.dtype), v, round_to_e4m3)


VARIANTS = {"cuda": fp8_cuda, "eager": fp8_eager, "reciprocal": fp8_reciprocal, "div": fp8_div, "te_current": fp8_te_current}
DEFAULT_VARIANT = "cuda"
