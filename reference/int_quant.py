"""INTn fake quantization (INT8, INT4; signed/unsigned; narrow/wide range).

Numeric contract
================
* Input ``x``: bf16 (primary), fp16 or fp32 ``[..., out, in]``; upcast exactly to fp32.
* amax: fp32, per tensor / per expert / per channel (``reference.granularity``), finite, >= 0.
* Grid: ``qmax = 2**(b-1)-1`` signed (``2**b-1`` unsigned); ``lo = -qmax-1`` wide (default),
  ``-qmax`` narrow, ``0`` unsigned.  The scale always uses ``qmax``.
* Unsigned with any negative input: ``ValueError`` (Model-Optimizer's CUDA extension
  asserts on it).
* Output dtype = input dtype, rounded to nearest even from fp32.

Default variant ``cuda`` (Model-Optimizer CUDA extension, docs/measured.md §5), fp32 op sequence::

    1. s = RN(qmax / amax)            true IEEE division (tensor / tensor, never a CPU scalar)
    2. v = RN(x * s)
    3. r = rint(v)                    round half to even
    4. q = clamp(r, lo, qmax)         only r < lo or r > qmax move: -0 stays -0, NaN stays NaN,
                                      ±inf go to lo / qmax
    5. y = RN(q / s)                  true division
    6. out = RNE_dtype(y)             NaN -> canonical NaN (bf16 0x7FFF), see rounding.to_output_dtype
    amax < 2**-24  ->  out = +0 for every element (NaN inputs included).

Variant ``eager`` (Model-Optimizer 0.47.0 eager ``_tensor_quant``, measured bit for bit on CPU)::

    1. s = RN(qmax / amax)  (true division);   amax <= 2**-24 -> s = 0   (note ``<=``, not ``<``)
    2-4 as above (so x = NaN/inf with tiny amax gives NaN, and -x gives -0)
    5. y = RN(q / s') with s' = 1 where amax <= 2**-24

Variant ``reciprocal`` (the torch expression ``qmax / amax`` with a Python-number numerator, which
torch evaluates as ``reciprocal(amax) * qmax``)::

    1. s = RN(RN(1 / amax) * qmax);   amax <= 2**-24 -> s = 0
    2-5 as ``eager``

Variant ``step`` (the public branch kernel of docs/measured.md §5)::

    1. step = RN(amax / qmax)   2. v = RN(x / step)   3-4 as above   5. y = RN(q * step)
    amax < 2**-24 -> +0.
"""

from __future__ import annotations

import torch

from .constants import TINY_AMAX, int_bounds
from .granularity import broadcast_amax
from .result import FakeQuantResult
from .rounding import fp32_scalar_like, to_output_dtype


def _grid(lo: float, qmax: float):
    def grid_round(v: torch.Tensor) -> torch.Tensor:
        # Not torch.clamp: with lo = 0 (unsigned) CPU clamp keeps -0.0 but CUDA's gives +0.0.
        # Only values strictly outside [lo, qmax] move; -0.0 stays -0.0 and NaN stays NaN.
        r = torch.round(v)
        return torch.where(r < lo, torch.full((), lo, device=r.device), torch.where(r > qmax, torch.full((), qmax, device=r.device), r))

    return grid_round


def _prepare(x: torch.Tensor, amax: torch.Tensor, num_bits: int, unsigned: bool, narrow_range: bool):
    a = broadcast_amax(x, amax)
    lo, qmax = int_bounds(num_bits, unsigned=unsigned, narrow_range=narrow_range)
    xf = x.to(torch.float32)
    if unsigned and x.numel() and bool((xf < 0).any()):
        raise ValueError("unsigned INT quantization got negative input values (Model-Optimizer rejects them too)")
    return xf, a, lo, qmax


def int_cuda(x, amax, *, num_bits: int, unsigned: bool = False, narrow_range: bool = False) -> FakeQuantResult:
    """Default variant: ``s = RN(qmax/amax)``, ``y = RN(rint-clamp(x*s) / s)``; see module docstring."""
    xf, a, lo, qmax = _prepare(x, amax, num_bits, unsigned, narrow_range)
    s = fp32_scalar_like(qmax, xf) / a
    v = xf * s
    grid = _grid(lo, qmax)
    y = grid(v) / s
    y = torch.where(a < TINY_AMAX, torch.zeros((), device=xf.device), y)
    return FakeQuantResult(to_output_dtype(y, x.dtype), v, grid)


def _zero_scale_when_tiny(x, amax, scale_fn, *, num_bits: int, unsigned: bool, narrow_range: bool) -> FakeQuantResult:
    """Shared steps of ``eager``/``reciprocal``: tiny amax zeroes the scale, then divides by 1."""
    xf, a, lo, qmax = _prepare(x, amax, num_bits, unsigned, narrow_range)
    tiny = a <= TINY_AMAX
    s = torch.where(tiny, torch.zeros((), device=xf.device), scale_fn(a, fp32_scalar_like(qmax, xf)))
    v = xf * s
    grid = _grid(lo, qmax)
    y = grid(v) / torch.where(tiny, torch.ones((), device=xf.device), s)
    return FakeQuantResult(to_output_dtype(y, x.dtype), v, grid)


def int_eager(x, amax, *, num_bits: int, unsigned: bool = False, narrow_range: bool = False) -> FakeQuantResult:
    """Model-Optimizer eager: ``s = RN(qmax/amax)``, zero scale where ``amax <= 2**-24``."""
    return _zero_scale_when_tiny(x, amax, lambda a, q: q / a, num_bits=num_bits, unsigned=unsigned, narrow_range=narrow_range)


def int_reciprocal(x, amax, *, num_bits: int, unsigned: bool = False, narrow_range: bool = False) -> FakeQuantResult:
    """``s = RN(RN(1/amax) * qmax)`` (two roundings), eager tiny-amax handling."""
    return _zero_scale_when_tiny(x, amax, lambda a, q: torch.reciprocal(a) * q, num_bits=num_bits, unsigned=unsigned, narrow_range=narrow_range)


def int_step(x, amax, *, num_bits: int, unsigned: bool = False, narrow_range: bool = False) -> FakeQuantResult:
    """Step variant: ``step = RN(amax/qmax)``, ``q = rint(RN(x/step))``, ``y = RN(q*step)``."""
    xf, a, lo, qmax = _prepare(x, amax, num_bits, unsigned, narrow_range)
    step = a / fp32_scalar_like(qmax, xf)
    v = xf / step
    grid = _grid(lo, qmax)
    y = grid(v) * step
    y = torch.where(a < TINY_AMAX, torch.zeros((), device=xf.device), y)
    return FakeQuantResult(to_output_dtype(y, x.dtype), v, grid)


VARIANTS = {"cuda": int_cuda, "eager": int_eager, "reciprocal": int_reciprocal, "step": int_step}
DEFAULT_VARIANT = "cuda"
