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
* Block amax ``A = max |x|`` over the block, exact, NaN-propagating (``torch.amax``); MXFP8 ``te``
  skips NaN elements (below).
* E8M0 scale code ``c`` (uint8): decodes to ``2**(c - 127)``; code 0 is ``2**-127`` (an fp32
  subnormal, not zero) and code 255 is NaN (``e8m0_decode``).  Which ``c`` a block gets is the
  variant (below); ``emax`` is the element format's largest exponent (E4M3 8, E2M1 2) and ``max`` its
  largest value (448, 6).
* Op sequence, every variant (all products by powers of two are exact unless noted)::

      1. A   = max |x| over the block
      2. c   = code(A)                        the variant's rule (below)
      3. inv = 2**(127 - c)                   exact (c = 254 -> 2**-127 subnormal, c = 0 -> 2**127);
                                              c = 255 -> NaN;  c = 0 -> 1 for torchao_rceil, 2**126
                                              for torchao_floor/ceil/even (``CODE0_INVERSE``)
      4. v   = RN(x * inv)                    exact except fp32 underflow of subnormal results
      5. q   = elem(v)                        E4M3 / E2M1, round to nearest even, saturating (±inf -> ±max),
                                              NaN stays NaN, signed zeros kept (MXFP4 modelopt: its own
                                              rule, below)
      6. y   = RN(q * 2**(c - 127))           exact, or ±inf where it overflows fp32 (see below)
      7. out = RNE_dtype(y)                   NaN -> canonical NaN

  A block whose code is 255 is all NaN.  Under every power-of-two rule a block can dequantize to
  ±inf: a bf16-max element with a ceil rule gets ``c = 247`` (E4M3), ``v = 255`` rounds to 256 and
  ``256 * 2**120`` overflows fp32.

Variants (the scale code rule, each naming the upstream it models):

* ``floor`` (default; the OCP rule, the rule of torchao ``ScaleCalculationMode.FLOOR``, its default):
  ``c = clamp(exp(A) - emax, -127, 128) + 127`` with ``exp(A)`` the unbiased exponent field of ``A``
  (``-127`` for zero and subnormals); non-finite ``A`` -> 255 (the OCP spec's NaN scale for an
  Inf block; torchao 0.18.0 differs, see ``torchao_floor``).
* ``ceil`` (torchao ``CEIL``): as ``floor`` with ``exp(A) + 1`` when ``A``'s mantissa bits are not 0.
* ``even`` (torchao ``EVEN``): ``A`` first rounded to ``mbits`` mantissa bits by adding
  ``2**(22 - mbits)`` to its bits and clearing the mantissa (E4M3 ``mbits = 3``, E2M1 ``1``), then
  ``floor``; an ``A`` that rounds to inf (fp32 ``A >= 1.9375 * 2**127`` for E4M3) gives 255.
* ``rceil`` (torchao ``RCEIL``, the cuBLAS rule): ``d = RN(A * RN(1/max))``, ``c`` = the biased
  exponent of ``d`` plus 1 when its mantissa is not 0 (an fp32 subnormal ``d``: plus 1 only above
  ``2**-127``); non-finite ``d`` -> 255.
