"""MX (OCP Microscaling v1.0) fake quantization: MXFP8 (E4M3 elements) and MXFP4 (E2M1 elements).

Numeric contract
================
* Input ``x``: bf16 (primary), fp16 or fp32 ``[..., out, in]``, upcast exactly to fp32.  NaN and ±inf
  input are allowed (they decide their block's scale, below).
* No amax (``amax=None``, granularity ``from_data``): each block's scale comes from the block.
* Blocks: 32 consecutive elements along in-features (the last dim), or with ``tile_2d=True`` a 32x32
  tile of the last two dims (the 2D weight layout of Transformer Engine's MXFP8,
  ``tests/pytorch/test_mxfp8_2d_quantize.py``).  A partial block (in- or out-features not a multiple
  of 32) is zero-padded, i.e. a short block: what Model-Optimizer does (``reduce_block_padding`` in
  ``qtensor/mxfp8_tensor.py``); torchao's ``to_mx`` refuses a last dim that is not a multiple of 32
  (``prototype/mx_formats/mx_tensor.py``), so such cases are outside torchao's domain.
* Block amax ``A = max |x|`` over the block, exact, NaN-propagating (``torch.amax``).
* E8M0 scale code ``c`` (uint8): decodes to ``2**(c - 127)``; code 0 is ``2**-127`` (an fp32
  subnormal, not zero) and code 255 is NaN (``e8m0_decode``).  Which ``c`` a block gets is the
  variant (below); ``emax`` is the element format's largest exponent (E4M3 8, E2M1 2) and ``max`` its
  largest value (448, 6).
* Op sequence, every variant (all products by powers of two are exact unless noted)::

      1. A   = max |x| over the block
      2. c   = code(A)                        the variant's rule (below)
      3. inv = 2**(127 - c)                   exact (c = 254 -> 2**-127 subnormal, c = 0 -> 2**127);
                                              c = 255 -> NaN;  variant te: c = 0 -> 1 (TE's exp2f_rcp)
      4. v   = RN(x * inv)                    exact except fp32 underflow of subnormal results
      5. q   = elem(v)                        E4M3 / E2M1, round to nearest even, saturating (±inf -> ±max),
                                              NaN stays NaN, signed zeros kept
      6. y   = RN(q * 2**(c - 127))           exact, or ±inf where it overflows fp32 (see below)
      7. out = RNE_dtype(y)                   NaN -> canonical NaN

  A block whose code is 255 is all NaN.  Under every power-of-two rule a block can dequantize to
  ±inf: a bf16-max element with a ceil rule gets ``c = 247`` (E4M3), ``v = 255`` rounds to 256 and
  ``256 * 2**120`` overflows fp32.

Variants (the scale code rule, each naming the upstream it models):

* ``floor`` (default; the OCP rule, torchao ``ScaleCalculationMode.FLOOR``, its default):
  ``c = clamp(exp(A) - emax, -127, 128) + 127`` with ``exp(A)`` the unbiased exponent field of ``A``
  (``-127`` for zero and subnormals); non-finite ``A`` -> 255.
* ``ceil`` (torchao ``CEIL``): as ``floor`` with ``exp(A) + 1`` when ``A``'s mantissa bits are not 0.
* ``even`` (torchao ``EVEN``): ``A`` first rounded to ``mbits`` mantissa bits by adding
  ``2**(22 - mbits)`` to its bits and clearing the mantissa (E4M3 ``mbits = 3``, E2M1 ``1``), then
  ``floor``; an ``A`` that rounds to inf (fp32 ``A >= 1.9375 * 2**127`` for E4M3) gives 255.
* ``rceil`` (torchao ``RCEIL``, the cuBLAS rule): ``d = RN(A * RN(1/max))``, ``c`` = the biased
  exponent of ``d`` plus 1 when its mantissa is not 0 (an fp32 subnormal ``d``: plus 1 only above
  ``2**-127``); non-finite ``d`` -> 255.
* ``te`` (Transformer Engine ``common/util/ptx_arch_spec.cuh`` / ``utils.cuh`` ``float_to_e8m0`` of
  ``amax * max_norm_rcp``, ``exp2f_rcp``): ``d = RN(A * RN(1/max))``; NaN -> 255, inf -> 254, 0 -> 0;
  else the biased exponent of ``d``, plus 1 when the mantissa is not 0, except at exponent 254
  (saturates at 254) and for a subnormal ``d <= 2**-127``.  Step 3 uses 1 for code 0.  TE's dequant
  helper ``exp2f(c)`` builds ``2**(c-127)`` from bits and so gives 0 for code 0; this reference
  decodes code 0 as ``2**-127``: the outputs are the same (code 0 means ``A <= max * 2**-127``, whose
  elements round to ±0 at step 5 with ``inv = 1``).  A NaN block: TE's multipliers for code 255 are
  not a decode of the spec; this reference gives the spec's NaN block.
* ``modelopt`` (Model-Optimizer 0.47.0 ``qtensor/mxfp8_tensor.py`` ``_compute_e8m0_exponent``):
  ``d = RN(A / max)`` (IEEE division), ``c = clamp(ceil(log2 d), -127, 127) + 127`` where ``d > 0``,
  else ``c = 0`` (zero and NaN ``A``: a NaN block gets code 0, so its finite elements saturate to
  ``±max * 2**-127``).  ``log2 d`` is the correctly rounded fp32 ``log2`` (evaluated in float64 and
  rounded once to fp32, device-independent): for ``d`` a few fp32 ulps above a power of two
  ``2**e`` with ``|e| >= 5`` it rounds to ``e`` and ``ceil`` keeps ``e``.  Model-Optimizer evaluates
  ``torch.log2`` in fp32 (libm); a libm that is not correctly rounded there differs by one code.
  For MXFP4 this variant applies the same code rule with this module's E2M1 rounding (nearest, ties
  to even); Model-Optimizer's own ``mxfp4_tensor.py`` element rounding is not modeled here.

Backward: the straight-through estimator of ``reference.ste`` with no amax (``amax=None``):
``pass_through`` returns the output gradient; ``clipped`` keeps the gradient of every element that is
not NaN (each element lies within its own block's amax) and gives ``+0`` for NaN ``x``.
"""

