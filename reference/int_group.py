"""INT4 group-wise fake quantization: one scale per 128 elements along in-features, from the block's
own amax (Model-Optimizer ``int4_per_block``: ``block_sizes={-1: 128}`` with max calibration).

Numeric contract
================
* Input ``x``: bf16 (primary), fp16 or fp32 ``[..., out, in]``; NaN or ±inf input raises
  ``ValueError``: a non-finite block amax has no INT scale (Model-Optimizer's handling of a NaN is
  tensor-wide, not per block, and is not modeled).
* No amax (``amax=None``, granularity ``from_data``): block amax ``A = max |x|`` over 128
  consecutive elements along in-features; a partial block is zero-padded (a short block).
* Each block is then fake-quantized by ``reference.int_quant`` with ``num_bits = 4`` (grid -8..7,
  ``qmax = 7``) and the block's ``A`` as its amax, in the op order of the variant:

  - ``cuda`` (default; Model-Optimizer's CUDA extension, which fake-quantizes its blocks on the GPU):
    ``s = RN(7 / A)``, ``q = clamp(rint(RN(x * s)), -8, 7)``, ``y = RN(q / s)``; ``A < 2**-24`` ->
    the block is ``+0`` (the zero-amax rule);
  - ``eager`` (Model-Optimizer's eager torch path): as ``cuda`` with scale 0 where ``A <= 2**-24``;
  - ``reciprocal``, ``step``: as ``reference.int_quant`` states.

  Model-Optimizer's real INT4 packing kernel rounds ``x * s + 8`` half away from zero (``roundf``):
  it and this fake quant differ on exact ``.5`` ties; the fake quant is what is modeled here.
* Output dtype = input dtype (RNE from fp32).  Backward: as ``reference.mx`` (no amax).
"""

from __future__ import annotations

import torch

from . import int_quant
from .constants import INT4_GROUP
from .granularity import from_tiles, to_tiles
from .mx import _check_amax
from .result import FakeQuantResult
from .rounding import to_output_dtype

GROUP_TILE = (1, INT4_GROUP)


def _int4_group(x: torch.Tensor, amax: None, variant: str) -> FakeQuantResult:
    _check_amax(amax, "int4_group")
    xf = x.to(torch.float32)
    if xf.numel() and not bool(torch.isfinite(xf).all()):
        raise ValueError("int4_group fake quant got NaN or inf input: a non-finite block amax has no INT scale")
    xt = to_tiles(xf, GROUP_TILE)
    r = int_quant.VARIANTS[variant](xt, xt.abs().amax(dim=-1), num_bits=4)
    shape = tuple(x.shape)
    return FakeQuantResult(to_output_dtype(from_tiles(r.out, GROUP_TILE, shape), x.dtype), from_tiles(r.pre_round, GROUP_TILE, shape),
                           r.grid_round)


def _variant(variant: str):
    def fn(x, amax=None) -> FakeQuantResult:
        return _int4_group(x, amax, variant)

    fn.__name__ = fn.__qualname__ = f"int4_group_{variant}"
    fn.__doc__ = f"INT4 group-wise, per-block ``reference.int_quant`` variant {variant!r} (see the module docstring)."
    return fn


VARIANTS = {v: _variant(v) for v in int_quant.VARIANTS}
DEFAULT_VARIANT = int_quant.DEFAULT_VARIANT