* ``te``, MXFP8 (Transformer Engine ``common/util/ptx_arch_spec.cuh`` ``float_to_e8m0`` of
  ``amax * max_norm_rcp``, ``common/util/ptx.cuh`` ``exp2f_rcp`` and ``exp2f``; the host reference
  ``tests/cpp/test_common.h`` and ``tests/cpp/operator/test_cast_mxfp8.cu`` ``compute_ref``, which
  TE's kernels are tested against bit for bit): the block amax *skips NaN* (``std::max(amax, |x|)``
  from 0, the kernels' ``max.xorsign.abs``), so a NaN element leaves its block's scale to the other
  elements and stays NaN itself (an all-NaN block has amax 0); ``d = RN(A * RN(1/max))``; inf -> 254,
  0 -> 0; else the biased exponent of ``d``, plus 1 when the mantissa is not 0, except at exponent
  254 (saturates at 254) and for a subnormal ``d <= 2**-127``.  Step 3 is ``exp2f_rcp``: ``2**(127 -
  c)``, code 0 included (``2**127``; TE before February 2026 used 1 there), and step 6 ``exp2f``,
  ``2**-127`` for code 0 (TE since PR 3262; before it, 0).  Tiles ``32 x 32`` with ``tile_2d``
  (TE's MXFP8 2D weights, ``tests/pytorch/test_mxfp8_2d_quantize.py``).
* ``te``, MXFP4: Transformer Engine has no MXFP4 kernel (its FP4 cast refuses power-of-two scales);
  its MXFP4 rule is the pure-torch reference ``pytorch/custom_recipes/reference_nvfp4.py``
  ``NVFP4QuantizerRef(pow_2_scales=True, quant_tile_shape=(1, 32))`` (1 x 32 only, no ``tile_2d``):
  ``A = torch.amax`` (NaN-propagating), ``d = RN(A / 6)`` (division), ``c = clamp(ceil(log2 d), -127,
  127) + 127`` (``cast_to_e8``; ``log2`` correctly rounded as for ``modelopt``; ``d = 0`` -> 0, inf ->
  254), a NaN ``A`` gives a NaN scale (code 255 here); step 3 ``RN(1 / 2**(c-127))`` (code 0:
  ``2**127``); step 5 its ``cast_to_fp4x2``: nearest, ties to even, saturating, ``v = -0.0`` and
  NaN coded as ``+0`` (``round_to_e2m1_te``); step 6 ``q * 2**(c-127)``, as its GEMM applies the scale.
* ``modelopt`` (Model-Optimizer 0.47.0 ``qtensor/mxfp8_tensor.py`` ``_compute_e8m0_exponent``):
  ``d = RN(A / max)`` (IEEE division), ``c = clamp(ceil(log2 d), -127, 127) + 127`` where ``d > 0``,
  else ``c = 0`` (zero and NaN ``A``: a NaN block gets code 0, so its finite elements saturate to
  ``±max * 2**-127``).  ``log2 d`` is the correctly rounded fp32 ``log2`` (evaluated in float64 and
  rounded once to fp32, device-independent): for ``d`` a few fp32 ulps above a power of two
  ``2**e`` with ``|e| >= 5`` it rounds to ``e`` and ``ceil`` keeps ``e``.  Model-Optimizer evaluates
  ``torch.log2`` in fp32 (libm); a libm that is not correctly rounded there differs by one code.
  For MXFP4 this variant models Model-Optimizer 0.47.0 ``qtensor/mxfp4_tensor.py``
  (``MXFP4QTensor.quantize`` / ``dequantize``): the same code (its ``ceil(max(log2(A / 6), -127))``
  has no upper clamp, but a finite ``A`` gives at most 126); step 4 is its ``x / 2**e`` (the same
  fp32 value as ``x * inv``); step 5 is ``round_to_e2m1_modelopt``: the E2M1 value indexed by how
  many of the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 lie strictly below ``|v|`` (ties toward
  zero: 0.75 -> 0.5, 2.5 -> 2, 5 -> 4; ±inf -> ±6), with the sign bit set unless ``v > 0``
  (``torch.sign(+0) = 0`` writes ``+0`` as ``-0``, and an element that underflows to ``+0`` at step
  4 too); a block whose ``A`` is Inf or NaN dequantizes to ``-0`` everywhere (its exponent is
  inf/NaN, so every element is ``x / inf = ±0`` or NaN, ``torch.sign`` of which is 0: magnitude
  code 0 with the sign bit; the uint8 scale byte that the non-finite exponent converts to does not
  matter, every magnitude being 0).  Step 6: ``q * 2**(c - 127)`` in fp32, then the output cast.
* ``torchao_floor``, ``torchao_ceil``, ``torchao_even`` (torchao 0.18.0
  ``prototype/mx_formats/mx_tensor.py`` ``to_mx`` with ``ScaleCalculationMode`` FLOOR / CEIL / EVEN,
  dequantized by its ``to_dtype``)::

      1. A   = max |x| (torch.amax, NaN-propagating), fp32
         (even: A = bits(A) + 2**(22 - mbits), mantissa cleared; a NaN A is kept NaN)
      2. c   = clamp(field(A) - 127 - emax [+ 1 if ceil and A's mantissa != 0], -127, 128) + 127;
             then c = 255 where A is NaN, and only there: an Inf A (or an even-rounded A that
             carries into field 255) gives 255 - emax (E4M3 247, E2M1 253)
      3. s   = max(bits(c << 23), 2**-126)    the fp32 scale, clamped to the smallest normal:
                                              code 0 divides by 2**-126, i.e. inv = 2**126;
                                              code 255 gives s = inf (the block is NaN at step 6)
      4. v   = RN(x / s)                      = RN(x * inv), the same fp32 value
      5. q   = E4M3: RN(clamp(v, -448, 448)) cast to float8_e4m3fn; E2M1: torchao's
               ``_f32_to_floatx_unpacked`` (nearest, ties to even, saturating at ±6)
      6. y   = q * 2**(c - 127) in the output dtype (``get_fp_scale``: code 0 decodes to 2**-127, 255 to
               NaN); bf16 products on CPU are the fp32 product rounded to bf16, so this is steps 6-7
      7. out = y

  So an Inf element of an Inf block gives ``±max * 2**(128 - emax)``, which overflows to ±inf, and
  its finite elements keep their values at that scale (mostly ±0).  Code 0 means ``A < 2**(-126 +
  emax)`` (a field-0 ``A``): the elements are quantized at ``2**-126`` but decoded at ``2**-127``.
* ``torchao_rceil`` (torchao 0.18.0 ``mx_tensor.py`` ``_to_mx_rceil``, its eager fallback: CPU, and
  any GPU without ``torch.compile`` on Blackwell): ``d = RN(A / max)`` (division, unlike ``rceil``
  and ``te``'s rounded reciprocal), ``c = clamp(ceil(log2 d), -127, 127) + 127`` (``log2`` correctly
  rounded as for ``modelopt``; ``d = 0`` -> 0, inf -> 254), NaN ``A`` -> 255; step 3 uses 1 for code 0
  (and ``2**-127`` for 254); step 5 clamps to ``±max`` before the cast.  It differs from ``te`` only
  where ``RN(A / max)`` and ``RN(A * RN(1/max))`` fall on different sides of a power of two, which
  at E2M1 happens for fp32 ``A`` at the fp32 subnormal edge.

Backward: the straight-through estimator of ``reference.ste`` with no amax (``amax=None``):
``pass_through`` returns the output gradient; ``clipped`` keeps the gradient of every element that is
not NaN (each element lies within its own block's amax) and gives ``+0`` for NaN ``x``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .constants import E2M1_MAX, E4M3_MAX, E8M0_BIAS, E8M0_NAN, MX_BLOCK
from .granularity import FROM_DATA, from_tiles, to_tiles
from .result import FakeQuantResult
from .rounding import fp32_scalar_like, round_to_e2m1, round_to_e2m1_te, round_to_e4m3, to_output_dtype

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
    """The OCP rule (torchao FLOOR except Inf and code-0 blocks: ``code_torchao_floor``)."""
    e, _ = _fields(a)
    return _finish(e - E8M0_BIAS - emax, torch.isfinite(a), E8M0_BIAS + 1)


def code_ceil(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """torchao CEIL's rounding, with the OCP NaN scale for Inf blocks (torchao itself: ``code_torchao_ceil``)."""
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


def code_torchao_floor(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """torchao 0.18.0 FLOOR: ``floor`` except that only a NaN ``a`` gives 255 (inf takes field 255)."""
    e, _ = _fields(a)
    return _finish(e - E8M0_BIAS - emax, ~torch.isnan(a), E8M0_BIAS + 1)


def code_torchao_ceil(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """torchao 0.18.0 CEIL: ``ceil`` except that only a NaN ``a`` gives 255."""
    e, m = _fields(a)
    return _finish(e + (m != 0).to(torch.int32) - E8M0_BIAS - emax, ~torch.isnan(a), E8M0_BIAS + 1)


def code_torchao_even(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """torchao 0.18.0 EVEN: ``even`` except that only a NaN ``a`` gives 255 (a rounded inf takes field 255)."""
    bits = (a.view(torch.int32) + (1 << (22 - mbits))) & 0x7F800000
    r = torch.where(torch.isnan(a), a, bits.view(torch.float32))
    e, _ = _fields(r)
    return _finish(e - E8M0_BIAS - emax, ~torch.isnan(r), E8M0_BIAS + 1)


def code_torchao_rceil(a: torch.Tensor, emax: int, mbits: int, elem_max: float) -> torch.Tensor:
    """torchao 0.18.0 RCEIL eager fallback: ``modelopt``'s ``ceil(log2(a / max))`` with NaN -> 255."""
    c = code_modelopt(a, emax, mbits, elem_max)
    return torch.where(torch.isnan(a), torch.full_like(c, E8M0_NAN), c)


CODE_RULES: dict[str, Callable[..., torch.Tensor]] = {
    "floor": code_floor, "ceil": code_ceil, "even": code_even, "rceil": code_rceil, "te": code_te, "modelopt": code_modelopt,
    "torchao_floor": code_torchao_floor, "torchao_ceil": code_torchao_ceil, "torchao_even": code_torchao_even,
    "torchao_rceil": code_torchao_rceil,
}
"""Variant -> ``code(A, emax, mbits, max)``: int32 E8M0 codes of fp32 block amax ``A``."""

CODE0_INVERSE: dict[str, float] = {
    "torchao_rceil": 1.0, **{f"torchao_{m}": 2.0**126 for m in ("floor", "ceil", "even")},
}
"""Variant -> the multiplier step 3 uses for code 0 where it is not ``2**127`` (module docstring)."""


def mx_inverse(code: torch.Tensor, variant: str) -> torch.Tensor:
    """Step 3: fp32 ``inv`` of int codes for ``variant`` (``e8m0_inverse`` except ``CODE0_INVERSE``)."""
    inv = e8m0_inverse(code)
    if variant in CODE0_INVERSE:
        inv = torch.where(code == 0, torch.full((), CODE0_INVERSE[variant], device=inv.device), inv)
    return inv


_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def round_to_e2m1_modelopt(v: torch.Tensor) -> torch.Tensor:
    """Model-Optimizer 0.47.0 ``MXFP4QTensor`` ``cast_fp4``: the E2M1 value indexed by how many midpoints
    lie strictly below ``|v|`` (ties toward zero, ±inf -> ±6, NaN -> magnitude 0), negative unless
    ``v > 0`` (``torch.sign``: ``+0`` and NaN give ``-0``)."""
    mag = v.abs()
    idx = sum((mag > b).to(torch.int32) for b in _E2M1_BOUNDS)
    vals = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device=v.device)[idx]
    return torch.where(v > 0, vals, -vals)


ELEMENTS: dict[str, tuple[int, int, float, Callable[[torch.Tensor], torch.Tensor]]] = {
    "e4m3": (8, 3, E4M3_MAX, round_to_e4m3),
    "e2m1": (2, 1, E2M1_MAX, round_to_e2m1),
}
"""Element format -> (emax, mantissa bits, max, rounding)."""


def mx_tile(tile_2d: bool) -> tuple[int, int]:
    """The block: ``(1, 32)`` along in-features, or ``(32, 32)``."""
    return (MX_BLOCK, MX_BLOCK) if tile_2d else (1, MX_BLOCK)


@dataclass(frozen=True)
class MxRule:
    """One variant's steps for one element format: the E8M0 code of the block amax (``code``), whether
    the amax skips NaN elements (``skip_nan``), step 3's variant key for ``mx_inverse`` and step 5's
    element rounding."""

    code: Callable[..., torch.Tensor]
    skip_nan: bool
    inverse: str
    elem_round: Callable[[torch.Tensor], torch.Tensor]


def mx_rule(variant: str, elem: str) -> MxRule:
    """The steps of ``variant`` for element format ``elem`` (the module docstring)."""
    _, _, _, elem_round = ELEMENTS[elem]
    if variant == "te" and elem == "e2m1":  # TE's pure-torch MXFP4 reference, not its C++ MX rule
        return MxRule(code_torchao_rceil, False, "te_e2m1", round_to_e2m1_te)
    if variant == "modelopt" and elem == "e2m1":
        return MxRule(CODE_RULES[variant], False, variant, round_to_e2m1_modelopt)
    return MxRule(CODE_RULES[variant], variant == "te", variant, elem_round)


def block_amax(xt: torch.Tensor, skip_nan: bool = False) -> torch.Tensor:
    """Step 1: ``max |x|`` over the last dim of tiles ``xt`` (keepdim), NaN-propagating or NaN-skipping."""
    mag = xt.abs()
    if skip_nan:
        mag = torch.where(torch.isnan(mag), torch.zeros((), device=mag.device), mag)
    return mag.amax(dim=-1, keepdim=True)


def mx_codes(x: torch.Tensor, variant: str, elem: str, *, tile_2d: bool = False) -> torch.Tensor:
    """The E8M0 codes (int32) of ``x``'s blocks, ``[..., ceil(out/r), ceil(in/32)]``."""
    emax, mbits, emx, _ = ELEMENTS[elem]
    rule = mx_rule(variant, elem)
    a = block_amax(to_tiles(x.to(torch.float32), mx_tile(tile_2d)), rule.skip_nan).squeeze(-1)
    return rule.code(a, emax, mbits, emx)


def _check_amax(amax: object, name: str) -> None:
    if amax is not None:
        raise TypeError(f"{name} takes no amax (granularity {FROM_DATA}: its scales come from the data); pass amax=None")


def mx_fake_quant(x: torch.Tensor, amax: None, *, variant: str, elem: str, tile_2d: bool = False) -> FakeQuantResult:
    """Steps 1-7 of the module docstring for ``variant`` and element format ``elem``."""
    _check_amax(amax, f"mx{'fp8' if elem == 'e4m3' else 'fp4'}")
    tile = mx_tile(tile_2d)
    rule = mx_rule(variant, elem)
    xt = to_tiles(x.to(torch.float32), tile)
    emax, mbits, emx, _ = ELEMENTS[elem]
    a = block_amax(xt, rule.skip_nan)
    code = rule.code(a, emax, mbits, emx)
    v = xt * mx_inverse(code, rule.inverse)
    if variant == "modelopt" and elem == "e2m1":
        v = torch.where(torch.isfinite(a), v, torch.full((), float("nan"), device=v.device))
    y = rule.elem_round(v) * e8m0_decode(code)
    shape = tuple(x.shape)
    return FakeQuantResult(to_output_dtype(from_tiles(y, tile, shape), x.dtype), from_tiles(v, tile, shape), rule.elem_round)


def _variant(variant: str, elem: str):
    def fn(x, amax, *, tile_2d: bool = False) -> FakeQuantResult:
        return mx_fake_quant(x, amax, variant=variant, elem=elem, tile_2d=tile_2d)

    fn.__name__ = fn.__qualname__ = f"mx_{elem}_{variant}"
    fn.__doc__ = f"MX {elem} elements, E8M0 scale rule {variant!r} (see the module docstring)."
    return fn


VARIANTS_1D_ONLY = {"e2m1": frozenset({"te"})}
"""Element format -> the variants whose upstream has no square tiles (TE's MXFP4 reference: 1 x 32 only)."""

MXFP8_VARIANTS = {v: _variant(v, "e4m3") for v in CODE_RULES}
MXFP4_VARIANTS = {v: _variant(v, "e2m1") for v in CODE_RULES}
DEFAULT_VARIANT = "floor"