from __future__ import annotations

from typing import Callable

import torch

from .constants import E2M1_MAX, E4M3_MAX, E8M0_BIAS, E8M0_NAN, MX_BLOCK
from .granularity import FROM_DATA, from_tiles, to_tiles
from .result import FakeQuantResult
from .rounding import fp32_scalar_like, round_to_e2m1, round_to_e4m3, to_output_dtype

_MANT = 0x7FFFFF


def e8m0_decode(code: torch.Tensor) -> torch.Tensor:
    """fp32 ``2**(code - 127)`` of int codes 0..255, exact; code 0 -> ``2**-127`` (bits ``0x00400000``),
    255 -> NaN."""
    c = code.to(torch.int32)
    bits = torch.where(c == 0, torch.full_like(c, 0x00400000), c << 23)
    bits = torch.where(c == E8M0_NAN, torch.full_like(c, 0x7FC00000), bits)
    return bits.view(torch.float32)


def e8m0_inverse(code: torch.Tensor) -> torch.Tensor:
    """fp32 ``2**(127 - code)``, exact: ``e8m0_decode(254 - code)``; code 255 -> NaN."""
    c = code.to(torch.int32)
    return torch.where(c == E8M0_NAN, torch.full((), float("nan")), e8m0_decode((2 * E8M0_BIAS - c).clamp(0, 254)))


