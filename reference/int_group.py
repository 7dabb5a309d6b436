"""INT4 group-wise fake quantization: one scale per group of ``group_size`` elements along in-features,
from the group's own amax (Model-Optimizer ``int4_per_block``: ``block_sizes={-1: 128}``).

Numeric contract
================
* Input ``x``: bf16 (primary), fp16 or fp32 ``[..., out, in]``.  NaN or ±inf input: the ``modelopt``
  variant takes it as Model-Optimizer does (below); every other variant raises ``ValueError`` (a
  non-finite group amax has no INT scale).
* No amax (``amax=None``, granularity ``from_data``): group amax ``A = max |x|`` over ``group_size``
  (option; 128 by default, 32 and 64 as Model-Optimizer's other presets) consecutive elements along
  in-features; a partial group is zero-padded (a short group).
* Grid -8..7 (``qmax = 7``, wide range).  Output dtype = input dtype (RNE from fp32).
* ``cuda``, ``eager``, ``reciprocal``, ``step``: each group fake-quantized by ``reference.int_quant``
  with ``num_bits = 4`` and the group's ``A`` as its amax, in that variant's op order:

  - ``cuda`` (default; Model-Optimizer's CUDA extension, which fake-quantizes its groups on the GPU):
    ``s = RN(7 / A)``, ``q = clamp(rint(RN(x * s)), -8, 7)``, ``y = RN(q / s)``; ``A < 2**-24`` ->
    the group is ``+0`` (the zero-amax rule);
  - ``eager`` (Model-Optimizer's eager torch path on finite input): as ``cuda`` with scale 0 where
    ``A <= 2**-24``;
  - ``reciprocal``, ``step``: as ``reference.int_quant`` states.

* ``modelopt``: Model-Optimizer 0.47.0 ``tensor_quant.py`` ``_tensor_quant(x_groups, A, num_bits=4,
  narrow_range=False)`` on the groups of one expert (one weight: a 2-D ``x``, or each ``[out, in]``
  of a stacked ``x``), ``A`` its ``reduce_amax`` per group (NaN-propagating), in fp32::

      1. A    = max |x| per group            NaN if the group holds NaN, inf if it holds inf
      2. s    = RN(7 / A)                    IEEE division (A = 0 -> inf, inf -> 0, NaN -> NaN)
      3. gate = min(A over the expert) <= 2**-24     torch's ``min`` propagates NaN: one NaN group
                                             anywhere in the expert turns the gate off for all
      4. s    = 0 where gate and A <= 2**-24
      5. q    = clamp(round(RN(x * s)), -8, 7)    half to even; NaN stays NaN (torch.clamp)
      6. s    = 1 where step 4 zeroed it
      7. y    = RN(q / s);  out = RNE_dtype(y)

  On finite input it equals ``eager`` (with the gate off no group is below ``2**-24``).  With the
  gate off, a zero group has ``s = inf`` and gives NaN (``0 * inf``); a group holding inf has ``s =
  0`` and is all NaN (``q / 0``); a NaN group is NaN.  Model-Optimizer's max calibration refuses a
  NaN or inf block amax (it asserts); this rule is its ``_tensor_quant`` wherever the amax reaches it
  otherwise (a dynamic block quantizer, an amax set directly).

  Model-Optimizer's real INT4 packing kernel rounds ``x * s + 8`` half away from zero (``roundf``):
  it and this fake quant differ on exact ``.5`` ties; the fake quant is what is modeled here.
* Backward: as ``reference.mx`` (no amax).
"""

from __future__ import annotations

import torch

from . import int_quant
from .constants import INT4_GROUP, TINY_AMAX
from .granularity import from_tiles, to_tiles
from .mx import _check_amax
from .result import FakeQuantResult
from .rounding import fp32_scalar_like, to_output_dtype

GROUP_SIZES = (32, 64, 128)
"""The group sizes Model-Optimizer's INT4 presets use (the option ``group_size`` takes any size >= 1)."""
QMAX, LO = 7.0, -8.0


def group_tile(group_size: int = INT4_GROUP) -> tuple[int, int]:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    return (1, group_size)


def _groups(x: torch.Tensor, amax: None, group_size: int, *, finite: bool) -> tuple[torch.Tensor, tuple[int, int]]:
    _check_amax(amax, "int4_group")
    xf = x.to(torch.float32)
    if finite and xf.numel() and not bool(torch.isfinite(xf).all()):
        raise ValueError("int4_group fake quant got NaN or inf input: a non-finite group amax has no INT scale "
                         "(variant 'modelopt' takes it as Model-Optimizer does)")
    tile = group_tile(group_size)
    return to_tiles(xf, tile), tile


def _result(x: torch.Tensor, out: torch.Tensor, pre: torch.Tensor, tile: tuple[int, int], grid) -> FakeQuantResult:
    shape = tuple(x.shape)
    return FakeQuantResult(to_output_dtype(from_tiles(out, tile, shape), x.dtype), from_tiles(pre, tile, shape), grid)


def _int4_group(x: torch.Tensor, amax: None, variant: str, group_size: int) -> FakeQuantResult:
    xt, tile = _groups(x, amax, group_size, finite=True)
    r = int_quant.VARIANTS[variant](xt, xt.abs().amax(dim=-1), num_bits=4)
    return _result(x, r.out.to(torch.float32), r.pre_round, tile, r.grid_round)


def _clamp_round(v: torch.Tensor) -> torch.Tensor:
    """``torch.clamp(round(v), -8, 7)``: half to even; NaN stays NaN, ``-0`` stays ``-0`` (CPU)."""
    return torch.clamp(torch.round(v), LO, QMAX)


def int4_group_modelopt(x, amax=None, *, group_size: int = INT4_GROUP) -> FakeQuantResult:
    """Variant ``modelopt``: Model-Optimizer's ``_tensor_quant`` per expert; see the module docstring."""
    xt, tile = _groups(x, amax, group_size, finite=False)  # [..., nr, ng, G]
    a = xt.abs().amax(dim=-1, keepdim=True)
    s = fp32_scalar_like(QMAX, xt) / a
    per_expert = a.reshape(*a.shape[:-3], -1) if a.dim() > 3 else a.reshape(1, -1)
    if per_expert.shape[-1] == 0:  # an empty expert has no group
        return _result(x, xt, xt, tile, _clamp_round)
    gate = per_expert.amin(dim=-1) <= TINY_AMAX  # NaN anywhere in the expert: False
    gate = gate.reshape(*a.shape[:-3], 1, 1, 1) if a.dim() > 3 else gate.reshape(1, 1, 1)
    masked = gate & (a <= TINY_AMAX)
    zero = torch.zeros((), device=xt.device)
    v = xt * torch.where(masked, zero, s)
    y = _clamp_round(v) / torch.where(masked, torch.ones((), device=xt.device), s)
    return _result(x, y, v, tile, _clamp_round)


def _variant(variant: str):
    def fn(x, amax=None, *, group_size: int = INT4_GROUP) -> FakeQuantResult:
        return _int4_group(x, amax, variant, group_size)

    fn.__name__ = fn.__qualname__ = f"int4_group_{variant}"
    fn.__doc__ = f"INT4 group-wise, per-group ``reference.int_quant`` variant {variant!r} (see the module docstring)."
    return fn


VARIANTS = {**{v: _variant(v) for v in int_quant.VARIANTS}, "modelopt": int4_group_modelopt}
DEFAULT_VARIANT = int_quant.DEFAULT_VARIANT
FINITE_ONLY = frozenset(int_quant.VARIANTS)
"""The variants that reject NaN and inf input (``FormatSpec.rejects_nan``)."""