def _fields(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(biased exponent field, mantissa bits) of fp32 ``a >= 0``."""
    bits = a.view(torch.int32)
    return (bits >> 23) & 0xFF, bits & _MANT


def _finish(unbiased: torch.Tensor, finite: torch.Tensor, hi: int) -> torch.Tensor:
    code = unbiased.clamp(-E8M0_BIAS, hi) + E8M0_BIAS
    return torch.where(finite, code, torch.full_like(code, E8M0_NAN))


def code_floor(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """torchao FLOOR (the OCP rule)."""
    e, _ = _fields(a)
    return _finish(e - E8M0_BIAS - emax, torch.isfinite(a), E8M0_BIAS + 1)


def code_ceil(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """torchao CEIL."""
    e, m = _fields(a)
    return _finish(e + (m != 0).to(torch.int32) - E8M0_BIAS - emax, torch.isfinite(a), E8M0_BIAS + 1)


def code_even(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """torchao EVEN: round ``a`` to ``mbits`` mantissa bits (carry into the exponent), then FLOOR."""
    bits = (a.view(torch.int32) + (1 << (22 - mbits))) & 0x7F800000
    r = torch.where(torch.isnan(a), a, bits.view(torch.float32))
    e, _ = _fields(r)
    return _finish(e - E8M0_BIAS - emax, torch.isfinite(r), E8M0_BIAS + 1)


def _descale(a: torch.Tensor, elem_max: float) -> torch.Tensor:
    """``RN(a * RN(1/max))``: a product with the rounded reciprocal, not a division."""
    return a * torch.reciprocal(fp32_scalar_like(elem_max, a))


def code_rceil(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """torchao RCEIL (``_f32_to_e8m0_rceil`` of ``a * (1/max)``)."""
    d = _descale(a, elem_max)
    e, m = _fields(d)
    up = torch.where(e == 0, m > 0x400000, m != 0)
    return torch.where(torch.isfinite(d), e + up.to(torch.int32), torch.full_like(e, E8M0_NAN))


def code_te(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """Transformer Engine ``float_to_e8m0(amax * max_norm_rcp)``: round up, saturate at 254."""
    d = _descale(a, elem_max)
    e, m = _fields(d)
    up = (m > 0) & (e != 0xFE) & ~((e == 0) & (m <= 0x400000))
    code = e + up.to(torch.int32)
    code = torch.where(torch.isinf(d), torch.full_like(code, 0xFE), code)
    code = torch.where(d == 0, torch.zeros_like(code), code)
    return torch.where(torch.isnan(d), torch.full_like(code, E8M0_NAN), code)


def code_modelopt(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """Model-Optimizer: ``clamp(ceil(log2(a / max)), -127, 127)``, ``-127`` unless ``a / max > 0``."""
    d = a / fp32_scalar_like(elem_max, a)
    lg = torch.log2(d.to(torch.float64)).to(torch.float32)  # correctly rounded fp32 log2 (module docstring)
    e = torch.where(d > 0, torch.ceil(lg), torch.full((), -127.0))
    return (e.clamp(-127, 127) + E8M0_BIAS).to(torch.int32)


CODE_RULES: dict[str, Callable[..., torch.Tensor]] = {
    "floor": code_floor, "ceil": code_ceil, "even": code_even, "rceil": code_rceil, "te": code_te, "modelopt": code_modelopt,
}
"""Variant -> ``code(A, emax, mbits, max)``: int32 E8M0 codes of fp32 block amax ``A``."""


ELEMENTS: dict[str, tuple[int, int, float, Callable[[torch.Tensor], torch.Tensor]]] = {
    "e4m3": (8, 3, E4M3_MAX, round_to_e4m3),
    "e2m1": (2, 1, E2M1_MAX, round_to_e2m1),
}
"""Element format -> (emax, mantissa bits, max, rounding)."""


def mx_tile(tile_2d: bool) -> tuple[int, int]:
    """The block: ``(1, 32)`` along in-features, or ``(32, 32)``."""
    return (MX_BLOCK, MX_BLOCK) if tile_2d else (1, MX_BLOCK)


def mx_codes(x: torch.Tensor, variant: str, elem: str, *, tile_2d: bool = False) -> torch.Tensor:
    """The E8M0 codes (int32) of ``x``'s blocks, ``[..., ceil(out/r), ceil(in/32)]``."""
    emax, mbits, emx, _ = ELEMENTS[elem]
    a = to_tiles(x.to(torch.float32), mx_tile(tile_2d)).abs().amax(dim=-1)
    return CODE_RULES[variant](a, emax, mbits, emx)


def _check_amax(amax: object, name: str) -> None:
    if amax is not None:
        raise TypeError(f"{name} takes no amax (granularity {FROM_DATA}: its scales come from the data); pass amax=None")


def mx_fake_quant(x: torch.Tensor, amax: None, *, variant: str, elem: str, tile_2d: bool = False) -> FakeQuantResult:
    """Steps 1-7 of the module docstring for ``variant`` and element format ``elem``."""
    _check_amax(amax, f"mx{'fp8' if elem == 'e4m3' else 'fp4'}")
    tile = mx_tile(tile_2d)
    _, _, _, elem_round = ELEMENTS[elem]
    xt = to_tiles(x.to(torch.float32), tile)
    emax, mbits, emx, _ = ELEMENTS[elem]
    code = CODE_RULES[variant](xt.abs().amax(dim=-1), emax, mbits, emx).unsqueeze(-1)
    inv = e8m0_inverse(code)
    if variant == "te":
        inv = torch.where(code == 0, torch.ones((), device=inv.device), inv)
    v = xt * inv
    y = elem_round(v) * e8m0_decode(code)
    shape = tuple(x.shape)
    return FakeQuantResult(to_output_dtype(from_tiles(y, tile, shape), x.dtype), from_tiles(v, tile, shape), elem_round)


def _variant(variant: str, elem: str):
    def fn(x, amax, *, tile_2d: bool = False) -> FakeQuantResult:
        return mx_fake_quant(x, amax, variant=variant, elem=elem, tile_2d=tile_2d)

    fn.__name__ = fn.__qualname__ = f"mx_{elem}_{variant}"
    fn.__doc__ = f"MX {elem} elements, E8M0 scale rule {variant!r} (see the module docstring)."
    return fn


MXFP8_VARIANTS = {v: _variant(v, "e4m3") for v in CODE_RULES}
MXFP4_VARIANTS = {v: _variant(v, "e2m1") for v in CODE_RULES}
DEFAULT_VARIANT = "floor"
